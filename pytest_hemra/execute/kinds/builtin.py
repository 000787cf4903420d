"""HEMRA's own harness kinds, registered as a plug-in like any other (`core/registry.py`)."""

from __future__ import annotations

from typing import Any

import pluggy

hookimpl = pluggy.HookimplMarker("pytest")


@hookimpl
def pytest_hemra_harness_kinds() -> dict[str, Any]:
    return {}  # filled in as each kind moves behind the HarnessKind protocol
