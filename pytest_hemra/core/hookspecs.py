"""Hooks third-party plugins implement to extend HEMRA (registered on pytest's plugin manager).

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
