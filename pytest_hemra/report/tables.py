"""Reports, read only from the store: per dataset, every harness against the baseline.

`build_report` turns a run's stored trials into numbers (statistics from `stats.py`, flags from
`fairness.py`); `formats.py` renders them as text, markdown, CSV, JSON or HTML. Only scored
trials (pass, fail, timeout, harness_error, and tampered and verifier_error as 0) count in
scores, and each table's numbers are over one task set (`taskset.py`): a task some row could not
score leaves every row together, so every mean, interval, pass@k and difference in a table is
over the same tasks.
"""

from __future__ import annotations

import gc
import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache, cached_property, partial
from typing import Any

from pytest_hemra.core.errors import StoreError
from pytest_hemra.core.lifecycle import TrialStatus
from pytest_hemra.core.outcome import Outcome
from pytest_hemra.core.records import TrialRecord
from pytest_hemra.core.stored import StoredPlan
from pytest_hemra.core.usage import Usage
from pytest_hemra.core.words import plural
from pytest_hemra.report.fairness import (
    WHOLE_DATASET,
    Flag,
    calibration_flags,
    dataset_flags,
)
from pytest_hemra.report.rewardkeys import (
    Named,
    Shapes,
    key_estimates,
    key_trials,
    no_headline_flag,
    reward_shapes,
    shape_extra_keys,
    shape_headline_less,
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
from pytest_hemra.report.taskset import TaskSet, one_task_set
from pytest_hemra.report.variance import Observation, VarianceReport, decompose
from pytest_hemra.store import Store

# the fewest tasks on which tasks that all moved alike reach p < 0.05 (2 / 2**6, `stats`)
MIN_SIGNIFICANT_TASKS = 6
VARIANCE_MIN_TASKS = 10  # where the variance comes from is fitted from this many tasks on


@dataclass(frozen=True)
class HarnessSummary:
    harness: str
    is_baseline: bool
    planned: int  # trials, deselected ones left out
    finished: int  # trials with a result (scored or errored)
    scored: int  # counts, of every trial (left-out tasks' too)
    passes: int
    tasks: int  # tasks its numbers are over: the table's task set (`taskset.py`)
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
    # each reward key other than the headline: its mean and 95% CI (`rewardkeys.py`)
    keys: dict[str, Estimate | None] = field(default_factory=dict)
    classes: dict[str, int] = field(default_factory=dict)  # the SWE track's error classes
    # of the tasks with two or more scored attempts, the share whose attempts disagree (some
    # passed, some did not): None with fewer than two attempts on every task
    disagree: float | None = None

    @property
    def is_significant(self) -> bool:
        return self.versus is not None and self.versus.is_significant


@dataclass(frozen=True)
class DatasetReport:
    """One table of a dataset. A matrix run (several models) has one a model (its harnesses
    against the baseline harness: `view` "model M") and one a harness run under several models
    (its models against the baseline model: `view` "harness H", rows labelled by model)."""

    name: str
    digest: str
    tasks: int
    attempts: int
    harnesses: list[HarnessSummary]  # the rows: harnesses, or models (`axis`)
    flags: list[Flag]
    view: str = ""  # "" (one model), "model M" or "harness H"
    axis: str = "harness"  # what the rows are: "harness" or "model"
    variance: VarianceReport | None = None  # where the variance comes from (its first table)
    # the one task set every row's numbers are over (`taskset.py`), and the tasks left out of
    # every row, each with why ("harness outcome" of its trials without a score)
    counted_tasks: list[str] = field(default_factory=list)
    tasks_left_out: dict[str, list[str]] = field(default_factory=dict)
    # a table of one reward key alone, over the tasks without a headline (`rewardkeys.py`)
    reward_key: str | None = None


@dataclass(frozen=True)
class RunReport:
    run_id: str
    name: str
    store: str
    status: str
    baseline: str
    model: str | None
    datasets: list[DatasetReport]
    prices: str | None = None  # where its costs came from: the price dataset and its version
    kept_at: float | None = None  # read back as kept at this time (`snapshot.py`); None: built now


def by_task(trials: Sequence[TrialRecord]) -> dict[str, list[float]]:
    """Scored trials' rewards, grouped by task (attempts of a task stay together).

    A scored trial without a reward (a Harbor agent that timed out or crashed before its
    verifier ran) counts as 0, as a failure would; docs/reports.md says so."""
    grouped: dict[str, list[float]] = defaultdict(list)
    scored = Outcome.SCORED  # read once: a member read off its enum class is slow
    for trial in trials:
        if trial.outcome in scored:
            grouped[trial.task].append(trial.reward or 0.0)
    return dict(grouped)


def summarize(
    trials: Sequence[TrialRecord],
    harness: str,
    attempts: int,
    baseline: dict[str, list[float]] | None,
    task_set: TaskSet | None = None,
    extras: Mapping[str, Sequence[str]] | None = None,
) -> HarnessSummary:
    """A row's numbers over the table's task set (`taskset.py`; alone, its own); its counts
    (trials, scored, passes, outcomes), tokens, cost and durations over all of its trials;
    `extras`: each task's reward keys other than its headline (`rewardkeys.extra_keys`)."""
    # read once: a member read off its enum class is slow, and a row has every trial of a harness
    deselected, done, scored, passed = (
        TrialStatus.DESELECTED, TrialStatus.FINISHED, Outcome.SCORED, Outcome.PASS,
    )  # fmt: skip
    mine = [t for t in trials if t.status != deselected]  # the harness's own trials
    finished = [t for t in mine if t.status == done]
    found = task_set or one_task_set({harness: mine}, [harness], attempts)
    in_set = found.counted
    counted = [t for t in mine if t.task in in_set]
    # a pass is the trial's outcome: the task's own threshold (the open track's) decides it
    grouped: dict[str, list[float]] = defaultdict(list)
    passes: dict[str, list[float]] = defaultdict(list)
    for trial in [t for t in counted if t.outcome in scored]:
        grouped[trial.task].append(trial.reward or 0.0)
        passes[trial.task].append(float(trial.outcome == passed))
    rewards = dict(grouped)
    outcomes = Counter([t.outcome for t in mine if t.outcome])
    marked = [t for t in finished if t.own_report or t.judges or t.swe_class]  # the rarer ones
    own = [Usage.of(t.own_report).total_tokens for t in marked if t.own_report]
    judges: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for trial in [t for t in marked if t.judges and t.task in in_set]:
        for name, score in trial.judges.items():
            if score is not None:
                judges[name][trial.task].append(score)
    bools = {task: list(map(bool, values)) for task, values in passes.items()}  # 0.0 or 1.0
    pass_k = pass_k_over_one_task_set(
        {task: values for task, values in bools.items() if task in found.pass_k}, attempts
    )
    repeated = [values for values in bools.values() if len(values) > 1]
    disagree = sum(len(set(v)) > 1 for v in repeated) / len(repeated) if repeated else None
    costs = [t.cost for t in finished]
    return HarnessSummary(
        harness=harness,
        is_baseline=baseline is None,
        planned=len(mine),
        finished=len(finished),
        scored=sum(n for outcome, n in outcomes.items() if outcome in scored),  # every trial
        passes=sum(n for outcome, n in outcomes.items() if outcome == passed),
        tasks=len(rewards),
        reward=mean_ci(rewards) if rewards else None,
        pass_rate=mean_ci(passes) if passes else None,
        versus=versus_baseline(rewards, baseline),
        pass_at_k=pass_k.pass_at_k,
        pass_hat_k=pass_k.pass_hat_k,
        pass_k_tasks=pass_k.tasks,
        pass_k_left_out=len(found.counted) - pass_k.tasks,
        tokens=summary([float(t.tokens) for t in finished]),
        cost=None if None in costs else summary([cost or 0.0 for cost in costs]),
        duration=summary([t.duration for t in finished if t.duration is not None]),
        outcomes=dict(sorted(outcomes.items())),
        own_tokens=sum(own) if own else None,
        judges={name: mean_ci(scores) for name, scores in sorted(judges.items())},
        keys=key_estimates(counted, extras) if extras else {},
        classes=dict(sorted(Counter(t.swe_class for t in marked if t.swe_class).items())),
        disagree=disagree,
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
    # the cyclic garbage collector is paused meanwhile: a report makes a few objects for each
    # of a run's trials, none of them in a cycle, and the collector's passes over every record
    # read were a quarter of the report's time
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _build_report(store, run_id)
    finally:
        if was_enabled:
            gc.enable()


def _build_report(store: Store, run_id: str) -> RunReport:
    run = store.run(run_id)
    plan = run.plan
    if plan.baseline is None:
        raise StoreError(f"{store.name}: run {run_id} was recorded without harnesses")
    trials = store.trials(run_id)
    judges = [(j.name, j.model) for j in plan.judges]
    calibrations = {
        j.name: store.latest_calibration(j.rubric_digest, j.model)
        for j in plan.judges
        if j.model is not None
    }
    judge_flags = calibration_flags(judges, calibrations)
    datasets = []
    for name, entry in plan.datasets.items():
        mine = [t for t in trials if t.dataset == name]
        attempts = max([t.attempt for t in mine], default=1)

        named: Named = cache(partial(plan.reward_keys, name))  # a task's, asked of every trial
        views = _views(plan, mine)
        tables = [
            _table(plan, name, entry.digest or "", len(entry.tasks), attempts, view, named)
            for view in views
        ]
        tables += _key_tables(plan, name, entry.digest or "", attempts, views, named)
        for later in tables[1:]:  # what concerns the whole dataset is said once, under the first
            later.flags[:] = [flag for flag in later.flags if flag.kind not in WHOLE_DATASET]
        tables[0].flags.extend(judge_flags)
        pairs: dict[tuple[str, str | None], list[TrialRecord]] = defaultdict(list)
        for trial in mine:
            pairs[trial.harness, trial.model].append(trial)
        cells: dict[str, list[TrialRecord]] = defaultdict(list)  # every harness and model
        for (harness, model), cell in pairs.items():
            cells[f"{harness} {model or ''}"] += cell
        counted = one_task_set(cells, list(cells), 1).counted
        variance = _variance(plan, [t for t in mine if t.task in counted])
        tables[0] = replace(tables[0], variance=variance)
        datasets += tables
    return RunReport(run.id, run.name, store.name, run.status, plan.baseline, plan.model,
                     datasets, plan.prices)  # fmt: skip


@dataclass(frozen=True)
class View:
    """One table's trials (labelled by their row: `harness` holds a model in a model axis),
    its rows in order (the baseline first) and the model its harnesses had to use."""

    title: str
    axis: str
    trials: list[TrialRecord]
    rows: list[str]
    model: str | None

    @cached_property
    def shapes(self) -> Shapes:
        """Its tasks' reward key lists (`rewardkeys.reward_shapes`), read once a view."""
        return reward_shapes(self.trials)


def _views(plan: StoredPlan, trials: list[TrialRecord]) -> list[View]:
    """One table, or in a matrix run one per model, then one per harness run under several."""
    ordered = plan.ordered_harnesses
    if not plan.models:
        return [View("", "harness", trials, ordered, plan.model)]
    views = []
    for model in plan.models:
        mine = [t for t in trials if t.model == model]
        present = {t.harness for t in mine}
        rows = [h for h in ordered if h in present]
        if rows:
            views.append(View(f"model {model}", "harness", mine, rows, model))
    models = [plan.baseline_model or plan.models[0]]
    models += [m for m in plan.models if m not in models]
    for harness in ordered:
        mine = [replace(t, harness=t.model or "") for t in trials if t.harness == harness]
        present = {t.harness for t in mine}
        rows = [m for m in models if m in present]
        if len(rows) > 1:
            views.append(View(f"harness {harness}", "model", mine, rows, None))
    return views


def _variance(plan: StoredPlan, trials: list[TrialRecord]) -> VarianceReport | None:
    """Where a dataset's variance comes from (`variance.py`), for a run of several harnesses or
    models on at least VARIANCE_MIN_TASKS tasks; None otherwise."""
    outcomes = Outcome.SCORED  # read once: a member read off its enum class is slow
    scored = [t for t in trials if t.outcome in outcomes]
    tasks = {t.task for t in scored}
    if len(tasks) < VARIANCE_MIN_TASKS or (len(plan.harness_names) < 2 and not plan.models):
        return None
    one_model = plan.model or "-"
    # made as the tuples they are: a named tuple's own constructor is a Python call a trial
    new = tuple.__new__
    observations = [
        new(Observation, (t.task, t.harness, t.model or one_model, t.reward or 0.0)) for t in scored
    ]
    baseline_model = plan.baseline_model or one_model
    return decompose(observations, plan.baseline or "", baseline_model, VARIANCE_MIN_TASKS)


def _key_tables(
    plan: StoredPlan, name: str, digest: str, attempts: int, views: list[View], named: Named
) -> list[DatasetReport]:
    """For the tasks without a headline (`rewardkeys.py`), one table a key and view: the
    harnesses compared on that key alone; the first table of the dataset gets the flag."""
    shapes: dict[str, dict[tuple[str, ...], None]] = defaultdict(dict)
    for view in views:
        for task, lists in view.shapes.items():
            shapes[task].update(lists)
    tasks = shape_headline_less(shapes, named)
    keys = sorted({key for names in tasks.values() for key in names})
    tables = []
    for view in views:
        for key in keys:
            trials = key_trials(view.trials, tasks, key)
            title = f"{view.title}, key {key}" if view.title else f"key {key}"
            keyed = replace(view, title=title, trials=trials)
            table = _table(plan, name, digest, len(tasks), attempts, keyed, named)
            flags = [f for f in table.flags if f.kind in KEY_TABLE_FLAGS]
            tables.append(replace(table, flags=flags, reward_key=key))
    return tables


# what a key's table says under it: the rest is said under the dataset's own table
KEY_TABLE_FLAGS = frozenset({"too_few_tasks", "task_set"})


def _table(
    plan: StoredPlan,
    name: str,
    digest: str,
    tasks: int,
    attempts: int,
    view: View,
    named: Named = lambda task: (),
) -> DatasetReport:
    groups: dict[str, list[TrialRecord]] = defaultdict(list)
    for trial in view.trials:
        groups[trial.harness].append(trial)
    baseline = view.rows[0] if view.rows else ""
    found = one_task_set(groups, view.rows, attempts)
    base_rewards = by_task([t for t in groups[baseline] if t.task in found.counted])
    extras = shape_extra_keys(view.shapes, named)
    rows = [
        summarize(groups[h], h, attempts, None if h == baseline else base_rewards, found, extras)
        for h in view.rows
    ]
    mine = [t for h in view.rows for t in groups[h]]
    unmetered = plan.unmetered if view.axis == "harness" else frozenset()
    unisolated = plan.unisolated if view.axis == "harness" else frozenset()
    flags = dataset_flags(mine, view.rows, view.model, unmetered, unisolated, found)
    flags += [flag for row in rows if (flag := too_few_tasks(row)) is not None]
    without = shape_headline_less(view.shapes, named)
    if without:
        flags.append(no_headline_flag(without, plan.run_reward_key))
    left_out = {task: list(why) for task, why in sorted(found.left_out.items())}
    return DatasetReport(
        name, digest, tasks, attempts, rows, flags, view.title, view.axis,
        counted_tasks=sorted(found.counted), tasks_left_out=left_out,
    )  # fmt: skip


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
    needed = f"; about {plural(more, 'task')} would resolve a difference this size"
    return Flag(
        "too_few_tasks",
        row.harness,
        f"its difference from the baseline ({versus.diff:+.3f}, 95% CI {versus.low:+.3f} to"
        f" {versus.high:+.3f}, p={versus.p_value:.2f}) is not significant on"
        f" {plural(versus.n_tasks, 'shared task')}{needed}",
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
