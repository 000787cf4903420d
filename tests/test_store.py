"""The store: WAL mode, the plan recorded in one transaction, results kept."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from pytest_hemra.records import PlannedTrial
from pytest_hemra.store import Store

PLAN = [PlannedTrial("ds", "t", "h", 1), PlannedTrial("ds", "t", "h", 2)]


def test_plan_is_recorded_with_its_jobs(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    store.record_plan("r1", "run", {"spec": {}}, tmp_path, PLAN)
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert [t.item_id for t in store.trials("r1")] == ["ds::t[h-1]", "ds::t[h-2]"]
    assert store.count("jobs") == 2 and store.count("runs") == 1
    assert store.run("r1").spec == {"spec": {}}


def test_a_failed_record_leaves_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    store.record_plan("r1", "run", {}, tmp_path, PLAN)
    with pytest.raises(sqlite3.IntegrityError):
        store.record_plan("r1", "again", {}, tmp_path, PLAN)  # same run id: refused whole
    assert store.count("runs") == 1 and store.count("trials") == 2 and store.count("jobs") == 2
    assert store.count("events") == 1


def test_finished_trial_closes_its_job_and_the_run(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    store.record_plan("r1", "run", {}, tmp_path, PLAN[:1])
    (trial,) = store.trials("r1")
    store.start_trial(trial.id, "w")
    assert store.run("r1").status == "running"
    store.finish_trial(
        trial.id,
        {
            "outcome": "pass",
            "reward": 1.0,
            "rewards": {"reward": 1.0},
            "exit_code": 0,
            "error": None,
            "finished_at": 1.0,
            "duration": 0.5,
            "phases": {},
            "trial_dir": "x",
        },
    )
    (done,) = store.trials("r1")
    assert done.is_finished and done.outcome == "pass" and done.rewards == {"reward": 1.0}
    assert store.run("r1").status == "finished"
    assert store.db.execute("SELECT state FROM jobs").fetchone()[0] == "done"
