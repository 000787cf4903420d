"""A closed run's report kept in the store and read back while nothing it was built from changed:
any write of one of its trials, another HEMRA, or a run still going builds it anew."""

from __future__ import annotations

import json
import math
import subprocess
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from pytest_hemra.core.lifecycle import RunStatus
from pytest_hemra.report import snapshot
from pytest_hemra.report.formats import render
from pytest_hemra.report.snapshot import report_of
from pytest_hemra.report.tables import RunReport
from pytest_hemra.store import Store
from tests.records import sql, trial_result
from tests.test_reports import record_run, result

FORMATS = ("text", "markdown", "csv", "json", "html")


def renders(report: RunReport) -> dict[str, str]:
    """Every format of a report, the text's line saying it was kept left out."""
    return {fmt: render(replace(report, kept_at=None), fmt) for fmt in FORMATS}


@pytest.mark.parametrize("where", ["sqlite", "postgres"])
def test_a_closed_runs_report_is_read_back_as_kept_until_one_of_its_trials_is_written(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    sqlite = str(tmp_path / "s.db")
    address = sqlite if where == "sqlite" else request.getfixturevalue("postgres_url")
    with Store(address) as store:
        record_run(
            store,
            "r",
            {"base": lambda task, attempt: result(1.0), "new": lambda task, attempt: result(0.0)},
        )
        assert store.run("r").status == RunStatus.FINISHED
        built = report_of(store, "r")
        assert built.kept_at is None
        kept = report_of(store, "r")
        assert kept.kept_at is not None  # read back, the same numbers in every format
        assert replace(kept, kept_at=None) == built
        assert renders(kept) == renders(built)
        assert "numbers: as kept at " in render(kept, "text")
        assert json.loads(render(kept, "json"))["kept_at"] == kept.kept_at

        # a resume runs one trial of `new` again, and it passes this time
        first = next(t for t in store.trials("r") if t.harness == "new")
        again = store.replace_trial(first.id, retry=False)
        store.finish_trial(again.id, trial_result(result(1.0)))
        rebuilt = report_of(store, "r")
        assert rebuilt.kept_at is None
        (row,) = [row for row in rebuilt.datasets[0].harnesses if row.harness == "new"]
        assert row.passes == 1
        assert report_of(store, "r").kept_at is not None  # the new one kept in turn


def test_a_run_still_going_is_built_every_time_and_never_kept(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as store:
        record_run(
            store,
            "r",
            {"base": lambda task, attempt: result(1.0), "new": lambda task, attempt: None},
        )
        assert store.run("r").status not in RunStatus.CLOSED
        assert [report_of(store, "r").kept_at for _ in range(2)] == [None, None]
        assert store.stored_report("r") is None
        for trial in [t for t in store.trials("r") if t.harness == "new"]:
            store.finish_trial(trial.id, trial_result(result(0.0)))
        rows = report_of(store, "r").datasets[0].harnesses
        assert [row.scored for row in rows if row.harness == "new"] == [16]  # finished since


def test_another_hemra_builds_the_report_anew(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Store(tmp_path / "s.db") as store:
        record_run(store, "r", {"base": lambda task, attempt: result(1.0)})
        report_of(store, "r")
        assert report_of(store, "r").kept_at is not None
        monkeypatch.setattr(snapshot, "code_digest", lambda: "another HEMRA's source")
        assert report_of(store, "r").kept_at is None
        assert report_of(store, "r").kept_at is not None


def test_hemra_report_says_its_numbers_were_kept(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as store:
        record_run(store, "r", {"base": lambda task, attempt: result(1.0)})
    command = ["hemra", "report", "r", "--store", str(tmp_path / "s.db")]
    first, second, rebuilt = (
        subprocess.run(arguments, capture_output=True, text=True, check=True, timeout=60)
        for arguments in (command, command, [*command, "--rebuild"])
    )
    assert "numbers: as kept at" not in first.stdout
    assert "numbers: as kept at" in second.stdout
    assert second.stdout.split("numbers: as kept at")[0] == first.stdout  # its last lines
    assert rebuilt.stdout == first.stdout  # built from every trial again


def test_a_kept_report_keeps_a_nan_and_one_that_does_not_read_is_built_anew(
    tmp_path: Path,
) -> None:
    with Store(tmp_path / "s.db") as store:
        record_run(store, "r", {"base": lambda task, attempt: result(1.0)})
        built = report_of(store, "r")
        (table,) = built.datasets
        row = table.harnesses[0]
        assert row.reward is not None
        odd = replace(row, reward=replace(row.reward, low=math.nan))
        with_nan = replace(built, datasets=[replace(table, harnesses=[odd])])
        key = snapshot.report_key(store, store.run("r"))
        store.store_report("r", key, json.dumps(asdict(with_nan)))
        read = report_of(store, "r")
        assert read.kept_at is not None
        reward = read.datasets[0].harnesses[0].reward
        assert reward is not None and math.isnan(reward.low)  # not null, not an error

        sql(store, "UPDATE reports SET body = '{\"run_id\": 1}'")  # not a report
        assert report_of(store, "r") == built
