"""What the store holds, as plain frozen objects: planned trials, runs, trials, calls."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_hemra.core.lifecycle import JobState, TrialStatus
from pytest_hemra.core.outcome import Outcome
from pytest_hemra.core.stored import StoredPlan
from pytest_hemra.core.usage import TOKEN_FIELDS, Usage

DEFAULT_STORE = Path(".hemra") / "hemra.db"  # in the current folder (core/store_location.py)


@dataclass(frozen=True)
class PlannedTrial:
    """One attempt of one harness on one task, as planned before anything runs."""

    dataset: str
    task: str
    harness: str
    attempt: int
    model: str | None = None  # a matrix run's cell model (None: the run's one model)

    @property
    def cell(self) -> str:
        """The harness, or in a matrix run the `harness@model` pair."""
        return self.harness if self.model is None else f"{self.harness}@{self.model}"

    @property
    def item_id(self) -> str:
        return f"{self.dataset}::{self.task}[{self.cell}-{self.attempt}]"


@dataclass(frozen=True, kw_only=True)
class CallRow(Usage):
    """One model call through the gateway and its tokens; cost None means the model's price is
    unknown, or its usage (`is_usage_known`). Stored in the `calls` table, a column per field."""

    run_id: str | None
    trial_id: str | None
    at: float
    provider: str | None
    wire: str
    method: str
    path: str
    model_requested: str | None
    model: str | None
    status: int
    cost: float | None
    latency: float
    ttfb: float | None
    request_bytes: int
    response_bytes: int
    error: str | None
    refused: bool
    headers: dict[str, str]
    role: str = "agent"  # or "judge:<name>"
    # False: the call reached an upstream but its usage could not be read (a stream cut, or
    # abandoned by its client, before the final count): its tokens (0 here) and cost are
    # stored NULL, unknown, never 0
    is_usage_known: bool = True


# a call's fields in the order the store's `calls` columns and the viewer's answers list them
CALL_COLUMNS = (
    "run_id", "trial_id", "at", "provider", "wire", "method", "path", "model_requested", "model",
    "status", *TOKEN_FIELDS, "cost", "latency", "ttfb", "request_bytes", "response_bytes", "error",
    "refused", "headers", "role",
)  # fmt: skip


@dataclass(frozen=True)
class RunRecord:
    id: str
    name: str
    created_at: float
    status: str
    spec: dict[str, Any]  # the recorded plan as stored: read it through `plan`
    trials_dir: Path

    @property
    def plan(self) -> StoredPlan:
        """The recorded plan, read as typed values."""
        return StoredPlan.read(self.spec)


@dataclass(frozen=True)
class TrialRecord:
    id: str
    run_id: str
    seq: int
    item_id: str
    dataset: str
    task: str
    harness: str
    attempt: int
    status: str
    outcome: Outcome | None
    reward: float | None
    rewards: dict[str, float]
    error: str | None
    duration: float | None
    trial_dir: str | None
    tokens: int = 0
    cost: float | None = 0.0
    models: tuple[str, ...] = ()
    other_model_tokens: int = 0
    stopped_by: str | None = None
    own_report: dict[str, Any] | None = None  # the harness's own numbers (output.SelfReport)
    replaces: str | None = None  # the row this one ran again (a retry or a resume)
    retries: int = 0  # infrastructure retries before this row
    exit_code: int | None = None
    judges: dict[str, float | None] = field(default_factory=dict)  # judge name -> score
    swe_class: str | None = None  # the SWE track's class (success, partial, overfit...)
    cause: str | None = None  # why it ended so beside its outcome (engine_outage, tampered...)
    engine: str | None = None  # the Docker engine of `[[sandbox.engines]]` it was placed on
    agent_user: str | None = None  # whose user its agent ran as ("0:0 (root, image)")
    kept_processes: bool = False  # verified with the agent's processes running (processes.py)
    calls: int = 0  # model calls through the gateway
    usage_unknown: int = 0  # of them, calls whose usage could not be read (cost is then None)
    is_priced: bool = True  # False: a call whose usage was read used a model without a price
    model: str | None = None  # a matrix run's cell model (None: the run's one model)

    @property
    def cell(self) -> str:
        """The harness, or in a matrix run the `harness@model` pair."""
        return self.harness if self.model is None else f"{self.harness}@{self.model}"

    @property
    def is_finished(self) -> bool:
        """It has an outcome: a result, or cancelled."""
        return self.status in TrialStatus.OVER


# how a scored trial's `error` starts when the real upstream answered some of its model calls
# 401/403 (the runner's key refused): the score stands, the report flags it (`upstream_refused`)
UPSTREAM_REFUSED = "the upstream refused the runner's key"


@dataclass(frozen=True)
class TrialFilter:
    """Which of a run's trials to list: each field left None matches every trial.

    `outcome` is a trial's outcome, or for a trial without one its status (`planned`,
    `running`, `deselected`); `text` is a case-insensitive substring of its item id or error."""

    harness: str | None = None
    task: str | None = None
    dataset: str | None = None
    outcome: str | None = None
    text: str | None = None


@dataclass(frozen=True)
class TrialCounts:
    """How many of a run's trials are in each status and outcome (replaced rows left out)."""

    statuses: dict[str, int]
    outcomes: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.statuses.values())


@dataclass(frozen=True, kw_only=True)
class TrialDetail(Usage):
    """What a trial's page shows beyond its `TrialRecord`: phases, times and usage."""

    trial: TrialRecord
    phases: dict[str, float]
    started_at: float | None
    finished_at: float | None
    worker: str | None
    calls: int
    job_state: str | None


@dataclass(frozen=True)
class Claim:
    """What a runner gets back when it claims a trial's job (`Store.claim`, `claim_next`):
    `state` is the job's state after the claim, `leased` when it is now this runner's to run;
    anything else says why not (`taken`, `lifecycle.TAKEN`: another live runner holds it)."""

    trial_id: str
    state: str

    @property
    def is_leased(self) -> bool:
        """The job is now the claiming runner's to run."""
        return self.state == JobState.LEASED


@dataclass(frozen=True)
class EngineSlot:
    """An engine a trial may be placed on: its name, address (what the store counts slots by,
    across runs), capacity, and whether it already holds the trial's image."""

    name: str
    address: str
    capacity: int
    has_image: bool = False
