"""`hemra calibrate`: a judge scored against anchors whose right scores are known.

An anchor file is JSON: `{"rubric": NAME, "anchors": [{"id", "instruction", "diff", "expected",
"output"?, "scripted"?}]}`, expected scores in [0, 1]. The judge scores every anchor as it would
a trial; the mean absolute error against the expected scores says whether it can be trusted:
past the threshold (0.15) it is marked `drift`. Results are kept in the store, per judge rubric
(by digest) and model, and a run whose judge was never calibrated against its model, or
drifted, is flagged in its report. `scripted` is the reply the scripted model gives for that
anchor, so calibration itself can be checked offline.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_hemra.core.errors import SpecError
from pytest_hemra.execute.gateway.server import Gateway
from pytest_hemra.resolve.datasets import bundled_dir
from pytest_hemra.resolve.judges import Judge
from pytest_hemra.score.judges import Material, run_judge

DRIFT_THRESHOLD = 0.15


@dataclass(frozen=True)
class Anchor:
    id: str
    instruction: str
    diff: str
    expected: float
    output: str = ""
    scripted: str | None = None


@dataclass(frozen=True)
class AnchorResult:
    anchor: str
    expected: float
    score: float | None
    error: str | None


@dataclass(frozen=True)
class Calibration:
    judge: str
    model: str
    rubric_digest: str
    mae: float
    anchors: int
    threshold: float
    results: list[AnchorResult]

    @property
    def reliable(self) -> bool:
        return self.mae <= self.threshold

    @property
    def verdict(self) -> str:
        return "reliable" if self.reliable else "drift"


def bundled_anchors(rubric: str) -> Path | None:
    path = bundled_dir("judges") / "anchors" / f"{rubric}.json"
    return path if path.is_file() else None


def load_anchors(path: Path) -> list[Anchor]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise SpecError(f"{path}: not a readable JSON anchor file ({error})") from None
    entries = data.get("anchors") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise SpecError(f"{path}: key 'anchors': expected a non-empty list of anchors")
    anchors = []
    for index, entry in enumerate(entries):
        where = f"{path}: key 'anchors[{index}]"
        if not isinstance(entry, dict):
            raise SpecError(f"{where}': expected a table")
        unknown = sorted(
            set(entry) - {"id", "instruction", "diff", "expected", "output", "scripted"}
        )
        if unknown:
            raise SpecError(f"{where}.{unknown[0]}': not an anchor key")
        for key in ("id", "instruction", "diff"):
            if not isinstance(entry.get(key), str):
                raise SpecError(f"{where}.{key}': expected a string")
        expected = entry.get("expected")
        if (
            not isinstance(expected, int | float)
            or isinstance(expected, bool)
            or not 0 <= expected <= 1
        ):
            raise SpecError(f"{where}.expected': expected a number in [0, 1], got {expected!r}")
        anchors.append(
            Anchor(
                entry["id"],
                entry["instruction"],
                entry["diff"],
                float(expected),
                str(entry.get("output") or ""),
                entry.get("scripted"),
            )
        )
    return anchors


def calibrate(
    judge: Judge,
    anchors: list[Anchor],
    gateway: Gateway | None,
    keys: dict[str, str],
    threshold: float = DRIFT_THRESHOLD,
) -> Calibration:
    results = []
    with tempfile.TemporaryDirectory(prefix="hemra-calibrate-") as scratch:
        for anchor in anchors:
            seen = Material(
                anchor.instruction,
                anchor.diff,
                anchor.output,
                None,
                Path(scratch) / anchor.id,
                scripted_reply=anchor.scripted,
            )
            seen.trial_dir.mkdir(parents=True, exist_ok=True)
            judgment = run_judge(
                judge,
                seen,
                gateway=gateway,
                trial_id=f"calibrate:{judge.name}",
                run_id="calibrate",
                keys=keys,
                run_model=None,
            )
            results.append(AnchorResult(anchor.id, anchor.expected, judgment.score, judgment.error))
    # a judge that gives no score is as wrong as can be on that anchor
    errors = [
        abs(r.score - r.expected) if r.score is not None else max(r.expected, 1 - r.expected)
        for r in results
    ]
    mae = sum(errors) / len(errors)
    return Calibration(
        judge.name,
        judge.model or "(program)",
        judge.rubric_digest,
        round(mae, 6),
        len(results),
        threshold,
        results,
    )


def calibration_row(calibration: Calibration) -> dict[str, Any]:
    return {
        "judge": calibration.judge,
        "model": calibration.model,
        "rubric_digest": calibration.rubric_digest,
        "mae": calibration.mae,
        "anchors": calibration.anchors,
        "threshold": calibration.threshold,
        "reliable": int(calibration.reliable),
    }
