"""`hemra calibrate`: a judge against anchors with known scores, offline with the scripted model,
and the report's flag for a judge never calibrated or drifted."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from pytest_hemra.core.errors import SpecError
from pytest_hemra.core.records import PlannedTrial
from pytest_hemra.report.formats import render
from pytest_hemra.report.tables import build_report
from pytest_hemra.resolve.datasets import bundled_dir
from pytest_hemra.score.calibration import load_anchors
from pytest_hemra.store import Store
from tests.records import sql

EXPECTED = {"none": 0.0, "some": 0.4, "most": 0.8, "all": 1.0}


def anchor_file(path: Path, points_off: float) -> Path:
    """Anchors whose scripted judge scores `points_off` points (of 5) above the expected."""
    anchors = [
        {
            "id": name,
            "instruction": "Do the task.",
            "diff": "" if expected == 0 else f"+line {name}\n",
            "expected": expected,
            "scripted": f"Judged.\nSCORE: {min(1.0, expected + points_off / 5):g}",
        }
        for name, expected in EXPECTED.items()
    ]
    path.write_text(json.dumps({"rubric": "correctness", "anchors": anchors}))
    return path


def calibrate(pytester: pytest.Pytester, anchors: Path, store: Path) -> pytest.RunResult:
    return pytester.run(
        "hemra", "calibrate", "--judge", "correctness", "--model", "hemra/scripted",
        "--anchors", str(anchors), "--store", str(store),
    )  # fmt: skip


def test_scores_equal_to_the_anchors_are_reliable_and_two_points_off_drift(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    store = tmp_path / "s.db"
    exact = calibrate(pytester, anchor_file(tmp_path / "exact.json", 0), store)
    assert exact.ret == 0
    exact.stdout.fnmatch_lines(
        ["judge correctness on hemra/scripted: mean absolute error 0.000 over 4 anchors*: reliable"]
    )
    off = calibrate(pytester, anchor_file(tmp_path / "off.json", 2), store)
    assert off.ret == 1
    # +0.4 on every anchor, but clamped at 1: (0.4 + 0.4 + 0.2 + 0) / 4
    off.stdout.fnmatch_lines(["*mean absolute error 0.250 over 4 anchors*: drift"])
    rows = sql(Store(store), "SELECT mae, reliable FROM calibrations ORDER BY id")
    assert [tuple(r) for r in rows] == [(0.0, 1), (0.25, 0)]


def test_the_bundled_diff_judge_is_found_wanting_on_the_bundled_anchors(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    # the scripted judge scores 1 for any change: wrong files and deleted tests included
    result = pytester.run(
        "hemra", "calibrate", "--judge", "correctness", "--model", "hemra/scripted",
        "--store", str(tmp_path / "s.db"),
    )  # fmt: skip
    assert result.ret == 1
    result.stdout.fnmatch_lines(["tests-deleted*0*1*", "*error 0.417 over 6 anchors*: drift"])


def test_a_run_judged_by_an_uncalibrated_or_drifted_judge_is_flagged(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    rubric = (bundled_dir("judges") / "correctness.md").read_text()
    judge = {"name": "correctness", "rubric": rubric, "model": "m", "command": None}
    spec = {
        "spec": {"harnesses": ["h"], "baseline": "h", "model": "m", "attempts": 1},
        "datasets": {"ds": {"digest": "d" * 64, "path": "/ds", "tasks": ["t"]}},
        "harnesses": {"h": {"digest": "h" * 64}},
        "judges": [judge],
    }
    store.record_plan("r", "r", spec, tmp_path, [PlannedTrial("ds", "t", "h", 1)])
    assert "! judge correctness was not calibrated against m (hemra calibrate)" in render(
        build_report(store, "r"), "text"
    )
    digest = hashlib.sha256(rubric.encode()).hexdigest()
    row = {"judge": "correctness", "model": "m", "rubric_digest": digest, "anchors": 6}
    store.record_calibration({**row, "mae": 0.4, "threshold": 0.15, "reliable": 0})
    text = render(build_report(store, "r"), "text")
    assert "! judge correctness drifted against m: mean absolute error 0.40 > 0.15" in text
    store.record_calibration({**row, "mae": 0.05, "threshold": 0.15, "reliable": 1})
    assert "judge correctness" not in render(build_report(store, "r"), "text")


def test_anchor_files_are_checked(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps({"anchors": [{"id": "a", "instruction": "", "diff": "", "expected": 2}]})
    )
    with pytest.raises(
        SpecError, match=r"bad.json: key 'anchors\[0\].expected': expected a number"
    ):
        load_anchors(bad)
    bad.write_text(json.dumps({"anchors": []}))
    with pytest.raises(SpecError, match="key 'anchors': expected a non-empty list"):
        load_anchors(bad)
    assert len(load_anchors(bundled_dir("judges") / "anchors" / "correctness.json")) == 6
