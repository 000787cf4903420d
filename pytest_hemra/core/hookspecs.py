"""Hooks third-party plugins implement to extend HEMRA (registered on pytest's plugin manager,
or on the `hemra` command's own manager: see `core/registry.py`).

pytest only takes hook implementations whose names start with `pytest_`, so ours do too.
"""

from __future__ import annotations

from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("pytest")


@hookspec
def pytest_hemra_sandbox_providers() -> dict[str, Any]:
    """Return {name: factory} of sandbox providers; a factory returns a SandboxProvider."""
    raise NotImplementedError


@hookspec
def pytest_hemra_harness_kinds() -> dict[str, Any]:
    """Return {name: kind} of harness kinds; a kind follows `execute.kinds.HarnessKind`."""
    raise NotImplementedError
