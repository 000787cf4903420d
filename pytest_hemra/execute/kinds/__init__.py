"""Harness kinds: how a harness file's `kind` installs, runs and is observed, one module each.

A kind is any object with the `HarnessKind` members, registered under its name through the
`pytest_hemra_harness_kinds` hook (`core/registry.py`); HEMRA's own five (program, cli, sdk,
acp, harbor) are registered the same way, by `builtin.py`. Most kinds run an agent in HEMRA's
sandbox and start from `SandboxKind`, overriding what differs. A kind that runs whole trials
by itself, outside HEMRA's sandboxes (Harbor), answers `run_trial` instead.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, cast

from pytest_hemra.core import registry
from pytest_hemra.core.errors import SpecError
from pytest_hemra.core.records import TrialRecord
from pytest_hemra.core.trial import TrialResult
from pytest_hemra.execute.context import TrialContext
from pytest_hemra.execute.installs import Installed, ensure_package, is_package_installed
from pytest_hemra.execute.sandbox import (
    AGENT_USER,
    WORKDIR,
    ExecResult,
    Sandbox,
    SandboxProvider,
)
from pytest_hemra.resolve.harnesses import Harness
from pytest_hemra.resolve.plan import RecordedRun
from pytest_hemra.resolve.spec import HarnessSpec, RunSpec
from pytest_hemra.resolve.taskconfig import McpServer
from pytest_hemra.store import Store


@dataclass(frozen=True)
class AgentTurn:
    """One agent turn in a sandbox, as HEMRA hands it to the harness's kind."""

    harness: Harness
    sandbox: Sandbox
    argv: list[str]  # the harness's `command`, placeholders filled
    values: Mapping[str, str]  # every placeholder's value (`instruction`, `base_url`...)
    env: Mapping[str, str]  # the agent's environment (PATH, HOME, HEMRA_*, the harness's)
    instruction: str
    deadline: float  # wall-clock time the turn must end by
    stdout: Path  # the trial's agent/stdout.txt and stderr.txt
    stderr: Path
    workdir: str = WORKDIR  # where its command runs: the task's workdir
    user: str = AGENT_USER  # whose user it runs as ("uid:gid"): see execute/identity.py
    mcp_servers: tuple[McpServer, ...] = ()  # the task's, for kinds that hand them over (ACP)


class HarnessKind(Protocol):
    """What HEMRA asks of a harness kind, from resolve to the agent's exit."""

    calls_models: bool  # its agent talks to a model through the gateway: usage and transcript
    is_metered: bool  # any model calls it makes are counted at the gateway (False: flagged)
    # its agent runs in HEMRA's hardened sandbox (False: only in a run that trusts the harness
    # by name, `trust_unisolated`, and flagged in reports)
    is_isolated: bool

    def validate(self, path: Path, spec: HarnessSpec) -> None:
        """Refuse a harness file this kind cannot run: a one-line SpecError naming the key."""
        ...

    def check_run(
        self, harness: Harness, run: RunSpec, source: str, provider: SandboxProvider
    ) -> None:
        """Refuse a run this kind's harness cannot take part in (its sandbox settings, what its
        sandbox `provider` can do)."""
        ...

    def install(self, harness: Harness) -> Installed | None:
        """Install what the harness needs, once (at resolve, then a no-op for each trial)."""
        ...

    def is_installed(self, harness: Harness) -> bool: ...

    def run_agent(self, turn: AgentTurn) -> ExecResult:
        """Run the agent's turn in the sandbox to its exit, never past the deadline."""
        ...

    def run_trial(
        self, context: TrialContext, run: RecordedRun, store: Store, trial: TrialRecord
    ) -> TrialResult | None:
        """Run a whole claimed trial outside HEMRA's sandboxes (Harbor's jobs) to its result;
        None: HEMRA runs it in its own sandbox, with `run_agent`."""
        ...


class SandboxKind:
    """A kind whose agent is a command HEMRA runs in its sandbox: the defaults kinds start from."""

    calls_models = True
    is_metered = True
    is_isolated = True
    needs_command = True  # the harness file's `command` is what runs

    def validate(self, path: Path, spec: HarnessSpec) -> None:
        if spec.agent is not None:
            raise SpecError(
                f"{path}: key 'agent' applies only to a harbor harness (kind = \"harbor\")"
            )
        if self.needs_command and not spec.command:
            raise SpecError(f"{path}: key 'command' is required for a {spec.kind} harness")

    def check_run(
        self, harness: Harness, run: RunSpec, source: str, provider: SandboxProvider
    ) -> None:
        return None

    def install(self, harness: Harness) -> Installed | None:
        return ensure_package(harness)

    def is_installed(self, harness: Harness) -> bool:
        return is_package_installed(harness)

    def run_agent(self, turn: AgentTurn) -> ExecResult:
        return turn.sandbox.exec(
            turn.argv,
            user=turn.user,
            env=turn.env,
            timeout=max(turn.deadline - time.time(), 1.0),
            stdout=turn.stdout,
            stderr=turn.stderr,
            workdir=turn.workdir,
        )

    def run_trial(
        self, context: TrialContext, run: RecordedRun, store: Store, trial: TrialRecord
    ) -> TrialResult | None:
        return None


def kind_of(harness: Harness) -> HarnessKind:
    """The harness's kind, from the registry (resolve refused any kind it does not hold)."""
    return cast(HarnessKind, registry.harness_kinds()[harness.spec.kind])
