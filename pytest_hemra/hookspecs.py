"""Hooks third-party plugins implement to extend HEMRA (registered on pytest's plugin manager)."""

from __future__ import annotations

from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("pytest")


@hookspec
def hemra_sandbox_providers() -> dict[str, Any]:
    """Return {name: factory} of sandbox providers; a factory returns a SandboxProvider."""
    raise NotImplementedError
