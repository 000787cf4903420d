"""The harbor harness kind: Harbor itself runs the trials, supervised and imported by HEMRA."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import TaskMaker
from pytest_hemra.execute.kinds.harbor.result import HarborTrialResult, classify
from pytest_hemra.store import Store

HARBOR = 'kind = "harbor"\npackage = "pypi:harbor==0.26.0"\n'


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
def test_harbor_oracle_passes_offline_tasks_imported_under_the_run(
    pytester: pytest.Pytester, tmp_path: Path, docker_client: Any
) -> None:
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        'harnesses = ["harbor-oracle"]\ndatasets = ["hemra-offline"]\n'
        'tasks = ["create-file", "fix-test"]\nconcurrency = 2\n'
        'trust_unisolated = ["harbor-oracle"]\n'
    )
    result = pytester.runpytest("--hemra-run", str(run_file))  # builds the runner if missing
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*harbor-oracle*2/2*", "! harbor-oracle: tokens not counted*"])
    store = Store(pytester.path / ".hemra" / "hemra.db")
    (run,) = store.runs()
    trials = store.trials(run.id)
    assert sorted(t.task for t in trials) == ["create-file", "fix-test"]
    for trial in trials:
        assert (trial.outcome, trial.reward, trial.tokens) == ("pass", 1.0, 0)
        folder = Path(trial.trial_dir or "")
        harbor = json.loads((folder / "harbor" / "result.json").read_text())
        assert harbor["verifier_result"]["rewards"] == {"reward": 1.0}
        assert (folder / "harbor-job" / "job.log").is_file()  # the Harbor job's own log
        assert json.loads((folder / "result.json").read_text())["outcome"] == "pass"
    board = store.shared_board(run.id, "harbor")
    (job,) = board.jobs  # one Harbor job for the harness and dataset
    assert job["tasks"] == {"create-file": 1, "fix-test": 1} and job["ended"] == "exited 0"
    assert sorted(board.claims.values()) == sorted(t.id for t in trials)
    left = {"label": f"hemra.run={run.id}"}
    assert docker_client.networks.list(filters=left) == []
    projects = [Path(key).name.lower() for key in board.claims]  # compose project prefixes
    built = docker_client.images.list(filters={"label": "com.docker.compose.project"})
    assert not [
        image.tags
        for image in built
        if any(image.labels["com.docker.compose.project"].startswith(p) for p in projects)
    ]


@pytest.mark.usefixtures("docker_test")
def test_a_job_harbor_refuses_ends_its_trials_as_infra_errors_in_its_words(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[..., Path],
) -> None:
    make_task("one")
    make_task("two")
    write_harness("mine", HARBOR + 'agent = "no-such-agent"\n')
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["mine"]\ndatasets = ["ds"]\ntrust_unisolated = ["mine"]\n')
    result = pytester.runpytest("--hemra-run", str(run_file))
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(
        ["*infra_error*Harbor job mine__ds__1 exited 1 with no result*Agent name no-such-agent*"]
    )
    store = Store(pytester.path / ".hemra" / "hemra.db")
    (run,) = store.runs()
    board = store.shared_board(run.id, "harbor")
    assert [job["name"] for job in board.jobs] == ["mine__ds__1"]  # no job per task after it


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (HARBOR, "*key 'agent' is required for a harbor harness*"),
        ('kind = "harbor"\nagent = "oracle"\n', "*key 'package': a harbor harness names*"),
        (HARBOR + 'agent = "oracle"\ncommand = ["x"]\n', "*key 'command' does not apply*"),
        ('kind = "program"\ncommand = ["x"]\nagent = "oracle"\n', "*only to a harbor harness*"),
    ],
)
def test_a_malformed_harbor_harness_is_refused_and_nothing_recorded(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[..., Path],
    content: str,
    expected: str,
) -> None:
    make_task("one")
    write_harness("mine", content)
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["mine"]\ndatasets = ["ds"]\ntrust_unisolated = ["mine"]\n')
    result = pytester.runpytest("--hemra-run", str(run_file))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: *mine.toml: {expected}"])
    assert not (pytester.path / ".hemra").exists()


@pytest.mark.usefixtures("docker_test")
def test_a_harbor_release_that_cannot_be_installed_refuses_the_run(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Harbor's wheels come first: with no package index it fails at once, nothing recorded."""
    empty = tmp_path / "no-index"
    empty.mkdir()
    for name, value in {
        "HEMRA_CACHE_DIR": str(tmp_path / "cache"),
        "PIP_INDEX_URL": empty.as_uri(),
        "PIP_EXTRA_INDEX_URL": "",
        "PIP_FIND_LINKS": "",
        "PIP_CONFIG_FILE": "/dev/null",
    }.items():
        monkeypatch.setenv(name, value)
    make_task("one")
    write_harness("mine", 'kind = "harbor"\npackage = "pypi:harbor==0.0.1"\nagent = "oracle"\n')
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["mine"]\ndatasets = ["ds"]\ntrust_unisolated = ["mine"]\n')
    result = pytester.runpytest("--hemra-run", str(run_file))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: *mine.toml: installing pypi:harbor==0.0.1: pip download harbor==0.0.1 failed*"]
    )
    assert not (pytester.path / ".hemra").exists()


def _result(**changes: Any) -> HarborTrialResult:
    data: dict[str, Any] = {
        "trial_name": "t__abc",
        "config": {"task": {"path": "/data/ds/t"}},
        "started_at": "2026-01-01T00:00:00Z",
        "finished_at": "2026-01-01T00:00:09Z",
        "agent_execution": {
            "started_at": "2026-01-01T00:00:02Z",
            "finished_at": "2026-01-01T00:00:05Z",
        },
        "verifier": {"started_at": "2026-01-01T00:00:05Z", "finished_at": "2026-01-01T00:00:07Z"},
        "verifier_result": {"rewards": {"reward": 1.0}},
        **changes,
    }
    return HarborTrialResult.model_validate(data)


def _failure(kind: str, at: str) -> dict[str, str]:
    return {"exception_type": kind, "exception_message": "boom\nmore", "occurred_at": at}


@pytest.mark.parametrize(
    ("changes", "outcome", "reward"),
    [
        ({}, "pass", 1.0),
        ({"verifier_result": {"rewards": {"reward": 0.25, "checks": 1.0}}}, "fail", 0.25),
        ({"verifier_result": {"rewards": {"score": 0.0}}}, "fail", 0.0),  # its only value
        ({"verifier_result": None}, "verifier_error", None),
        # several keys and none the headline: the lowest (a pass needs every key at 1)
        ({"verifier_result": {"rewards": {"a": 1.0, "b": 0.0}}}, "fail", 0.0),
        ({"verifier_result": {"rewards": {"a": 1.0, "b": 1.0}}}, "pass", 1.0),
        (
            {"exception_info": _failure("AgentTimeoutError", "2026-01-01T00:00:05Z")},
            "timeout",
            1.0,
        ),
        (
            {"exception_info": _failure("NonZeroAgentExitCodeError", "2026-01-01T00:00:05Z")},
            "harness_error",
            1.0,
        ),
        (
            {"exception_info": _failure("RuntimeError", "2026-01-01T00:00:03Z")},
            "harness_error",
            1.0,
        ),
        (
            {"exception_info": _failure("RewardFileNotFoundError", "2026-01-01T00:00:06Z")},
            "verifier_error",
            None,
        ),
        (
            {
                "agent_execution": None,
                "verifier": None,
                "verifier_result": None,
                "exception_info": _failure("HealthcheckError", "2026-01-01T00:00:01Z"),
            },
            "infra_error",
            None,
        ),
        (  # a failure after the verifier (say, in teardown) leaves the reward standing
            {"exception_info": _failure("RuntimeError", "2026-01-01T00:00:08Z")},
            "pass",
            1.0,
        ),
    ],
)
def test_harbor_results_map_onto_outcomes(
    changes: dict[str, Any], outcome: str, reward: float | None
) -> None:
    found = classify(_result(**changes))
    assert (found[0], found[1]) == (outcome, reward)
    if "exception_info" in changes:
        assert found[3] == f"Harbor: {changes['exception_info']['exception_type']}: boom"


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_a_harbor_reward_that_is_not_finite_is_a_verifier_error(bad: float) -> None:
    # a malformed reward, as NaN in reward.txt is, whatever else happened: never a report's input
    for changes in (
        {"verifier_result": {"rewards": {"reward": bad}}},
        {
            "verifier_result": {"rewards": {"score": bad}},
            "exception_info": _failure("AgentTimeoutError", "2026-01-01T00:00:05Z"),
        },
    ):
        outcome, reward, _, error = classify(_result(**changes))
        assert (outcome, reward) == ("verifier_error", None)
        assert error == f"Harbor's verifier gave reward {bad!r}"


def test_a_harbor_result_names_its_task_by_folder_and_times_its_phases() -> None:
    found = _result()
    assert found.task == "t" and found.duration == 9.0
    assert found.phases() == {"agent": 3.0, "verifier": 2.0, "teardown": 2.0}
    assert found.own_report() is None
    usage = {"n_input_tokens": 10, "n_cache_tokens": 5, "n_output_tokens": 3, "cost_usd": 0.01}
    own = _result(agent_result=usage).own_report()
    assert own is not None and own.total_tokens == 18 and own.cost_usd == 0.01
