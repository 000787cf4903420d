"""Reports read only from the store: one table per dataset, every harness against the baseline."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from statistics import mean

from tabulate import tabulate

from pytest_hemra.output import SelfReport, disagrees
from pytest_hemra.records import TrialRecord
from pytest_hemra.store import Store
from pytest_hemra.trial import SCORED_OUTCOMES


@dataclass(frozen=True)
class HarnessRow:
    harness: str
    planned: int
    finished: int
    scored: int
    passes: int
    mean_reward: float | None
    mean_duration: float | None
    outcomes: dict[str, int]
    tokens: int
    cost: float | None  # None: some call's model has no known price
    own_tokens: int | None  # what the harness itself reported, where it reports


def summarize(trials: list[TrialRecord], harnesses: list[str]) -> list[HarnessRow]:
    by_harness: dict[str, list[TrialRecord]] = defaultdict(list)
    for trial in trials:
        by_harness[trial.harness].append(trial)
    rows = []
    for harness in harnesses:
        mine = [t for t in by_harness[harness] if t.status != "deselected"]
        finished = [t for t in mine if t.status == "finished"]  # cancelled ones are not
        scored = [t for t in finished if t.outcome in SCORED_OUTCOMES and t.reward is not None]
        durations = [t.duration for t in finished if t.duration is not None]
        outcomes: dict[str, int] = defaultdict(int)
        for trial in mine:
            if trial.outcome:
                outcomes[trial.outcome] += 1
        rows.append(
            HarnessRow(
                harness=harness,
                planned=len(mine),
                finished=len(finished),
                scored=len(scored),
                passes=sum(1 for t in scored if t.outcome == "pass"),
                mean_reward=mean(t.reward for t in scored if t.reward is not None)
                if scored
                else None,
                mean_duration=mean(durations) if durations else None,
                outcomes=dict(outcomes),
                tokens=sum(t.tokens for t in finished),
                own_tokens=sum(
                    SelfReport(**t.own_report).total_tokens for t in finished if t.own_report
                )
                if any(t.own_report for t in finished)
                else None,
                cost=None
                if any(t.cost is None for t in finished)
                else sum(t.cost or 0.0 for t in finished),
            )
        )
    return rows


def render_run(store: Store, run_id: str) -> str:
    """The terminal summary of a run: a table per dataset, the baseline first."""
    run = store.run(run_id)
    spec = run.spec["spec"]
    harnesses: list[str] = spec["harnesses"]
    baseline = spec.get("baseline") or harnesses[0]
    ordered = [baseline, *(h for h in harnesses if h != baseline)]
    trials = store.trials(run_id)
    sections = [f"HEMRA run {run.id} ({run.name}) - store {store.path}"]
    for dataset, entry in run.spec["datasets"].items():
        rows = summarize([t for t in trials if t.dataset == dataset], ordered)
        base = rows[0].mean_reward
        table = [
            [
                row.harness + (" (baseline)" if row.harness == baseline else ""),
                f"{row.finished}/{row.planned}",
                row.passes,
                _number(row.mean_reward),
                "" if row.harness == baseline else _delta(row.mean_reward, base),
                _number(row.mean_duration, "s"),
                row.tokens,
                "-" if row.own_tokens is None else row.own_tokens,
                "unknown" if row.cost is None else f"${row.cost:.4f}",
                ", ".join(f"{k} {v}" for k, v in sorted(row.outcomes.items())),
            ]
            for row in rows
        ]
        flags = [
            f"! {row.harness}: cost unknown: a model it called has no price in the table"
            for row in rows
            if row.cost is None
        ]
        flags += _model_flags([t for t in trials if t.dataset == dataset], spec.get("model"))
        sections.append(
            f"\n{dataset}@{entry['digest'][:12]} ({len(entry['tasks'])} tasks)\n"
            + tabulate(
                table,
                headers=[
                    "harness",
                    "trials",
                    "passes",
                    "mean reward",
                    "vs baseline",
                    "mean duration",
                    "tokens",
                    "own tokens",
                    "cost",
                    "outcomes",
                ],
            )
            + "".join(f"\n{flag}" for flag in flags)
        )
    return "\n".join(sections)


def _model_flags(trials: list[TrialRecord], model: str | None) -> list[str]:
    """Trials that spent tokens on other models than the run's, or were stopped by a limit."""
    flags = []
    for trial in trials:
        if model and trial.other_model_tokens and trial.tokens:
            share = trial.other_model_tokens / trial.tokens
            flags.append(
                f"! {trial.item_id}: {share:.0%} of its tokens went to other models than {model}"
            )
        if trial.stopped_by:
            flags.append(f"! {trial.item_id}: stopped by the {trial.stopped_by}")
        own = trial.own_report
        if own is not None and disagrees(SelfReport(**own), trial.tokens):
            flags.append(
                f"! {trial.item_id}: the harness reports {SelfReport(**own).total_tokens} tokens, "
                f"the gateway counted {trial.tokens}"
            )
    return flags


def _number(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value:.3f}{unit}" if not unit else f"{value:.2f}{unit}"


def _delta(value: float | None, base: float | None) -> str:
    return "-" if value is None or base is None else f"{value - base:+.3f}"
