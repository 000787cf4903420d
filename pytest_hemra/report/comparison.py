"""Two runs compared: each harness in the later run against itself in the earlier one.

The regression check after a harness upgrade (`hemra report RUN_A RUN_B`): per dataset both
runs evaluated, the paired difference of each shared harness's mean reward on the tasks both
runs scored, with its CI and p-value (one paired t-test, `stats.paired_difference`), and flags
for what makes the two runs unlike (dataset content, task sets, timeouts, the model, harness
versions).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from pytest_hemra.core.records import TrialRecord
from pytest_hemra.core.stored import StoredPlan
from pytest_hemra.core.terminal import fit_table, left_out_line, wrap_line
from pytest_hemra.core.words import plural
from pytest_hemra.report.fairness import Flag
from pytest_hemra.report.stats import Comparison, Estimate, mean_ci, paired_difference
from pytest_hemra.report.tables import by_task
from pytest_hemra.store import Store


@dataclass(frozen=True)
class HarnessChange:
    harness: str
    before: Estimate | None
    after: Estimate | None
    change: Comparison  # after - before, paired by task

    @property
    def is_regression(self) -> bool:
        return self.change.diff < 0 and self.change.is_significant


@dataclass(frozen=True)
class DatasetChange:
    name: str
    harnesses: list[HarnessChange]
    flags: list[Flag]


@dataclass(frozen=True)
class RunComparison:
    before: str
    after: str
    datasets: list[DatasetChange]

    @property
    def regressions(self) -> list[tuple[str, HarnessChange]]:
        return [(d.name, h) for d in self.datasets for h in d.harnesses if h.is_regression]


def compare_runs(store: Store, before_id: str, after_id: str) -> RunComparison:
    before, after = store.run(before_id), store.run(after_id)
    plan_a, plan_b = before.plan, after.plan
    trials_a, trials_b = store.trials(before_id), store.trials(after_id)
    datasets = []
    for name in [d for d in plan_b.datasets if d in plan_a.datasets]:
        flags = _run_flags(plan_a, plan_b, name)
        changes = []
        for cell in _shared_cells(plan_a, plan_b, trials_a, trials_b):
            harness = cell.partition("@")[0]  # a matrix run's cells are harness@model pairs
            rewards_a = by_task([t for t in trials_a if (t.dataset, t.cell) == (name, cell)])
            rewards_b = by_task([t for t in trials_b if (t.dataset, t.cell) == (name, cell)])
            if not rewards_a.keys() & rewards_b.keys():
                flags.append(
                    Flag("task_set", cell, "no task scored in both runs: nothing to compare")
                )
                continue
            change = paired_difference(rewards_b, rewards_a)
            changes.append(
                HarnessChange(
                    cell,
                    mean_ci(rewards_a) if rewards_a else None,
                    mean_ci(rewards_b) if rewards_b else None,
                    change,
                )
            )
            digest_a = plan_a.harnesses[harness].digest or ""
            digest_b = plan_b.harnesses[harness].digest or ""
            if digest_a != digest_b:
                flags.append(
                    Flag(
                        "harness_changed",
                        cell,
                        f"harness file changed ({digest_a[:12]} -> {digest_b[:12]})",
                    )
                )
            if change.only_a or change.only_b:
                flags.append(
                    Flag(
                        "task_set",
                        cell,
                        f"compared on {plural(change.n_tasks, 'shared task')}; {change.only_b}"
                        f" scored only before, {change.only_a} only after",
                    )
                )
        datasets.append(DatasetChange(name, changes, flags))
    return RunComparison(before_id, after_id, datasets)


def _shared_cells(
    plan_a: StoredPlan,
    plan_b: StoredPlan,
    trials_a: list[TrialRecord],
    trials_b: list[TrialRecord],
) -> list[str]:
    """The cells both runs have, in the later run's harness order: harnesses, or a matrix
    run's harness@model pairs (a cell of one run is compared with the same cell of the other)."""
    cells_a = {t.cell for t in trials_a}
    order = {h: i for i, h in enumerate(plan_b.harness_names)}
    cells = {t.cell for t in trials_b if t.cell in cells_a and t.harness in plan_a.harnesses}
    if not plan_a.models and not plan_b.models:  # one model: every shared harness, even unrun
        cells |= {h for h in plan_b.harness_names if h in plan_a.harnesses}
    return sorted(cells, key=lambda c: (order.get(c.partition("@")[0], len(order)), c))


def _run_flags(plan_a: StoredPlan, plan_b: StoredPlan, dataset: str) -> list[Flag]:
    flags = []
    if plan_a.datasets[dataset].digest != plan_b.datasets[dataset].digest:
        flags.append(Flag("dataset_changed", None, "the dataset's content differs between runs"))
    settings: tuple[tuple[str, str, object, object], ...] = (
        ("timeout_secs", "timeouts", plan_a.timeout_secs, plan_b.timeout_secs),
        ("model", "models", plan_a.model, plan_b.model),
        ("models", "model lists", plan_a.models, plan_b.models),
        ("attempts", "attempts", plan_a.attempts, plan_b.attempts),
    )
    for key, what, value_a, value_b in settings:
        if value_a != value_b:
            flags.append(Flag(key, None, f"different {what}: {value_a} before, {value_b} after"))
    return flags


def comparison_dict(comparison: RunComparison) -> dict[str, Any]:
    data = asdict(comparison)
    for dataset, source in zip(data["datasets"], comparison.datasets, strict=True):
        dataset["flags"] = [
            {"kind": f.kind, "harness": f.harness, "message": f.message} for f in source.flags
        ]
        for change, harness in zip(dataset["harnesses"], source.harnesses, strict=True):
            change["is_regression"] = harness.is_regression
    return data


# the columns a narrow terminal keeps, most important first (`core.terminal.fit_table`)
COMPARISON_COLUMNS = ("harness", "change [95% CI]", "verdict", "p", "after", "before", "tasks")


def render_comparison(
    comparison: RunComparison, fmt: str = "text", width: int | None = None
) -> str:
    """The comparison as text (fitting `width` columns; None: every column), markdown or JSON."""
    if fmt == "json":
        return json.dumps(comparison_dict(comparison), indent=2, sort_keys=True) + "\n"
    if fmt == "markdown":
        width = None
    tablefmt = "github" if fmt == "markdown" else "simple"
    header = f"HEMRA runs compared: {comparison.before} (before) -> {comparison.after} (after)"
    sections = [wrap_line(header, width)]
    dropped: dict[str, None] = {}
    for dataset in comparison.datasets:
        rows = [
            [
                change.harness,
                _estimate(change.before),
                _estimate(change.after),
                f"{change.change.diff:+.3f} [{change.change.low:+.3f}, {change.change.high:+.3f}]",
                f"{change.change.p_value:.3f}",
                change.change.n_tasks,
                "REGRESSION" if change.is_regression else "",
            ]
            for change in dataset.harnesses
        ]
        headers = ["harness", "before", "after", "change [95% CI]", "p", "tasks", "verdict"]
        fitted = fit_table(headers, rows, width, keep=COMPARISON_COLUMNS, tablefmt=tablefmt)
        dropped.update(dict.fromkeys(fitted.dropped))
        flags = "".join(f"\n{wrap_line(str(flag), width)}" for flag in dataset.flags)
        sections.append(f"\n{dataset.name}\n{fitted.text}{flags}")
    if dropped:
        sections.append("\n" + left_out_line(list(dropped), width))
    return "\n".join(sections)


def _estimate(estimate: Estimate | None) -> str:
    if estimate is None:
        return "-"
    return f"{estimate.mean:.3f} [{estimate.low:.3f}, {estimate.high:.3f}]"
