"""A run recorded in a PostgreSQL store, its trials in real Docker sandboxes, read back by
`hemra show` and `hemra report` from their trial folders (`trials_dir`) and the database."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_hemra.cli import main
from pytest_hemra.core.store_location import redacted
from pytest_hemra.store import Store

pytestmark = pytest.mark.usefixtures("docker_test")

RUN_FILE = """\
name = "shared"
harnesses = ["oracle", "nop"]
baseline = "nop"
datasets = ["hemra-offline"]
tasks = ["create-file", "edit-config"]
"""


def _containers_of(docker_client: Any, run_id: str) -> list[str]:
    found = docker_client.containers.list(
        all=True, ignore_removed=True, filters={"label": f"hemra.run={run_id}"}
    )
    return [container.name for container in found]


def test_a_run_in_a_postgresql_store_is_read_back_by_show_and_report(
    pytester: pytest.Pytester,
    postgres_url: str,
    docker_client: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run_file = pytester.path / "run.toml"
    run_file.write_text(RUN_FILE + 'trials_dir = "shared/trials"\n')
    result = pytester.runpytest(
        "--hemra-run", str(run_file), "--hemra-store", postgres_url, "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=2, failed=2)

    store = Store(postgres_url)
    (run,) = store.runs()
    assert run.status == "finished"
    assert run.trials_dir == pytester.path / "shared" / "trials" / run.id  # beside the run file
    assert not (pytester.path / ".hemra").exists()  # nothing beside a store it does not have
    trials = store.trials(run.id)
    assert {(t.harness, t.outcome) for t in trials} == {("oracle", "pass"), ("nop", "fail")}
    oracle = next(t for t in trials if t.harness == "oracle")
    assert oracle.trial_dir is not None and Path(oracle.trial_dir).is_dir()
    assert _containers_of(docker_client, run.id) == []

    capsys.readouterr()
    monkeypatch.chdir(pytester.path.parent)  # anywhere: the store is named, not found
    assert main(["show", oracle.id, "--store", postgres_url]) == 0
    shown = capsys.readouterr().out
    assert oracle.id in shown and "pass" in shown
    assert main(["report", run.id, "--store", postgres_url, "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["run_id"] == run.id and report["status"] == "finished"
    assert report["store"] == redacted(postgres_url)  # a password, had it one, as ***
    monkeypatch.setenv("HEMRA_STORE", postgres_url)
    assert main(["runs"]) == 0
    assert run.id in capsys.readouterr().out


def test_a_postgresql_store_without_a_trials_folder_is_refused_and_nothing_is_recorded(
    pytester: pytest.Pytester, postgres_url: str
) -> None:
    run_file = pytester.path / "run.toml"
    run_file.write_text(RUN_FILE)
    result = pytester.runpytest(
        "--hemra-run", str(run_file), "--hemra-store", postgres_url, "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*key 'trials_dir' is required with a PostgreSQL store*"])
    assert Store(postgres_url).runs() == []
