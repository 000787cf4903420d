"""Messages a newcomer can act on, without Docker: one store every command finds (and says where
it looked), unknown names answered with the closest ones and what exists, malformed ids with
the form expected, and refused input exiting 4, whichever command refused it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pytest_hemra.cli import main
from pytest_hemra.core.records import PlannedTrial
from pytest_hemra.store import Store
from tests.records import trial_result
from tests.test_reports import result, spec

RUN_ID = "20261201-125726-3be5a2"


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The current folder, holding one finished run of two trials in its default store."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HEMRA_STORE", raising=False)
    store = Store(tmp_path / ".hemra" / "hemra.db")
    plan = [PlannedTrial("ds", "t", "a", 1), PlannedTrial("ds", "t", "b", 1)]
    store.record_plan(RUN_ID, "first", spec(["a", "b"]), tmp_path, plan)
    for trial in store.trials(RUN_ID):
        store.finish_trial(trial.id, trial_result(result(1.0)))
    return tmp_path


def hemra(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exit_:  # argparse's refusals
        code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_every_command_finds_the_current_folders_store_without_being_told(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = hemra(capsys, "runs", "-q")
    assert (code, out.split()) == (0, [RUN_ID])
    assert hemra(capsys, "report")[0] == 0
    code, out, _ = hemra(capsys, "show", f"{RUN_ID}.00001")
    assert code == 0 and out.startswith(f"trial {RUN_ID}.00001: ds::t[b-1]")


def test_hemra_store_names_another_store_and_a_missing_one_is_said_where(
    folder: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HEMRA_STORE", str(folder / "elsewhere.db"))
    code, _, err = hemra(capsys, "runs")
    assert code == 4
    assert f"no store at {folder}/elsewhere.db (from HEMRA_STORE)" in err
    code, _, err = hemra(capsys, "runs", "--store", str(folder / ".hemra" / "hemra.db"))
    assert code == 0  # --store wins over HEMRA_STORE
    monkeypatch.delenv("HEMRA_STORE")
    monkeypatch.chdir(folder / ".hemra")  # a folder with no store of its own
    code, _, err = hemra(capsys, "report")
    assert code == 4
    assert (
        f"no store at {folder}/.hemra/.hemra/hemra.db (the default store: .hemra/hemra.db in" in err
    )
    assert "--store PATH or HEMRA_STORE names another" in err


def test_a_run_id_not_in_the_store_is_answered_with_where_it_looked_and_its_runs(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = hemra(capsys, "report", "20261201-000000-abcdef")
    assert code == 4
    assert f"no run '20261201-000000-abcdef' in {folder}/.hemra/hemra.db (the default store" in err
    assert f"its latest runs: {RUN_ID}" in err
    code, _, err = hemra(capsys, "cancel", "yesterday")
    assert code == 4 and "'yesterday' is not a run id (expected YYYYMMDD-HHMMSS-xxxxxx" in err
    code, _, err = hemra(capsys, "report", RUN_ID, RUN_ID)
    assert code == 4 and "a run compared with itself" in err


def test_a_malformed_or_absent_trial_id_says_the_form_and_the_trials_there(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = hemra(capsys, "show", "3")
    assert code == 4 and "'3' is not a trial id (expected RUN_ID.NNNNN" in err
    code, _, err = hemra(capsys, "show", f"{RUN_ID}.00009")
    assert code == 4
    span = f"(its trials: {RUN_ID}.00000 to {RUN_ID}.00001)"
    assert f"no trial '{RUN_ID}.00009' in run {RUN_ID} {span}" in err


def test_mistyped_commands_and_choices_exit_4_with_the_closest_and_the_list(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = hemra(capsys, "rn")
    assert code == 4 and "no command named 'rn' (did you mean 'run' or 'runs'? known:" in err
    code, _, err = hemra(capsys, "runs", "--format", "yaml")
    assert code == 4 and "no choice named 'yaml' (known: json, table)" in err
    code, _, err = hemra(capsys, "run", "-H", "oracle", "-d", "x", "--concurrency", "0")
    assert code == 4 and "argument --concurrency: expected 1 or more, got 0" in err


def test_unknown_harness_and_dataset_names_get_the_closest_and_every_known_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """From a folder with no harnesses or datasets of its own (a real subprocess, then in this
    process): `hemra run` refuses either in one line on stderr, exit 4."""
    harness = subprocess.run(
        ["hemra", "run", "-H", "claud-code", "-d", "hemra-offline", "--dry-run"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert harness.returncode == 4, harness.stderr
    assert "no harness named 'claud-code' (did you mean 'claude-code'" in harness.stderr
    assert "known: aider, claude-code, claude-code-acp, codex, harbor-oracle," in harness.stderr
    monkeypatch.chdir(tmp_path)
    code, _, err = hemra(capsys, "run", "-H", "oracle", "-d", "hemra-ofline", "--dry-run")
    assert code == 4, err
    assert "no dataset named 'hemra-ofline' (did you mean 'hemra-offline'?" in err
    looked = err.strip().split("looked in ", 1)[1].split(", ")
    assert len(looked) == len(set(looked))  # each folder once
