"""Two sides side by side per task: a harness in two runs, or two harnesses of one run.

Each side's trials are grouped by task as the report groups them (`report.by_task`); the
difference is b - a, paired by task (`stats.paired_difference`), on the tasks both scored.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from pytest_hemra.core.records import TrialFilter, TrialRecord
from pytest_hemra.report.stats import mean_ci, paired_difference
from pytest_hemra.report.tables import by_task
from pytest_hemra.store import Store


@dataclass(frozen=True)
class Side:
    run_id: str
    harness: str


def pair_sides(store: Store, a: Side, b: Side) -> list[dict[str, Any]]:
    """Per dataset both sides have trials in: each side's mean reward, the paired difference
    b - a with its interval and p-value, and one row per task with each side's trials."""
    trials_a = store.trial_page(a.run_id, TrialFilter(harness=a.harness), limit=None)
    trials_b = store.trial_page(b.run_id, TrialFilter(harness=b.harness), limit=None)
    datasets_b = {t.dataset for t in trials_b}
    names = list(dict.fromkeys(t.dataset for t in trials_a if t.dataset in datasets_b))
    return [
        _dataset(
            name,
            [t for t in trials_a if t.dataset == name],
            [t for t in trials_b if t.dataset == name],
        )
        for name in names
    ]


def _dataset(name: str, trials_a: list[TrialRecord], trials_b: list[TrialRecord]) -> dict[str, Any]:
    rewards_a, rewards_b = by_task(trials_a), by_task(trials_b)
    try:
        change: dict[str, Any] | None = asdict(paired_difference(rewards_b, rewards_a))
    except ValueError:  # no task scored by both
        change = None
    cells_a, cells_b = _cells(trials_a), _cells(trials_b)
    rows = []
    for task in dict.fromkeys([*cells_a, *cells_b]):
        mean_a, mean_b = _mean(rewards_a.get(task)), _mean(rewards_b.get(task))
        rows.append(
            {
                "task": task,
                "a": cells_a.get(task, []),
                "b": cells_b.get(task, []),
                "a_mean": mean_a,
                "b_mean": mean_b,
                "diff": None if mean_a is None or mean_b is None else mean_b - mean_a,
            }
        )
    return {
        "dataset": name,
        "a": asdict(mean_ci(rewards_a)) if rewards_a else None,
        "b": asdict(mean_ci(rewards_b)) if rewards_b else None,
        "change": change,
        "tasks": rows,
    }


def _mean(rewards: list[float] | None) -> float | None:
    return sum(rewards) / len(rewards) if rewards else None


def _cells(trials: list[TrialRecord]) -> dict[str, list[dict[str, Any]]]:
    """Each task's trials, in plan order, as the grid shows them."""
    cells: dict[str, list[dict[str, Any]]] = {}
    for t in trials:
        cell = {"id": t.id, "attempt": t.attempt, "status": t.status, "outcome": t.outcome}
        cells.setdefault(t.task, []).append({**cell, "reward": t.reward})
    return cells
