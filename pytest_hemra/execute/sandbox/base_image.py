"""The offline base image: debootstrap a Debian minbase and `docker import` it.

For machines that reach Debian's packages but no container registry. The mirror is read from
apt's own configuration, never written into code. Tagged `debian:bookworm-slim` by default, so
ordinary Harbor-style Dockerfiles (`FROM debian:bookworm-slim`) build with no pull.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import docker.errors

from pytest_hemra.core.errors import HemraError, InfraError
from pytest_hemra.execute.sandbox.client import connect

DEFAULT_TAG = "debian:bookworm-slim"
DEFAULT_SUITE = "bookworm"
APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))


def apt_mirror(suite: str = DEFAULT_SUITE, sources: tuple[Path, ...] = APT_SOURCES) -> str:
    """The first Debian mirror apt is configured with for `suite` (one-line or deb822 format)."""
    for location in sources:
        files = (
            sorted(location.glob("*.list")) + sorted(location.glob("*.sources"))
            if location.is_dir()
            else [location]
        )
        for file in files:
            if not file.is_file():
                continue
            text = file.read_text(errors="replace")
            found = (
                _deb822_mirror(text, suite)
                if file.suffix == ".sources"
                else _one_line_mirror(text, suite)
            )
            if found:
                return found
    raise HemraError(
        f"apt has no mirror configured for suite {suite!r} (looked in "
        f"{', '.join(str(s) for s in sources)})"
    )


def _one_line_mirror(text: str, suite: str) -> str | None:
    for line in text.splitlines():
        words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
        if len(words) >= 3 and words[0] == "deb" and words[2] == suite:
            return words[1]
    return None


def _deb822_mirror(text: str, suite: str) -> str | None:
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if ":" in line and not line.startswith(("#", " ")):
                key, value = line.split(":", 1)
                fields[key.strip().lower()] = value.strip()
        if "deb" in fields.get("types", "").split() and suite in fields.get("suites", "").split():
            uris = fields.get("uris", "").split()
            if uris:
                return uris[0]
    return None


def has_image(tag: str = DEFAULT_TAG) -> bool:
    try:
        connect().images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def bootstrap_base_image(
    tag: str = DEFAULT_TAG,
    suite: str = DEFAULT_SUITE,
    mirror: str | None = None,
    packages: Sequence[str] = (),
) -> str:
    """Build the base image with debootstrap (needs root and the debootstrap package);
    `packages` are installed into it as well (debootstrap --include)."""
    if shutil.which("debootstrap") is None:
        raise HemraError("debootstrap is not installed (on Debian: apt-get install debootstrap)")
    mirror = mirror or apt_mirror(suite)
    client = connect()
    include = [f"--include={','.join(packages)}"] if packages else []
    with tempfile.TemporaryDirectory(prefix="hemra-rootfs-") as scratch:
        root = Path(scratch) / "rootfs"
        subprocess.run(
            ["debootstrap", "--variant=minbase", *include, suite, str(root), mirror],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for path in (root / leftover).glob("*"):
                if path.is_file():
                    path.unlink()
        archive = Path(scratch) / "rootfs.tar"
        subprocess.run(["tar", "-C", str(root), "-cf", str(archive), "."], check=True)
        repository, _, version = tag.partition(":")
        try:
            client.api.import_image_from_file(
                str(archive),
                repository=repository,
                tag=version or "latest",
                changes=['CMD ["bash"]'],
            )
        except docker.errors.APIError as error:
            raise InfraError(f"docker import of {tag} failed ({error})") from error
    return tag
