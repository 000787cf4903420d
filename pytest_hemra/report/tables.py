"""Reports, read only from the store: per dataset, every harness against the baseline.

`build_report` turns a run's stored trials into numbers (statistics from `stats.py`, flags from
`fairness.py`); `formats.py` renders them as text, markdown, CSV, JSON or HTML. Only scored
trials (pass, fail, timeout, harness_error) count in scores; a harness is compared with the
baseline on the tasks both have scored trials for.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_hemra.core.errors import StoreError
from pytest_hemra.core.outcome import Outcome
from pytest_hemra.core.records import TrialRecord
from pytest_hemra.core.usage import Usage
from pytest_hemra.report.fairness import (
    Flag,
    calibration_flags,
    dataset_flags,
)
from pytest_hemra.report.stats import (
    Comparison,
    Estimate,
    Spread,
    mean_ci,
    paired_difference,
    pass_k_over_one_task_set,
    summary,
)
from pytest_hemra.store import Store

# the fewest tasks on which tasks that all moved alike reach p < 0.05 (2 / 2**6, `stats`)
MIN_SIGNIFICANT_TASKS = 6


@dataclass(frozen=True)
class HarnessSummary:
    harness: str
    is_baseline: bool
    planned: int  # trials, deselected ones left out
    finished: int  # trials with a result (scored or errored)
    scored: int
    passes: int
    tasks: int  # tasks with at least one scored trial
    reward: Estimate | None  # mean reward, 95% CI clustered by task
    pass_rate: Estimate | None
    versus: Comparison | None  # paired difference from the baseline's reward
    pass_at_k: dict[int, float | None]  # k = 1..attempts, every k over the same tasks:
    pass_hat_k: dict[int, float | None]
    pass_k_tasks: int  # those with every attempt scored
    pass_k_left_out: int  # tasks with some attempts scored, but not all: in no pass@k
    tokens: Spread
    cost: Spread | None  # None: some trial's cost is unknown
    duration: Spread
    outcomes: dict[str, int]
    own_tokens: int | None  # what the harness itself reported, where it reports
    judges: dict[str, Estimate | None] = field(default_factory=dict)
    classes: dict[str, int] = field(default_factory=dict)  # the SWE track's error classes

    @property
    def is_significant(self) -> bool:
        return self.versus is not None and self.versus.is_significant


@dataclass(frozen=True)
class DatasetReport:
    name: str
    digest: str
    tasks: int
    attempts: int
    harnesses: list[HarnessSummary]
    flags: list[Flag]


@dataclass(frozen=True)
class RunReport:
    run_id: str
    name: str
    store: str
    status: str
    baseline: str
    model: str | None
    datasets: list[DatasetReport]


def by_task(trials: Sequence[TrialRecord]) -> dict[str, list[float]]:
    """Scored trials' rewards, grouped by task (attempts of a task stay together).

    A scored trial without a reward (a Harbor agent that timed out or crashed before its
    verifier ran) counts as 0, as a failure would; docs/reports.md says so."""
    grouped: dict[str, list[float]] = defaultdict(list)
    for trial in trials:
        if trial.outcome in Outcome.SCORED:
            grouped[trial.task].append(trial.reward or 0.0)
    return dict(grouped)


def summarize(
    trials: Sequence[TrialRecord],
    harness: str,
    attempts: int,
    baseline: dict[str, list[float]] | None,
) -> HarnessSummary:
    mine = [t for t in trials if t.status != "deselected"]  # the harness's own trials
    finished = [t for t in mine if t.status == "finished"]
    rewards = by_task(mine)
    # a pass is the trial's outcome: the task's own threshold (the open track's) decides it
    passes: dict[str, list[float]] = defaultdict(list)
    for trial in mine:
        if trial.outcome in Outcome.SCORED:
            passes[trial.task].append(float(trial.outcome == Outcome.PASS))
    outcomes: dict[str, int] = defaultdict(int)
    for trial in mine:
        if trial.outcome:
            outcomes[trial.outcome] += 1
    own = [Usage.of(t.own_report).total_tokens for t in finished if t.own_report]
    judges: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for trial in finished:
        for name, score in trial.judges.items():
            if score is not None:
                judges[name][trial.task].append(score)
    bools = {task: [p == 1.0 for p in values] for task, values in passes.items()}
    pass_k = pass_k_over_one_task_set(bools, attempts)
    return HarnessSummary(
        harness=harness,
        is_baseline=baseline is None,
        planned=len(mine),
        finished=len(finished),
        scored=sum(len(v) for v in rewards.values()),
        passes=int(sum(sum(v) for v in passes.values())),
        tasks=len(rewards),
        reward=mean_ci(rewards) if rewards else None,
        pass_rate=mean_ci(passes) if passes else None,
        versus=versus_baseline(rewards, baseline),
        pass_at_k=pass_k.pass_at_k,
        pass_hat_k=pass_k.pass_hat_k,
        pass_k_tasks=pass_k.tasks,
        pass_k_left_out=pass_k.left_out,
        tokens=summary([float(t.tokens) for t in finished]),
        cost=None
        if any(t.cost is None for t in finished)
        else summary([t.cost or 0.0 for t in finished]),
        duration=summary([t.duration for t in finished if t.duration is not None]),
        outcomes=dict(sorted(outcomes.items())),
        own_tokens=sum(own) if own else None,
        judges={name: mean_ci(scores) for name, scores in sorted(judges.items())},
        classes=dict(sorted(Counter(t.error_class for t in finished if t.error_class).items())),
    )


def versus_baseline(
    rewards: dict[str, list[float]], baseline: dict[str, list[float]] | None
) -> Comparison | None:
    """The paired difference from the baseline; None for the baseline itself, and while no task
    is scored by both (a run just started, a harness whose trials all errored)."""
    if baseline is None or not rewards.keys() & baseline.keys():
        return None
    return paired_difference(rewards, baseline)


def build_report(store: Store, run_id: str) -> RunReport:
    run = store.run(run_id)
    plan = run.plan
    if plan.baseline is None:
        raise StoreError(f"{store.path}: run {run_id} was recorded without harnesses")
    baseline, ordered = plan.baseline, plan.ordered_harnesses
    groups: dict[tuple[str, str], list[TrialRecord]] = defaultdict(list)
    for trial in store.trials(run_id):
        groups[trial.dataset, trial.harness].append(trial)
    judges = [(j.name, j.model) for j in plan.judges]
    calibrations = {
        j.name: store.latest_calibration(j.rubric_digest, j.model)
        for j in plan.judges
        if j.model is not None
    }
    judge_flags = calibration_flags(judges, calibrations)
    datasets = []
    for name, entry in plan.datasets.items():
        mine = [t for h in ordered for t in groups[name, h]]
        attempts = max((t.attempt for t in mine), default=1)
        base_rewards = by_task(groups[name, baseline])
        rows = [
            summarize(groups[name, h], h, attempts, None if h == baseline else base_rewards)
            for h in ordered
        ]
        flags = dataset_flags(mine, ordered, plan.model, plan.unmetered, plan.unisolated)
        flags += [flag for row in rows if (flag := too_few_tasks(row)) is not None]
        flags += judge_flags
        datasets.append(
            DatasetReport(name, entry.digest or "", len(entry.tasks), attempts, rows, flags)
        )
    return RunReport(run.id, run.name, str(store.path), run.status, baseline, plan.model, datasets)


def too_few_tasks(row: HarnessSummary) -> Flag | None:
    """A difference from the baseline that is not significant: how many tasks would settle it.

    Nothing is said of an exact tie (no number of tasks turns a zero difference into one)."""
    versus = row.versus
    if versus is None or versus.n_tasks == 0 or versus.diff == 0:
        return None
    if versus.is_significant:
        return None
    if versus.sd == 0:  # every shared task moved alike: that many tasks moving alike would tell
        more = MIN_SIGNIFICANT_TASKS
    else:  # the t-interval's half-width shrinks as 1 / sqrt(tasks)
        half_width = max(abs(versus.high - versus.diff), abs(versus.diff - versus.low))
        more = max(
            math.ceil(versus.n_tasks * (half_width / abs(versus.diff)) ** 2),
            MIN_SIGNIFICANT_TASKS,
        )
    needed = f"; about {more} tasks would resolve a difference this size"
    return Flag(
        "too_few_tasks",
        row.harness,
        f"its difference from the baseline ({versus.diff:+.3f}, 95% CI {versus.low:+.3f} to"
        f" {versus.high:+.3f}, p={versus.p_value:.2f}) is not significant on"
        f" {versus.n_tasks} shared tasks{needed}",
    )


def report_dict(report: RunReport) -> dict[str, Any]:
    """The report as plain JSON-ready data (the `json` format and `--hemra-summary`)."""
    from dataclasses import asdict

    data = asdict(report)
    for dataset, source in zip(data["datasets"], report.datasets, strict=True):
        dataset["flags"] = [
            {"kind": f.kind, "harness": f.harness, "message": f.message} for f in source.flags
        ]
    return data
