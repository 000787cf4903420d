"""The `hemra` command line without Docker: `hemra runs` for scripts, the one table of override
flags that `hemra run` hands to the plugin, and a `hemra --help` that imports almost nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_hemra.cli import build_parser, main
from pytest_hemra.cli.running import pytest_argv
from pytest_hemra.core.records import PlannedTrial
from pytest_hemra.resolve.overrides import OVERRIDE_FLAGS
from pytest_hemra.store import Store
from tests.records import trial_result
from tests.test_reports import TASKS, result, spec


@pytest.fixture
def store(tmp_path: Path) -> Store:
    """Two runs: `old`, all finished; `busy`, one trial passed, one cancelled, one running,
    one queued and one left out by pytest's `-k`."""
    store = Store(tmp_path / "s.db")
    store.record_plan("old", "nightly", spec(["a"]), tmp_path, [PlannedTrial("ds", "t", "a", 1)])
    (old,) = store.trials("old")
    store.finish_trial(old.id, trial_result(result(1.0)))
    plan = [PlannedTrial("ds", task, "a", 1) for task in TASKS[:4]]
    plan.append(PlannedTrial("ds", TASKS[4], "b", 1))
    store.record_plan("busy", "busy", spec(["a", "b"]), tmp_path, plan, status="queued")
    passed, cancelled, running, _queued, deselected = store.trials("busy")
    store.finish_trial(passed.id, trial_result(result(1.0)))
    store.cancel_trials([cancelled.id], "asked")
    store.claim(running.id, "gw0@host:1", 30)
    store.deselect_trials("busy", [deselected.item_id])
    return store


def test_a_run_waiting_for_its_engine_is_listed_waiting_and_for_which_engine(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    running = next(t for t in store.trials("busy") if t.status == "running")
    down = {"engine": "tcp://box2:2375", "error": "Connection refused"}
    store.record_event("busy", running.id, "engine_down", down)
    assert main(["runs", "--store", str(store.path), "--format", "json"]) == 0
    busy = json.loads(capsys.readouterr().out)[1]
    assert busy["status"] == "waiting"
    assert [(w["engine"], w["trials"], w["error"]) for w in busy["waiting"]] == [
        ("tcp://box2:2375", 1, "Connection refused")
    ]
    assert main(["runs", "--store", str(store.path)]) == 0
    assert " waiting for engine tcp://box2:2375 " in capsys.readouterr().out.splitlines()[-1]
    store.record_event("busy", running.id, "engine_back", {**down, "waited": 2.5, "removed": 1})
    assert main(["runs", "--store", str(store.path), "--format", "json"]) == 0
    busy = json.loads(capsys.readouterr().out)[1]
    assert (busy["status"], busy["waiting"]) == ("running", [])


def test_runs_as_json_lists_each_run_with_the_tables_counts(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["runs", "--store", str(store.path), "--format", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [run["id"] for run in listed] == ["old", "busy"]
    busy = listed[1]
    assert {key: busy[key] for key in busy if key != "created_at"} == {
        "id": "busy",
        "name": "busy",
        "status": "running",
        "done": 2,
        "trials": 4,
        "running": 1,
        "queued": 1,
        "cancelled": 1,
        "left": 3,  # without a result: running, queued, cancelled
        "harnesses": ["a", "b"],
        "datasets": ["ds"],
        "waiting": [],
    }
    assert listed[0]["done"] == listed[0]["trials"] == 1


def test_runs_quiet_prints_one_run_id_a_line(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["runs", "--store", str(store.path), "-q"]) == 0
    assert capsys.readouterr().out == "old\nbusy\n"


def test_runs_table_is_unchanged_by_the_other_forms(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["runs", "--store", str(store.path)]) == 0
    header, _rule, old, busy = capsys.readouterr().out.splitlines()
    assert header.split() == [
        "run", "name", "status", "done", "running", "queued", "cancelled", "harnesses", "datasets"
    ]  # fmt: skip
    assert busy.split()[:7] == ["busy", "busy", "running", "2/4", "1", "1", "1"]
    assert old.split()[3] == "1/1"


def test_every_override_flag_of_hemra_run_reaches_its_plugin_option() -> None:
    words: list[str] = []
    for flag in OVERRIDE_FLAGS:
        words += [flag.flags[0], "3" if flag.type is not str else f"{flag.field}-value"]
    args = build_parser().parse_args(["run", *words])
    args.pytest_args = []
    argv = pytest_argv(args)
    for flag in OVERRIDE_FLAGS:
        value = "3" if flag.type is not str else f"{flag.field}-value"
        assert argv[argv.index(flag.option) + 1] == value


def test_help_imports_no_heavy_module() -> None:
    """`hemra --help` builds every command's parser; what a command needs loads in its handler."""
    heavy = ["docker", "aiohttp", "scipy", "pydantic", "sqlite_utils", "jinja2", "tabulate"]
    heavy += ["pytest", "pytest_hemra.plugin", "pytest_hemra.store"]
    probe = (
        "import sys; from pytest_hemra.cli import build_parser; build_parser();"
        f" print([name for name in {heavy!r} if name in sys.modules])"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert loaded.strip() == "[]"
