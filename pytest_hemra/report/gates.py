"""Exit gates: which finished runs count as a failure for CI (`--hemra-fail-on`).

`unfinished`: a cell without a result (infra or verifier error, cancelled, never run).
`failure`: any scored trial short of a pass (a verifier_error too). `score<X` /
`HARNESS:score<X`: a harness's mean reward over its scored trials below X, on the tasks its
tables count (`taskset.py`). `regression`: a harness significantly worse than the baseline
(paired over tasks, p < 0.05), or than itself in the run given by `--hemra-compare`.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_hemra.core.errors import SpecError
from pytest_hemra.core.lifecycle import TrialStatus
from pytest_hemra.core.outcome import Outcome
from pytest_hemra.core.records import TrialRecord
from pytest_hemra.core.words import plural
from pytest_hemra.report.taskset import one_task_set

if TYPE_CHECKING:  # a gate is parsed before the session starts: the report's stack after it
    from pytest_hemra.report.comparison import RunComparison
    from pytest_hemra.report.tables import RunReport

SCORE = re.compile(r"^(?:(?P<harness>[A-Za-z0-9_.-]+):)?score<(?P<threshold>[0-9.]+)$")
KINDS = ("unfinished", "failure", "regression")


@dataclass(frozen=True)
class Gate:
    kind: str  # unfinished, failure or score
    harness: str | None = None
    threshold: float = 0.0


def parse_gate(text: str, source: str = "--hemra-fail-on") -> Gate:
    text = text.strip()
    if text in KINDS:
        return Gate(text)
    found = SCORE.match(text.replace(" ", ""))
    if found:
        try:
            return Gate("score", found["harness"], float(found["threshold"]))
        except ValueError:
            pass
    raise SpecError(
        f"{source}: expected 'unfinished', 'failure', 'regression', 'score<X' or"
        f" 'HARNESS:score<X', got {text!r}"
    )


def tripped(
    gates: Sequence[Gate],
    trials: Sequence[TrialRecord],
    report: RunReport | None = None,
    comparison: RunComparison | None = None,
) -> list[str]:
    """Why the run fails its gates: one line per tripped gate, empty when it passes."""
    counted = [t for t in trials if t.status != TrialStatus.DESELECTED]
    reasons: list[str] = []
    for gate in gates:
        if gate.kind == "regression":
            reasons += _regressions(report, comparison)
        elif gate.kind == "unfinished":
            missing = [t for t in counted if not t.is_finished or t.outcome in Outcome.UNFINISHED]
            if missing:
                outcomes = sorted({t.outcome or t.status for t in missing})
                without = f"{plural(len(missing), 'trial')} without a result"
                reasons.append(f"{without} ({', '.join(outcomes)})")
        elif gate.kind == "failure":
            failed = [
                t for t in counted if t.outcome in Outcome.SCORED and t.outcome != Outcome.PASS
            ]
            if failed:
                reasons.append(f"{plural(len(failed), 'scored trial')} did not pass")
        else:
            left_out = _left_out(counted)
            for harness in sorted({t.harness for t in counted}):
                if gate.harness not in (None, harness):
                    continue
                rewards = [
                    t.reward or 0.0
                    for t in counted
                    if t.harness == harness
                    and t.outcome in Outcome.SCORED
                    and (t.dataset, t.task) not in left_out
                ]
                mean = sum(rewards) / len(rewards) if rewards else 0.0
                if mean < gate.threshold:
                    reasons.append(f"{harness}: mean reward {mean:.3f} < {gate.threshold:g}")
            if gate.harness is not None and gate.harness not in {t.harness for t in counted}:
                reasons.append(f"{gate.harness}: no trials in this run")
    return reasons


def _left_out(trials: Sequence[TrialRecord]) -> set[tuple[str, str]]:
    """(dataset, task) pairs left out of every harness's numbers (`taskset.py`): a `score<X`
    gate reads a harness's mean over the same tasks as its table."""
    found: set[tuple[str, str]] = set()
    for dataset in {t.dataset for t in trials}:
        rows: dict[str, list[TrialRecord]] = defaultdict(list)
        for trial in trials:
            if trial.dataset == dataset:
                rows[f"{trial.harness} {trial.model or ''}"].append(trial)
        found |= {(dataset, task) for task in one_task_set(rows, list(rows), 1).left_out}
    return found


def _regressions(report: RunReport | None, comparison: RunComparison | None) -> list[str]:
    reasons = []
    for dataset in report.datasets if report else []:
        for row in dataset.harnesses:
            versus = row.versus
            if versus is not None and versus.diff < 0 and row.is_significant:
                reasons.append(
                    f"{row.harness} on {dataset.name}: {versus.diff:+.3f} vs the baseline"
                    f" (p={versus.p_value:.3f})"
                )
    if comparison is not None:
        for name, change in comparison.regressions:
            reasons.append(
                f"{change.harness} on {name}: {change.change.diff:+.3f} vs run"
                f" {comparison.before} (p={change.change.p_value:.3f})"
            )
    return reasons
