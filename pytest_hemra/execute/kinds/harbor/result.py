"""A Harbor trial's `result.json`, read and mapped onto HEMRA's outcomes.

Harbor writes one `result.json` per trial when the trial is over (after its environment is
torn down). Its schema is Harbor's, so keys HEMRA does not use are ignored; the ones it uses
are typed. How its exceptions map onto outcomes:

- none, and a reward: pass or fail (pass = reward at the pass threshold)
- `AgentTimeoutError`: timeout
- `NonZeroAgentExitCodeError`, or any exception raised while the agent ran: harness_error
- a verifier's exception (`VerifierTimeoutError`, `RewardFile...Error`...), or no reward:
  verifier_error
- any other exception before the agent ran (image build, environment start, agent setup):
  infra_error; one after the verifier finished leaves the reward standing
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from pytest_hemra.core.errors import InfraError
from pytest_hemra.core.outcome import Outcome
from pytest_hemra.core.reward import is_pass, trial_reward
from pytest_hemra.core.trial import SelfReport

AGENT_EXCEPTIONS = frozenset({"NonZeroAgentExitCodeError"})
VERIFIER_EXCEPTIONS = frozenset(
    {
        "VerifierTimeoutError",
        "RewardFileNotFoundError",
        "RewardFileEmptyError",
        "VerifierOutputParseError",
    }
)


class Foreign(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, defer_build=True)


class Span(Foreign):
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def seconds(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return round((self.finished_at - self.started_at).total_seconds(), 4)


class ExceptionInfo(Foreign):
    exception_type: str
    exception_message: str = ""
    occurred_at: datetime | None = None


class AgentResult(Foreign):
    n_input_tokens: int | None = None
    n_cache_tokens: int | None = None
    n_output_tokens: int | None = None
    cost_usd: float | None = None


class VerifierResult(Foreign):
    rewards: dict[str, float] | None = None


class TaskReference(Foreign):
    path: str | None = None


class TrialConfig(Foreign):
    task: TaskReference = TaskReference()


class HarborTrialResult(Foreign):
    trial_name: str
    task_name: str = ""
    config: TrialConfig = TrialConfig()
    started_at: datetime | None = None
    finished_at: datetime | None = None
    environment_setup: Span | None = None
    agent_setup: Span | None = None
    agent_execution: Span | None = None
    verifier: Span | None = None
    verifier_result: VerifierResult | None = None
    agent_result: AgentResult | None = None
    exception_info: ExceptionInfo | None = None

    @property
    def task(self) -> str:
        """The task's folder name (what HEMRA calls the task); Harbor's own name otherwise."""
        return Path(self.config.task.path).name if self.config.task.path else self.task_name

    @property
    def duration(self) -> float | None:
        return Span(started_at=self.started_at, finished_at=self.finished_at).seconds

    def phases(self) -> dict[str, float]:
        spans = {
            "environment": self.environment_setup,
            "agent_setup": self.agent_setup,
            "agent": self.agent_execution,
            "verifier": self.verifier,
        }
        found = {name: span.seconds for name, span in spans.items() if span is not None}
        if self.verifier and self.verifier.finished_at and self.finished_at:
            found["teardown"] = Span(
                started_at=self.verifier.finished_at, finished_at=self.finished_at
            ).seconds
        return {name: seconds for name, seconds in found.items() if seconds is not None}

    def own_report(self) -> SelfReport | None:
        """What Harbor's agent reported about its own usage, when it reported anything."""
        usage = self.agent_result
        if usage is None or all(
            value is None
            for value in (
                usage.n_input_tokens,
                usage.n_cache_tokens,
                usage.n_output_tokens,
                usage.cost_usd,
            )
        ):
            return None
        return SelfReport(
            input_tokens=usage.n_input_tokens or 0,
            output_tokens=usage.n_output_tokens or 0,
            cache_read_tokens=usage.n_cache_tokens or 0,
            cost_usd=usage.cost_usd,
        )


def read_harbor_result(path: Path) -> HarborTrialResult | None:
    """A finished Harbor trial's result; None while the file is still being written."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    try:
        result = HarborTrialResult.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise InfraError(
            f"{path}: not a Harbor trial result (key '{where}': {first['msg']})"
        ) from None
    return result if result.finished_at is not None else None


def classify(
    result: HarborTrialResult, named: Sequence[str] = ()
) -> tuple[Outcome, float | None, dict[str, float], str | None]:
    """(outcome, reward, rewards, error) for one Harbor trial; its reward is the headline of
    its rewards as HEMRA's own trials' (`core.reward.trial_reward`, `named` the keys the run
    and the task name)."""
    rewards = dict(result.verifier_result.rewards or {}) if result.verifier_result else {}
    reward = trial_reward(rewards, named) if rewards else None
    if reward is not None and not math.isfinite(reward):  # malformed, as reward.txt's NaN is
        return Outcome.VERIFIER_ERROR, None, rewards, f"Harbor's verifier gave reward {reward!r}"
    failure = result.exception_info
    error = None
    if failure is not None:
        first_line = (failure.exception_message.strip().splitlines() or [""])[0]
        error = f"Harbor: {failure.exception_type}: {first_line}".rstrip(": ")
        kind = failure.exception_type
        if kind == "AgentTimeoutError":
            return Outcome.TIMEOUT, reward, rewards, error
        if kind in VERIFIER_EXCEPTIONS:
            return Outcome.VERIFIER_ERROR, None, rewards, error
        if kind in AGENT_EXCEPTIONS or _during_agent(result, failure):
            return Outcome.HARNESS_ERROR, reward, rewards, error
        if reward is None or not _after_verifier(result, failure):
            return Outcome.INFRA_ERROR, None, rewards, error
    if reward is None:
        return (
            Outcome.VERIFIER_ERROR,
            None,
            rewards,
            error or "Harbor's verifier gave no score: it recorded no reward",
        )
    return (Outcome.PASS if is_pass(reward) else Outcome.FAIL), reward, rewards, error


def _during_agent(result: HarborTrialResult, failure: ExceptionInfo) -> bool:
    span = result.agent_execution
    if span is None or span.started_at is None or failure.occurred_at is None:
        return False
    return span.finished_at is None or failure.occurred_at <= span.finished_at


def _after_verifier(result: HarborTrialResult, failure: ExceptionInfo) -> bool:
    span = result.verifier
    if span is None or span.finished_at is None or failure.occurred_at is None:
        return False
    return failure.occurred_at >= span.finished_at
