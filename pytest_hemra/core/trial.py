"""What one trial produced, as every phase after it reads it: the gateway's totals of its calls
(`TrialUsage`), what the harness said of itself (`SelfReport`), each judge's score (`Judgment`),
each step of a multi-step task (`StepResult`) and the trial's whole result (`TrialResult`), which
the store takes as it is (`Store.finish_trial`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pytest_hemra.core.outcome import Cause, Outcome, SweClass
from pytest_hemra.core.records import CallRow
from pytest_hemra.core.usage import Usage

RESULT_SCHEMA_VERSION = 2  # 2: `error_class` split into `swe_class` and `cause`


@dataclass(frozen=True, kw_only=True)
class TrialUsage(Usage):
    """A trial's calls added up by the gateway. `cost` sums the calls whose usage was read
    (None once one of them has no price): what caps compare; `usage_unknown` counts the calls
    whose usage could not be read, which make the trial's cost unknown (`known_cost`).

    Stored flat (`result.json`'s `usage`): the four token counts, then the fields below."""

    calls: int = 0
    refused: int = 0
    unreachable: int = 0
    other_model_tokens: int = 0
    cost: float | None = 0.0
    usage_unknown: int = 0
    models: list[str] = field(default_factory=list)
    stopped_by: str | None = None  # "token cap", "cost cap", "run budget"

    def with_call(self, row: CallRow, is_other_model: bool) -> TrialUsage:
        """These totals with one more call."""
        return TrialUsage(
            **(self.tokens + row.tokens).counts(),
            calls=self.calls + 1,
            refused=self.refused + int(row.refused),
            unreachable=self.unreachable
            + int((row.error or "").startswith("upstream unreachable")),
            other_model_tokens=self.other_model_tokens
            + (row.total_tokens if is_other_model else 0),
            cost=None
            if self.cost is None or (row.cost is None and row.is_usage_known)
            else self.cost + (row.cost or 0.0),
            usage_unknown=self.usage_unknown + int(not row.is_usage_known),
            models=[*self.models, row.model]
            if row.model and row.model not in self.models
            else self.models,
            stopped_by=self.stopped_by,
        )

    def combined(self, more: TrialUsage) -> TrialUsage:
        """Two token windows of one trial added up (a multi-step task has one per step)."""
        if not self.calls:
            return more
        if not more.calls:
            return self
        return TrialUsage(
            **(self.tokens + more.tokens).counts(),
            calls=self.calls + more.calls,
            refused=self.refused + more.refused,
            unreachable=self.unreachable + more.unreachable,
            other_model_tokens=self.other_model_tokens + more.other_model_tokens,
            cost=None if self.cost is None or more.cost is None else self.cost + more.cost,
            usage_unknown=self.usage_unknown + more.usage_unknown,
            models=list(dict.fromkeys([*self.models, *more.models])),
            stopped_by=self.stopped_by or more.stopped_by,
        )

    @property
    def known_cost(self) -> float | None:
        """What the calls cost, or None when it is unknown: a model without a price, or a call
        whose usage could not be read."""
        return None if self.usage_unknown else self.cost

    @property
    def is_unreachable(self) -> bool:
        """Every call that reached for an upstream found it unreachable: infrastructure."""
        tried = self.calls - self.refused
        return tried > 0 and self.unreachable == tried


@dataclass(frozen=True)
class SelfReport(Usage):
    """The harness's own token counts (stored as the trial's `own_report`), and what else it
    says: cost, turns, its final message, whether it ended in error. `core.usage.disagrees`
    compares its total with the gateway's."""

    cost_usd: float | None = None
    turns: int | None = None
    final_message: str | None = None
    is_error: bool | None = None
    # its counts are its own estimate, not the server's (aider counts with its tokenizer while
    # it streams): shown, never held against the gateway's (`self_report` skips it)
    is_estimate: bool = False


@dataclass(frozen=True)
class Judgment:
    judge: str
    score: float | None
    rationale: str
    error: str | None
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float | None = 0.0
    duration: float = 0.0


@dataclass
class TrialResult:
    outcome: str
    reward: float | None
    rewards: dict[str, float]
    exit_code: int | None
    error: str | None
    started_at: float
    finished_at: float
    duration: float
    phases: dict[str, float]
    trial_dir: str
    usage: TrialUsage = field(default_factory=TrialUsage)
    own_report: SelfReport | None = None
    retried: bool = False
    swe_class: SweClass | None = None  # the SWE track's class of the result
    cause: Cause | None = None  # why it ended so, beside its outcome (not the verdict)
    judgments: list[Judgment] = field(default_factory=list)
    steps: list[StepResult] = field(default_factory=list)
    engine: str | None = None  # the engine of [[sandbox.engines]] it ran on
    agent_user: str | None = None  # whose user the agent ran as (`identity.py`)
    kept_processes: bool = False  # verified with the agent's processes running
    schema_version: int = RESULT_SCHEMA_VERSION

    @property
    def is_scored(self) -> bool:
        return self.outcome in Outcome.SCORED


@dataclass(frozen=True)
class StepResult:
    """One step of a multi-step task: its agent turn and its verifier."""

    name: str
    reward: float | None
    rewards: dict[str, float]
    exit_code: int | None
    timed_out: bool
    duration: float
    error: str | None = None  # a skipped step's: `skipped: ...`
    skipped: bool = False  # not run: an earlier step fell short of its min_reward
