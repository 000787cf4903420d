"""Harness installs: each harness version installed once on the host, then mounted into sandboxes.

A harness file's `package` (`npm:@scope/name@1.2.3` or `pypi:name==1.2.3`) is installed into a
content-addressed cache, `$HEMRA_CACHE_DIR/harnesses/<name>-<digest>`, keyed by the harness
file's digest: a changed harness file is a new install, an unchanged one is never installed
again. Sandboxes get it read-only at the same path, with the runtime it needs (the host's Node
binary, or the host's Python installation for a virtualenv) mounted beside it, so task images
need neither Node nor network. Installs take a file lock, so parallel workers install once.
What a harness installs is its kind's to say (`execute/kinds/`); most kinds install their
`package` here (`ensure_package`).

npm packages get the host's `node`. PyPI packages are installed with `pip install --target`
and run by the host's own Python installation mounted at /opt/hemra/python (a virtualenv is
not relocatable, and a pyenv-built Python finds libpython through a runpath under /root, which
the non-root sandbox user cannot traverse: the launchers set LD_LIBRARY_PATH instead).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pytest_hemra.core import registry
from pytest_hemra.core.cache import cache_root, user_home
from pytest_hemra.core.environment import snapshot
from pytest_hemra.core.errors import InfraError
from pytest_hemra.core.filelock import file_lock
from pytest_hemra.core.progress import Progress
from pytest_hemra.execute.sandbox import Mount
from pytest_hemra.resolve.harnesses import Harness

MARKER = ".hemra-installed"
HARNESS_DIR = "/opt/hemra/harness"
NODE_DIR = "/opt/hemra/node/bin"
PYTHON_DIR = "/opt/hemra/python"
GLIBC = frozenset(
    {"libc", "libm", "libpthread", "libdl", "librt", "libutil", "libresolv", "ld-linux-x86-64"}
)
INSTALL_TIMEOUT_SECS = 900
# how long an install waits for another process's install of the same package (each of
# whose commands has INSTALL_TIMEOUT_SECS; Harbor's runner image, its download and build)
INSTALL_LOCK_SECS = 2 * INSTALL_TIMEOUT_SECS
LOCK_POLL_SECS = 0.2
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Installed:
    """An installed harness: where it is, what to mount, and the PATH that finds its commands."""

    directory: Path
    mounts: tuple[Mount, ...]
    path: str


def install_dir(harness: Harness) -> Path:
    return cache_root() / "harnesses" / f"{harness.name}-{harness.digest[:16]}"


def is_installed(harness: Harness) -> bool:
    """Whether the harness's kind has installed it already (`hemra harnesses install`)."""
    return bool(registry.harness_kinds()[harness.spec.kind].is_installed(harness))


def ensure_installed(harness: Harness) -> Installed | None:
    """Install the harness as its kind does (once; a no-op when cached); None: nothing to mount."""
    installed: Installed | None = registry.harness_kinds()[harness.spec.kind].install(harness)
    return installed


def is_package_installed(harness: Harness) -> bool:
    return (install_dir(harness) / MARKER).is_file()


def ensure_package(harness: Harness) -> Installed | None:
    """Install the harness's package once (no-op when cached); None when it has no package."""
    package = harness.spec.package
    if package is None:
        return None
    kind, _, spec = package.partition(":")
    directory = install_dir(harness)
    directory.parent.mkdir(parents=True, exist_ok=True)
    with locked(directory.with_suffix(".lock"), package):
        if not (directory / MARKER).is_file():
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
            try:
                with Progress(f"installing harness {harness.name} ({package})") as progress:
                    _install(kind, spec, directory, progress)
            except (OSError, subprocess.SubprocessError) as error:
                shutil.rmtree(directory, ignore_errors=True)
                raise InfraError(f"{harness.path}: installing {package} failed ({error})") from None
            (directory / MARKER).write_text(package + "\n")
    directory.chmod(0o755)
    return _installed(kind, directory)


def _install(kind: str, spec: str, directory: Path, progress: Progress) -> None:
    progress.update(0, f"{'npm' if kind == 'npm' else 'pip'} install {spec}")
    if kind == "npm":
        argv = ["npm", "install", "--prefix", str(directory), "--no-audit", "--no-fund"]
        _run([*argv, "--omit=dev", "--loglevel=error", spec])
        return
    site = directory / "site"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-warn-script-location",
            "--target",
            str(site),
            spec,
        ]
    )
    _write_launchers(site, directory / "bin")
    _bundle_libraries([Path(sys.base_prefix), site], directory / "lib", progress)


def _bundle_libraries(roots: list[Path], target: Path, progress: Progress) -> None:
    """Copy the system libraries the interpreter's and packages' extensions load (libssl,
    libffi...) beside the install: task images need not have them. glibc's own stay out."""
    target.mkdir(exist_ok=True)
    needed: set[str] = set()
    extensions = [e for root in roots for e in root.rglob("*.so*") if e.is_file()]
    for count, extension in enumerate(extensions, 1):
        progress.update(0, f"libraries the extensions load: {count} of {len(extensions)} read")
        listing = subprocess.run(["ldd", str(extension)], capture_output=True, text=True)
        for line in listing.stdout.splitlines():
            parts = line.split("=>")
            if len(parts) == 2 and parts[1].strip().startswith("/"):
                needed.add(parts[1].split("(")[0].strip())
    for library in sorted(needed):
        source = Path(library)
        inside = any(str(source).startswith(str(root)) for root in roots)  # mounted already
        if source.name.split(".so")[0] in GLIBC or inside:
            continue
        shutil.copy2(source, target / source.name)


def _write_launchers(site: Path, bin_dir: Path) -> None:
    """A launcher per console script, for the host's Python mounted at PYTHON_DIR.

    The scripts' own shebangs name the host's interpreter path; the launcher runs them with
    the mounted one instead, finds libpython through LD_LIBRARY_PATH and drops it again, and
    puts the harness's packages on sys.path only: the commands the agent runs (the task's own
    python3 among them) see neither.
    """
    bin_dir.mkdir(exist_ok=True)
    for script in sorted((site / "bin").glob("*")):
        if not script.is_file() or not script.read_bytes().startswith(b"#!"):
            continue
        target = f"{HARNESS_DIR}/site/bin/{script.name}"
        boot = (
            "import os, runpy, sys; os.environ.pop('LD_LIBRARY_PATH', None); "
            f"sys.path.insert(0, '{HARNESS_DIR}/site'); sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')"
        )
        launcher = bin_dir / script.name
        launcher.write_text(
            "#!/bin/sh\n"
            f"LD_LIBRARY_PATH={PYTHON_DIR}/lib:{HARNESS_DIR}/lib "
            f'exec {PYTHON_DIR}/bin/python3 -c "{boot}" '
            f'{target} "$@"\n'
        )
        launcher.chmod(0o755)


def _run(argv: list[str]) -> None:
    env = {**snapshot(), "HOME": str(user_home())}  # npm's own config, CA settings and cache
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_SECS, env=env
    )
    if done.returncode != 0:
        tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise subprocess.SubprocessError(f"{argv[0]} exited {done.returncode}: {tail}")


def _installed(kind: str, directory: Path) -> Installed:
    if kind == "pypi":
        mounts = (Mount(directory, HARNESS_DIR), Mount(Path(sys.base_prefix), PYTHON_DIR))
        return Installed(directory, mounts, f"{HARNESS_DIR}/bin:{SYSTEM_PATH}")
    node = shutil.which("node")
    if node is None:
        raise InfraError("node is not installed on the host (npm harnesses need it)")
    mounts = (Mount(directory, HARNESS_DIR), Mount(Path(node).resolve(), f"{NODE_DIR}/node"))
    return Installed(directory, mounts, f"{HARNESS_DIR}/node_modules/.bin:{NODE_DIR}:{SYSTEM_PATH}")


@contextmanager
def locked(path: Path, what: str, timeout: float = INSTALL_LOCK_SECS) -> Iterator[None]:
    """An exclusive file lock, held across processes (one install at a time), waited for up
    to `timeout` seconds; `what` is installed under it (for the error when it is not had)."""
    waited = f"{path}: waited {timeout:g}s for another process installing {what}"
    with file_lock(path, timeout, waited, poll=LOCK_POLL_SECS):
        yield
