"""A harness kind of your own: `writer` writes the harness file's description to the task's
answer file, in the sandbox, with no command and no model. Registered through the
`pytest_hemra_harness_kinds` hook; see docs/harnesses.md, "Adding a harness kind"."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from pytest_hemra.core.errors import SpecError
from pytest_hemra.execute.kinds import AgentTurn, SandboxKind
from pytest_hemra.execute.sandbox import AGENT_USER, ExecResult
from pytest_hemra.resolve.spec import HarnessSpec


class Writer(SandboxKind):
    calls_models = False
    needs_command = False

    def validate(self, path: Path, spec: HarnessSpec) -> None:
        super().validate(path, spec)
        if not spec.description:
            raise SpecError(f"{path}: key 'description' says what a writer harness writes")

    def run_agent(self, turn: AgentTurn) -> ExecResult:
        text = turn.harness.spec.description
        return turn.sandbox.exec(
            ["sh", "-c", 'printf "%s\\n" "$1" > /app/greeting.txt', "writer", text],
            user=AGENT_USER,
            env=turn.env,
            timeout=max(turn.deadline - time.time(), 1.0),
            stdout=turn.stdout,
            stderr=turn.stderr,
        )


@pytest.hookimpl
def pytest_hemra_harness_kinds() -> dict[str, Any]:
    return {"writer": Writer()}
