"""One task set per table: the tasks every row's numbers are taken over.

A task counts when every row of the table has trials on it (deselected ones aside) and every one
of them has a score. A task one row could not score (an infra_error that persisted past its
retries, a cancel, a trial not yet run) leaves every row's mean, interval, pass rate, pass@k and
difference together, and the table says so (`task_set`). Taken row by row instead, a harness
whose hard task went unscored would be averaged over its easy ones alone: 1.000 against an
honest solver's 0.500 on the same two tasks. A verifier_error is a score (0), so nothing a
harness leaves in its sandbox takes a task out.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pytest_hemra.core.lifecycle import TrialStatus
from pytest_hemra.core.outcome import Outcome
from pytest_hemra.core.records import TrialRecord


@dataclass(frozen=True)
class TaskSet:
    counted: frozenset[str]  # the tasks every row's numbers are over
    left_out: dict[str, tuple[str, ...]]  # task -> why, one "harness outcome" each
    pass_k: frozenset[str]  # of `counted`, those every row has the run's attempts scored on

    @property
    def tasks(self) -> int:
        return len(self.counted) + len(self.left_out)


def one_task_set(
    rows: Mapping[str, Sequence[TrialRecord]], names: Sequence[str], attempts: int
) -> TaskSet:
    """The table's task set from its rows' trials (`names` are the rows, in order)."""
    ran: dict[str, set[str]] = {}  # row -> the tasks it has a trial on
    scored: dict[str, Counter[str]] = {}  # row -> task -> scored trials
    why: dict[str, list[str]] = defaultdict(list)
    # read once: a member read off its enum class is slow, and this runs over every trial
    deselected, scored_outcomes = TrialStatus.DESELECTED, Outcome.SCORED
    for name in names:
        mine = [t for t in rows.get(name, ()) if t.status != deselected]
        unscored = [t for t in mine if t.outcome not in scored_outcomes]
        scored[name] = Counter([t.task for t in mine])
        scored[name].subtract([t.task for t in unscored])
        ran[name] = set(scored[name])
        for trial in unscored:
            if (reason := f"{name} {trial.outcome or trial.status}") not in why[trial.task]:
                why[trial.task].append(reason)
    every_task = sorted(set[str]().union(*ran.values()))
    for task in every_task:
        why[task] += [f"{name} not run" for name in names if task not in ran[name]]
    kept = frozenset(task for task in every_task if not why[task])
    full = frozenset(t for t in kept if all(scored[name][t] >= attempts for name in names))
    return TaskSet(kept, {task: tuple(why[task]) for task in every_task if why[task]}, full)
