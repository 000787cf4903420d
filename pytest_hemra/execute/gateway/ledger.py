"""What a trial may spend and what it has spent: caps, the run's budget, and the totals.

Per-trial caps (tokens, cost) are checked against the trial's own totals before each call; the
run's budget (`budget_usd`) against what the whole run has spent, read from the store (so every
xdist worker shares it), plus this process's reservations for calls in flight. A reservation is
the most a call can cost (its input estimated from the request size, its output at `max_tokens`)
and is released when the call completes and its real cost is recorded.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pytest_hemra.core.records import CallRow
from pytest_hemra.core.usage import Usage
from pytest_hemra.execute.gateway.prices import price_table

BYTES_PER_TOKEN = 4  # a generous estimate of input tokens from the request size
DEFAULT_MAX_OUTPUT = 32_000
SPENT_CACHE_SECS = 0.5
DATE_SUFFIX = re.compile(r"-(\d{8}|\d{4}-\d{2}-\d{2})$")


@dataclass(frozen=True)
class CallPolicy:
    """The run's rules for one trial's calls."""

    model: str | None = None  # the run's model
    refuse_other_models: bool = False  # else: flag them
    max_tokens: int | None = None  # per trial
    max_cost_usd: float | None = None  # per trial


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


def same_model(requested: str | None, expected: str) -> bool:
    """Whether a requested model is the run's, allowing a provider prefix and a date suffix."""
    if requested is None:
        return True
    names = {requested, requested.split("/", 1)[-1]}
    names |= {DATE_SUFFIX.sub("", name) for name in names}
    wanted = {expected, expected.split("/", 1)[-1]}
    return bool(names & wanted)


class RunBudget:
    """The run's `budget_usd` (or a cell's `cell_budget_usd`), shared by every process through
    the store's recorded costs."""

    def __init__(
        self, limit_usd: float, spent: Callable[[], float], name: str = "run budget"
    ) -> None:
        self.name = name  # what a refused call's error names
        self.refused_by = name
        self.limit_usd = limit_usd
        self._spent = spent
        self._reserved = 0.0
        self._lock = threading.Lock()
        self._cached = (0.0, -1.0)

    def reserve(
        self, model: str | None, request: dict[str, Any], request_bytes: int
    ) -> float | None:
        """Reserve the most this call can cost; None when that would pass the budget."""
        amount = worst_cost(model, request, request_bytes)
        with self._lock:
            if self._spent_now() + self._reserved + amount > self.limit_usd:
                return None
            self._reserved += amount
        return amount

    def release(self, amount: float) -> None:
        with self._lock:
            self._reserved = max(0.0, self._reserved - amount)
            self._cached = (0.0, -1.0)  # the call's real cost is recorded: read it afresh

    def _spent_now(self) -> float:
        value, at = self._cached
        if time.monotonic() - at > SPENT_CACHE_SECS:
            value = self._spent()
            self._cached = (value, time.monotonic())
        return value


class Budgets:
    """Several budgets a call must fit in at once (the run's and its cell's): reserved in each,
    or in none."""

    def __init__(self, budgets: list[RunBudget]) -> None:
        self.budgets = budgets
        self.refused_by = budgets[0].name if budgets else ""

    def reserve(
        self, model: str | None, request: dict[str, Any], request_bytes: int
    ) -> float | None:
        taken: list[tuple[RunBudget, float]] = []
        for budget in self.budgets:
            amount = budget.reserve(model, request, request_bytes)
            if amount is None:
                self.refused_by = budget.name
                for held, reserved in taken:
                    held.release(reserved)
                return None
            taken.append((budget, amount))
        return taken[0][1] if taken else 0.0

    def release(self, amount: float) -> None:
        for budget in self.budgets:
            budget.release(amount)


def worst_cost(model: str | None, request: dict[str, Any], request_bytes: int) -> float:
    price = price_table().price_of(model)
    if price is None:
        return 0.0  # unknown price: cannot be budgeted, and is flagged in the report
    output = request.get("max_tokens") or request.get("max_output_tokens") or DEFAULT_MAX_OUTPUT
    output = output if isinstance(output, int) else DEFAULT_MAX_OUTPUT
    return (request_bytes / BYTES_PER_TOKEN * price.input + output * price.output) / 1_000_000
