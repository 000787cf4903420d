"""Harness installs: each harness version installed once on the host, then mounted into sandboxes.

A harness file's `package` (`npm:@scope/name@1.2.3` or `pypi:name==1.2.3`) is installed into a
content-addressed cache, `$HEMRA_CACHE_DIR/harnesses/<name>-<digest>`, keyed by the harness
file's digest: a changed harness file is a new install, an unchanged one is never installed
again. Sandboxes get it read-only at the same path, with the runtime it needs (the host's Node
binary, or the host's Python installation for a virtualenv) mounted beside it, so task images
need neither Node nor network. Installs take a file lock, so parallel workers install once.

Only npm packages are supported yet: a virtualenv is not relocatable, and a pyenv-built
Python finds its shared library through an rpath under /root, which the sandbox's non-root
user cannot traverse (the way forward: `pip install --target` run by a Python mounted at a
neutral path with LD_LIBRARY_PATH set).
"""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pytest_hemra.errors import InfraError
from pytest_hemra.harnesses import Harness
from pytest_hemra.sandbox import Mount

MARKER = ".hemra-installed"
HARNESS_DIR = "/opt/hemra/harness"
NODE_DIR = "/opt/hemra/node/bin"
INSTALL_TIMEOUT_SECS = 900
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Installed:
    """An installed harness: where it is, what to mount, and the PATH that finds its commands."""

    directory: Path
    mounts: tuple[Mount, ...]
    path: str


def user_home() -> Path:
    """The account's home, even where HOME was changed (pytester, tox): one cache a user."""
    return Path(pwd.getpwuid(os.getuid()).pw_dir)


def cache_root() -> Path:
    configured = os.environ.get("HEMRA_CACHE_DIR")
    return Path(configured) if configured else user_home() / ".cache" / "hemra"


def install_dir(harness: Harness) -> Path:
    return cache_root() / "harnesses" / f"{harness.name}-{harness.digest[:16]}"


def is_installed(harness: Harness) -> bool:
    return (install_dir(harness) / MARKER).is_file()


def ensure_installed(harness: Harness) -> Installed | None:
    """Install the harness's package once (no-op when cached); None when it has no package."""
    package = harness.spec.package
    if package is None:
        return None
    kind, _, spec = package.partition(":")
    if kind != "npm":
        raise InfraError(f"{harness.path}: key 'package': {kind} packages are not supported yet")
    directory = install_dir(harness)
    directory.parent.mkdir(parents=True, exist_ok=True)
    with _locked(directory.with_suffix(".lock")):
        if not (directory / MARKER).is_file():
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
            try:
                _install(kind, spec, directory)
            except (OSError, subprocess.SubprocessError) as error:
                shutil.rmtree(directory, ignore_errors=True)
                raise InfraError(f"{harness.path}: installing {package} failed ({error})") from None
            (directory / MARKER).write_text(package + "\n")
    directory.chmod(0o755)
    return _installed(kind, directory)


def _install(kind: str, spec: str, directory: Path) -> None:
    argv = ["npm", "install", "--prefix", str(directory), "--no-audit", "--no-fund"]
    _run([*argv, "--omit=dev", "--loglevel=error", spec])


def _run(argv: list[str]) -> None:
    env = {**os.environ, "HOME": str(user_home())}  # npm's own config, CA settings and cache
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_SECS, env=env
    )
    if done.returncode != 0:
        tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise subprocess.SubprocessError(f"{argv[0]} exited {done.returncode}: {tail}")


def _installed(kind: str, directory: Path) -> Installed:
    node = shutil.which("node")
    if node is None:
        raise InfraError("node is not installed on the host (npm harnesses need it)")
    mounts = (Mount(directory, HARNESS_DIR), Mount(Path(node).resolve(), f"{NODE_DIR}/node"))
    return Installed(directory, mounts, f"{HARNESS_DIR}/node_modules/.bin:{NODE_DIR}:{SYSTEM_PATH}")


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
