"""What an engine's storage allows this runner, asked once per engine: whether its overlay2
driver diffs natively (a container's upper folder then holds exactly what it changed, read here
by `overlay.py`), and whether files written into a stopped container's storage keep their owners
(not under userns-remap)."""

from __future__ import annotations

import docker

from pytest_hemra.execute.sandbox.client import DOCKER_ERRORS

_NATIVE_DIFF: dict[str, bool] = {}  # engine address -> whether overlay2 diffs natively
_REMAPPED: dict[str, bool] = {}  # engine address -> whether it remaps users (userns-remap)


def has_native_diff(client: docker.DockerClient) -> bool:
    """Whether the engine's overlay2 driver uses its native diff (no redirected folders): its
    upper folders then hold exactly what a container changed. Asked once per engine."""
    address = str(client.api.base_url)
    if address not in _NATIVE_DIFF:
        try:
            info = client.info()
        except DOCKER_ERRORS:
            return False
        status = dict(info.get("DriverStatus") or [])
        _NATIVE_DIFF[address] = status.get("Native Overlay Diff") == "true"
        # user namespaces remap owners: a file written in its storage as root is not root's there
        _REMAPPED[address] = any("userns" in str(o) for o in info.get("SecurityOptions") or [])
    return _NATIVE_DIFF[address]


def writes_storage(client: docker.DockerClient) -> bool:
    """Whether files written into a stopped container's storage here are owned as written."""
    return has_native_diff(client) and not _REMAPPED.get(str(client.api.base_url), True)
