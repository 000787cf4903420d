"""What the store holds, as plain frozen objects: planned trials, runs, trials, calls."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_hemra.core.outcome import Outcome
from pytest_hemra.core.stored import StoredPlan

DEFAULT_STORE = Path(".hemra") / "hemra.db"  # relative to the run file's folder, or the cwd
FINISHED = "finished"
CANCELLED = "cancelled"
# what a trial shows while it has no outcome yet (a filter on outcome names these statuses too)
STATUSES_WITHOUT_OUTCOME = ("planned", "running", "deselected")


@dataclass(frozen=True)
class PlannedTrial:
    """One attempt of one harness on one task, as planned before anything runs."""

    dataset: str
    task: str
    harness: str
    attempt: int

    @property
    def item_id(self) -> str:
        return f"{self.dataset}::{self.task}[{self.harness}-{self.attempt}]"


@dataclass(frozen=True)
class CallRow:
    """One model call through the gateway; cost None means the model's price is unknown."""

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
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cost: float | None
    latency: float
    ttfb: float | None
    request_bytes: int
    response_bytes: int
    error: str | None
    refused: bool
    headers: dict[str, str]
    role: str = "agent"  # or "judge:<name>"


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
    error_class: str | None = None  # the SWE track's class (success, partial, overfit...)
    engine: str | None = None  # the Docker engine of `[[sandbox.engines]]` it was placed on

    @property
    def is_finished(self) -> bool:
        """It has an outcome: a result, or cancelled."""
        return self.status in (FINISHED, CANCELLED)


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


@dataclass(frozen=True)
class TrialDetail:
    """What a trial's page shows beyond its `TrialRecord`: phases, times and usage."""

    trial: TrialRecord
    phases: dict[str, float]
    started_at: float | None
    finished_at: float | None
    worker: str | None
    calls: int
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    job_state: str | None


@dataclass(frozen=True)
class EngineSlot:
    """An engine a trial may be placed on: its name, address (what the store counts slots by,
    across runs), capacity, and whether it already holds the trial's image."""

    name: str
    address: str
    capacity: int
    has_image: bool = False
