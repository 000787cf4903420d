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
from dataclasses import dataclass
from typing import Any

from pytest_hemra.execute.gateway.prices import cost_of
from pytest_hemra.execute.gateway.wire import CallUsage

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
    """The most a call can cost: its input estimated from the request's size (at the tier that
    size reaches), its output at `max_tokens`."""
    output = request.get("max_tokens") or request.get("max_output_tokens") or DEFAULT_MAX_OUTPUT
    output = output if isinstance(output, int) else DEFAULT_MAX_OUTPUT
    usage = CallUsage(request_bytes // BYTES_PER_TOKEN + 1, output, model=model)
    # unknown price: cannot be budgeted, and is flagged in the report
    return cost_of(usage).usd or 0.0
