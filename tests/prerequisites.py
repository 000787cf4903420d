"""What the test suite needs from the machine, checked before it starts (`tox` runs this first
for the suite; the quick check, `tox -e example`, needs none of it but Docker).

The suite runs real Docker sandboxes, the real harness CLIs (installed from npm on the host),
opens the HTML report and the viewer in Debian's chromium, and starts a throwaway PostgreSQL
server (Debian's postgresql) for the shared store. Rather than fail ten minutes in,
this names everything missing in one line, with how to get it, and exits 1. `.ci/run` installs
all of it on a Debian machine.
"""

from __future__ import annotations

import glob
import shutil
import subprocess
import sys

BASE_IMAGE = "debian:bookworm-slim"


def _docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    probe = subprocess.run(["docker", "info"], capture_output=True, timeout=30)
    return probe.returncode == 0


def _has_base_image() -> bool:
    probe = subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True)
    return probe.returncode == 0


def missing() -> list[str]:
    """Each missing prerequisite as `what (how to get it)`."""
    found: list[str] = []
    if not _docker_answers():
        found.append("a running Docker engine (apt-get install docker.io; then start dockerd)")
    elif not _has_base_image() and shutil.which("debootstrap") is None:
        found.append(f"debootstrap, to build {BASE_IMAGE} (apt-get install debootstrap)")
    for command, package in (("node", "nodejs"), ("npm", "npm"), ("chromium", "chromium")):
        if shutil.which(command) is None:
            found.append(f"{command} (apt-get install {package})")
    if not glob.glob("/usr/lib/postgresql/*/bin/initdb") and shutil.which("initdb") is None:
        found.append("PostgreSQL's initdb, for the shared store (apt-get install postgresql)")
    return found


def main() -> int:
    absent = missing()
    if absent:
        print(
            "hemra tests: missing prerequisites: "
            + "; ".join(absent)
            + ". `.ci/run` installs them all on Debian.",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
