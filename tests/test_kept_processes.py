"""Tasks whose tests need what the agent left running: `[hemra] keep_agent_processes` keeps the
agent's processes for its verifier (flagged), the run file can say otherwise, a failed trial whose
listening processes the clean room killed says so, and `hemra check` finds such a task."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO
from pytest_hemra.report.formats import render
from pytest_hemra.report.tables import build_report
from pytest_hemra.resolve.datasets import bundled_dir
from pytest_hemra.store import Store

WORKER = bundled_dir("datasets") / "harbor-features" / "worker-alive"


@pytest.fixture
def hemra(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """`hemra ARGS` in a subprocess, importing this checkout's HEMRA."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    monkeypatch.setenv("PYTHONPATH", path)

    def run(*args: str) -> pytest.RunResult:
        return pytester.run("hemra", *args, timeout=300)

    return run


def _without_key(tmp_path: Path) -> Path:
    """The bundled worker task in a dataset of its own, without the key that keeps its worker."""
    folder = tmp_path / "datasets" / "ds" / "worker"
    shutil.copytree(WORKER, folder)
    toml = (folder / "task.toml").read_text()
    (folder / "task.toml").write_text(toml.replace("keep_agent_processes = true", ""))
    return folder.parent


def _worker_run(
    pytester: pytest.Pytester, tmp_path: Path, harnesses: str, more: str
) -> tuple[pytest.RunResult, Store, Any]:
    """`harnesses` on harbor-features' worker-alive, `more` added to the run file: the session,
    its store and its run."""
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        f'harnesses = {harnesses}\ndatasets = ["harbor-features"]\ntasks = ["worker-alive"]\n'
        + more
    )
    store_path = tmp_path / "s.db"
    result = pytester.runpytest("--hemra-run", str(run_file), "--hemra-store", str(store_path))
    store = Store(store_path)
    (run,) = store.runs()
    return result, store, run


@pytest.mark.usefixtures("docker_test")
def test_a_kept_worker_answers_its_verifier_and_the_trial_is_flagged(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    _, store, run = _worker_run(pytester, tmp_path, '["oracle", "nop"]', "")
    trials = {t.harness: t for t in store.trials(run.id)}
    assert (trials["oracle"].outcome, trials["oracle"].kept_processes) == ("pass", True)
    assert (trials["nop"].outcome, trials["nop"].kept_processes) == ("fail", True)
    (table,) = build_report(store, run.id).datasets
    assert any(flag.kind == "processes_kept" for flag in table.flags)
    shown = render(build_report(store, run.id), "json")
    assert "processes_kept" in shown


@pytest.mark.usefixtures("docker_test")
def test_a_run_that_keeps_none_fails_the_task_saying_which_port_the_clean_room_killed(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    result, store, run = _worker_run(
        pytester, tmp_path, '["oracle"]', "[verifier]\nkeep_agent_processes = false\n"
    )
    (trial,) = store.trials(run.id)
    assert (trial.outcome, trial.kept_processes) == ("fail", False)
    assert "listening on port 8765" in (trial.error or "")
    assert "keep_agent_processes = true" in (trial.error or "")
    result.stdout.fnmatch_lines(["*fail (reward 0): the clean room killed*port 8765*"])


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
def test_check_finds_a_task_whose_oracle_passes_only_with_its_processes_kept(
    hemra: Callable[..., pytest.RunResult], tmp_path: Path
) -> None:
    dataset = _without_key(tmp_path)
    checked = hemra("check", str(dataset), "--store", str(tmp_path / "s.db"), "--format", "json")
    assert checked.ret == 1, checked.errlines[-20:]
    found = json.loads(checked.stdout.str())
    (task,) = found["tasks"]
    assert task["verdicts"] == ["needs_processes"]
    assert "keep_agent_processes = true" in task["notes"][0]


@pytest.mark.parametrize(
    ("run_toml", "expected"),
    [
        (
            '[verifier]\nenvironment_mode = "separate"\n',
            "harbor-features::worker-alive keeps the agent's processes for its verifier, but is"
            " verified in a separate room",
        ),
        (
            '[verifier]\nkeep_agent_processes = ["harbor-features::nope"]\n',
            "key 'verifier.keep_agent_processes': 'harbor-features::nope' is not a dataset",
        ),
    ],
)
def test_keeping_processes_where_it_cannot_be_done_is_refused_at_resolve(
    hemra: Callable[..., pytest.RunResult], tmp_path: Path, run_toml: str, expected: str
) -> None:
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        'harnesses = ["oracle"]\ndatasets = ["harbor-features"]\ntasks = ["worker-alive"]\n'
        + run_toml
    )
    refused = hemra("run", str(run_file), "--store", str(tmp_path / "s.db"))
    assert refused.ret == 4
    assert expected in refused.stderr.str() + refused.stdout.str()
    assert not (tmp_path / "s.db").exists() or not Store(tmp_path / "s.db").runs()
