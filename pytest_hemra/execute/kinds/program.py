"""The `program` harness kind: a command run in the sandbox that calls no model (nop, oracle)."""

from __future__ import annotations

from pytest_hemra.execute.kinds import SandboxKind


class ProgramKind(SandboxKind):
    """`command` runs as the sandbox user in /app, within the deadline; no model is expected."""

    calls_models = False
