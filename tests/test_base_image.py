"""`hemra image bootstrap` builds a working Debian image from apt's mirror, with no registry."""

from __future__ import annotations

import contextlib
import secrets
import shutil
from typing import Any

import docker.errors
import pytest


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
def test_bootstrap_builds_an_image_that_runs(pytester: pytest.Pytester, docker_client: Any) -> None:
    if shutil.which("debootstrap") is None:
        pytest.fail("debootstrap is not installed (.ci/run installs it)")
    tag = f"hemra-test/base:{secrets.token_hex(4)}"
    try:
        result = pytester.run("hemra", "image", "bootstrap", "--tag", tag, timeout=600)
        assert result.ret == 0, result.errlines
        output = docker_client.containers.run(
            tag, ["cat", "/etc/debian_version"], remove=True, network_mode="none"
        )
        assert output.decode().startswith("12.")
        again = pytester.run("hemra", "image", "bootstrap", "--tag", tag, "--if-missing")
        assert "already on this docker engine" in again.stdout.str()
    finally:
        with contextlib.suppress(docker.errors.ImageNotFound):
            docker_client.images.remove(tag, force=True)
