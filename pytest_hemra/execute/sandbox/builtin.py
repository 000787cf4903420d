"""HEMRA's own sandbox provider, registered as a plug-in like any other (`core/registry.py`)."""

from __future__ import annotations

from typing import Any

import pluggy

hookimpl = pluggy.HookimplMarker("pytest")


def _docker() -> Any:
    from pytest_hemra.execute.sandbox.docker import DockerProvider  # the docker SDK, on demand

    return DockerProvider()


@hookimpl
def pytest_hemra_sandbox_providers() -> dict[str, Any]:
    return {"docker": _docker}
