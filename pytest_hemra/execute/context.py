"""A trial's context (what it runs with) and its result, shared by every harness kind, the
scorer and the runner: the types one trial's course passes between phases."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_hemra.core.outcome import Cause, SweClass
from pytest_hemra.core.trial import Judgment, SelfReport, StepResult, TrialUsage
from pytest_hemra.execute.sandbox import WORKDIR, SandboxPool, SandboxProvider
from pytest_hemra.resolve.datasets import Task
from pytest_hemra.resolve.harnesses import Harness
from pytest_hemra.resolve.judges import Judge
from pytest_hemra.resolve.processes import keeps_agent_processes
from pytest_hemra.resolve.spec import RunSpec
from pytest_hemra.resolve.templates import render_sandbox_env

if TYPE_CHECKING:  # a trial's gateway and budgets: aiohttp and the prices, loaded where they run
    from pytest_hemra.execute.gateway.ledger import Budgets
    from pytest_hemra.execute.gateway.server import Gateway

DEFAULT_TIMEOUT_SECS = 900.0


@dataclass(frozen=True)
class TrialContext:
    run_id: str
    trial_id: str
    task: Task
    harness: Harness
    spec: RunSpec
    provider: SandboxProvider
    trial_dir: Path
    gateway: Gateway | None = None
    gateway_host: str = "127.0.0.1"
    budget: Budgets | None = None  # the run's budget_usd and its cell's cell_budget_usd
    judges: tuple[Judge, ...] = ()
    pool: SandboxPool | None = None  # [[sandbox.engines]]: the trial is placed on one first

    step_timeout: float | None = None  # a multi-step task's step: its own [steps.agent]
    dataset: str = ""  # the trial's dataset, by name
    # set when the trial is stopped (`hemra cancel`, Ctrl-C): a sandbox that came up after its
    # runner removed the trial's sandboxes is removed by the trial itself (`run/trial.py`)
    stopped: threading.Event = field(default_factory=threading.Event, compare=False)

    @property
    def keeps_processes(self) -> bool:
        """Whether the agent's processes outlive its turn into the verifier's (`processes.py`)."""
        return keeps_agent_processes(self.spec, self.dataset, self.task)

    @property
    def agent_timeout(self) -> float:
        """The run's `timeout_secs`, else the step's or task's, else the run's `[sandbox]`
        default; never over its ceiling (resolve refuses a task above it; a run recorded
        before ceilings existed is held to it here)."""
        sandbox = self.spec.sandbox
        timeout = (
            self.spec.timeout_secs
            or self.step_timeout
            or self.task.config.agent.timeout_sec
            or sandbox.agent_timeout_sec
        )
        return min(timeout, sandbox.max_agent_timeout_sec)

    @property
    def reward_keys(self) -> tuple[str, ...]:
        """The reward keys named as the headline, the run file's before the task's
        (`core.reward.headline_key`)."""
        named = (self.spec.report.reward_key, self.task.config.hemra.reward_key)
        return tuple(key for key in named if key is not None)

    @property
    def workdir(self) -> str:
        """Where the agent's and the verifier's commands run and what the diff covers: the
        task's `[environment] workdir`, else /app."""
        return self.task.config.environment.workdir or WORKDIR

    @property
    def direct_hosts(self) -> list[str]:
        """What an allowlist phase reaches without the egress proxy: the gateway, and a
        multi-container task's services (the trial's own network)."""
        compose = self.task.compose
        return [self.gateway_host, *(sorted(compose.services) if compose else [])]

    def task_env(self) -> dict[str, str]:
        """The task's `[environment] env` (its templates filled as `render`s): what the agent,
        the verifier and the healthcheck all see; with a compose file's `main` environment
        under it."""
        compose = self.task.compose
        env = {**(compose.main.environment if compose else {}), **self.task.config.environment.env}
        return self.render(env)

    def render(self, env: dict[str, str]) -> dict[str, str]:
        """A task's env table with its templates filled from the runner's variables the run
        passes by name (`[sandbox] pass_env`), never from any other (resolve/templates.py)."""
        return render_sandbox_env(env, self.spec.sandbox.pass_env)


@dataclass
class Progress:
    phases: dict[str, float] = field(default_factory=dict)
    exit_code: int | None = None
    timed_out: bool = False
    usage: TrialUsage = field(default_factory=TrialUsage)
    own_report: SelfReport | None = None
    swe_class: SweClass | None = None  # the SWE track's class of the result
    cause: Cause | None = None  # why it ended so, beside its outcome (not the verdict)
    pass_threshold: float | None = None  # the open track's, else the global one
    steps: list[StepResult] = field(default_factory=list)  # a multi-step task's
    judgments: list[Judgment] = field(default_factory=list)  # the open track's rubric judge
    engine: str | None = None  # where a pool placed the trial
    agent_logs: bool = True  # whether /logs/agent may hold something (`empty_room` looked)
    # ports the agent's processes listened on when the clean room killed them (the trial's
    # reason says so when it then fails: its tests may need them, `resolve/processes.py`)
    killed_listeners: tuple[int, ...] = ()
    agent_user: str | None = None  # whose user the agent ran as ("0:0 (root, image)")

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.phases[name] = round(time.monotonic() - started, 4)
