"""HEMRA's own harness kinds, registered as a plug-in like any other (`core/registry.py`)."""

from __future__ import annotations

from typing import Any

import pluggy

hookimpl = pluggy.HookimplMarker("pytest")


@hookimpl
def pytest_hemra_harness_kinds() -> dict[str, Any]:
    from pytest_hemra.execute.kinds.acp import AcpKind
    from pytest_hemra.execute.kinds.cli import CliKind
    from pytest_hemra.execute.kinds.harbor import HarborKind
    from pytest_hemra.execute.kinds.program import ProgramKind
    from pytest_hemra.execute.kinds.sdk import SdkKind

    return {
        "program": ProgramKind(),
        "cli": CliKind(),
        "sdk": SdkKind(),
        "acp": AcpKind(),
        "harbor": HarborKind(),
    }
