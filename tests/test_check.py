"""`hemra check DATASET`: oracle and nop run on every task as a normal run, and each task gets
its verdicts (broken, flaky, trivial, slow to build, a verifier without its network, healthy)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, TaskMaker
from pytest_hemra.cli import main
from pytest_hemra.core.records import PlannedTrial
from pytest_hemra.report.health import Verdict, check_health, render_health
from pytest_hemra.store import Store
from tests.records import trial_result
from tests.test_reports import result

# a verifier that needs the network: with it cut (HEMRA's default), the name lookup fails here,
# inside the sandbox, and nothing leaves the machine (after 2 s, not glibc's default 20 s)
NEEDS_NETWORK = (
    "RES_OPTIONS='timeout:1 attempts:1' getent hosts deb.debian.org"
    " || echo 'getent: deb.debian.org: Temporary failure in name resolution' >&2; exit 1"
)


@pytest.fixture
def hemra(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """`hemra ARGS` in a subprocess, importing this checkout's HEMRA."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    monkeypatch.setenv("PYTHONPATH", path)

    def run(*args: str) -> pytest.RunResult:
        return pytester.run("hemra", *args, timeout=240)

    return run


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
def test_check_names_broken_trivial_and_offline_verifier_tasks_and_exits_1(
    hemra: Callable[..., pytest.RunResult],
    tmp_path: Path,
    make_task: TaskMaker,
    capsys: pytest.CaptureFixture[str],
) -> None:
    make_task("healthy")
    make_task("broken", solve="echo bye > /app/out.txt")
    make_task("trivial", test="echo 1 > /logs/verifier/reward.txt")
    make_task("needs-network", test=NEEDS_NETWORK)
    # a multi-step task whose second step's verifier needs the network
    steps = make_task(
        "step-needs-network",
        test=None,
        solve=None,
        instruction=None,
        task_toml='[[steps]]\nname = "one"\n[[steps]]\nname = "two"\n',
    )
    for name, test in (("one", "echo 1 > /logs/verifier/reward.txt"), ("two", NEEDS_NETWORK)):
        (steps / "steps" / name / "tests").mkdir(parents=True)
        (steps / "steps" / name / "instruction.md").write_text(f"Step {name}.")
        (steps / "steps" / name / "tests" / "test.sh").write_text(test + "\n")
        (steps / "steps" / name / "solution").mkdir()
        (steps / "steps" / name / "solution" / "solve.sh").write_text("true\n")
    store_path = tmp_path / "s.db"
    dataset = str(tmp_path / "datasets" / "ds")
    checked = hemra("check", dataset, "-n", "2", "--store", str(store_path), "--format", "json")

    assert checked.ret == 1, checked.errlines[-20:]
    found = json.loads(checked.stdout.str())  # the session's own output went to stderr
    verdicts = {task["task"]: task["verdicts"] for task in found["tasks"]}
    assert verdicts == {
        "healthy": ["healthy"],
        "broken": ["broken"],
        "trivial": ["trivial"],
        "needs-network": ["broken", "verifier_offline"],
        "step-needs-network": ["broken", "verifier_offline"],
    }
    assert found["counts"] == {"broken": 3, "verifier_offline": 2, "trivial": 1, "healthy": 1}
    tasks = {task["task"]: task for task in found["tasks"]}
    assert tasks["broken"]["notes"] == ["oracle fail (reward 0)"]
    assert tasks["needs-network"]["notes"][0] == (
        "oracle verifier_error (no reward, scored 0): verifier wrote no"
        " /logs/verifier/reward.txt or reward.json"
    )
    assert "Temporary failure in name resolution" in tasks["needs-network"]["notes"][1]
    assert '[verifier] network = "bridge"' in tasks["needs-network"]["notes"][1]
    assert tasks["trivial"]["nop"] == {"passes": 1, "results": 1, "outcomes": ["pass"]}

    # recorded like any other run: `hemra report` and `hemra show` dig in
    store = Store(store_path)
    (run,) = store.runs()
    assert found["run_id"] == run.id and run.plan.harness_names == ("oracle", "nop")
    assert len(store.trials(run.id)) == 10
    classes = {t.task: t.cause for t in store.trials(run.id) if t.harness == "oracle"}
    assert classes["step-needs-network"] == classes["needs-network"] == "verifier_offline"
    assert main(["show", tasks["broken"]["trial"], "--store", str(store_path)]) == 0
    assert "ds::broken[oracle-1]" in capsys.readouterr().out

    text = render_health(check_health(store, run.id, "ds"))
    assert f"(run {run.id})" in text
    assert "needs-network: its verifier ran with its network cut and says" in text
    assert "5 tasks: 3 broken, 2 verifier_offline, 1 trivial, 1 healthy" in text


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
def test_the_bundled_offline_dataset_is_healthy(
    hemra: Callable[..., pytest.RunResult], tmp_path: Path
) -> None:
    checked = hemra("check", "hemra-offline", "-n", "2", "--store", str(tmp_path / "s.db"))
    assert checked.ret == 0, checked.errlines[-20:]
    checked.stdout.fnmatch_lines(
        ["task*verdict*oracle passes*nop passes*image", "6 tasks: 6 healthy"]
    )
    assert "HEMRA run" in checked.stderr.str()  # the run's own summary, off stdout


def test_an_unknown_dataset_is_refused_in_one_line_and_nothing_recorded(
    hemra: Callable[..., pytest.RunResult], tmp_path: Path
) -> None:
    refused = hemra("check", "no-such-dataset", "--store", str(tmp_path / "s.db"))
    assert refused.ret == 4
    assert refused.stdout.str() == ""
    errors = [line for line in refused.errlines if line.strip()]
    assert len(errors) == 1 and "no dataset named 'no-such-dataset'" in errors[0]
    assert not (tmp_path / "s.db").exists()


@pytest.mark.usefixtures("docker_test")
def test_a_task_hemra_refuses_stops_no_run_or_check_that_excludes_it(
    hemra: Callable[..., pytest.RunResult], tmp_path: Path, make_task: TaskMaker
) -> None:
    make_task("healthy")
    make_task("needs-gpu", task_toml="[environment]\ngpus = 1\n")  # no provider offers GPUs
    dataset, store_path = str(tmp_path / "datasets" / "ds"), str(tmp_path / "s.db")

    refused = hemra("run", "-H", "oracle", "-d", dataset, "--store", store_path)
    assert refused.ret == 4
    (error,) = [line for line in refused.errlines if line.strip()]
    assert f"{dataset}/needs-gpu/task.toml: key 'environment.gpus'" in error, error
    assert "no sandbox provider of HEMRA offers GPUs" in error

    ran = hemra("run", "-H", "oracle", "-d", dataset, "-x", "needs-*", "--store", store_path)
    assert ran.ret == 0, ran.errlines[-20:]
    checked = hemra("check", dataset, "-x", "needs-gpu", "--store", store_path)
    assert checked.ret == 0, checked.errlines[-20:]
    checked.stdout.fnmatch_lines(["1 task: 1 healthy"])
    selected = hemra("check", dataset, "-t", "heal*", "--store", store_path)
    assert selected.ret == 0, selected.errlines[-20:]
    store = Store(Path(store_path))
    runs = store.runs()
    assert len(runs) == 3  # the refused run recorded nothing
    assert {(t.task, t.harness) for run in runs for t in store.trials(run.id)} == {
        ("healthy", "oracle"),
        ("healthy", "nop"),
    }
    store.close()


# the verdicts from recorded trials: a real store, no Docker


def recorded_check(
    tmp_path: Path,
    outcomes: dict[tuple[str, str], list[dict[str, Any]]],
    *,
    run_network: str = "none",
) -> Store:
    """A run of oracle and nop on dataset `ds` (tmp_path/ds) whose trials ended as given:
    `outcomes[task, harness]` is each attempt's result (see `finished`)."""
    tasks = list(dict.fromkeys(task for task, _ in outcomes))
    attempts = max(len(found) for found in outcomes.values())
    plan = [
        PlannedTrial("ds", task, harness, attempt)
        for task in tasks
        for harness in ("oracle", "nop")
        for attempt in range(1, attempts + 1)
    ]
    record = {
        "spec": {"harnesses": ["oracle", "nop"], "verifier": {"network": run_network}},
        "datasets": {"ds": {"digest": "d" * 64, "path": str(tmp_path / "ds"), "tasks": tasks}},
        "harnesses": {"oracle": {}, "nop": {}},
    }
    store = Store(tmp_path / "s.db")
    store.record_plan("check", "run", record, tmp_path, plan)
    for trial in store.trials("check"):
        found = outcomes[trial.task, trial.harness]
        if trial.attempt <= len(found):
            store.finish_trial(trial.id, trial_result(found[trial.attempt - 1]))
    return store


def finished(
    tmp_path: Path,
    outcome: str,
    *,
    image: float = 1.0,
    verifier_stderr: str = "",
    error: str | None = None,
) -> dict[str, Any]:
    """A trial's result with its `image` phase, and a folder holding its verifier's stderr."""
    folder = tmp_path / "trials" / str(len(list(tmp_path.glob("trials/*"))))
    (folder / "verifier").mkdir(parents=True)
    (folder / "verifier" / "stderr.txt").write_text(verifier_stderr)
    return {
        **result(1.0 if outcome == "pass" else 0.0),
        "outcome": outcome,
        "reward": None
        if outcome in ("verifier_error", "infra_error")
        else float(outcome == "pass"),
        "error": error,
        "phases": {"image": image, "agent": 0.5},
        "trial_dir": str(folder),
    }


def test_an_oracle_passing_some_attempts_is_flaky_and_fails_only_a_strict_check(
    tmp_path: Path,
) -> None:
    store = recorded_check(
        tmp_path,
        {
            ("t", "oracle"): [finished(tmp_path, "pass"), finished(tmp_path, "fail")],
            ("t", "nop"): [finished(tmp_path, "fail"), finished(tmp_path, "fail")],
        },
    )
    health = check_health(store, "check", "ds")
    (task,) = health.tasks
    assert task.verdicts == (Verdict.FLAKY,)
    assert task.notes == ("oracle passed 1 of 2 attempts; attempt 2: fail (reward 0)",)
    assert task.trial == "check.00001"
    assert (health.exit_status(), health.exit_status(strict=True)) == (0, 1)


def test_an_image_build_past_the_threshold_is_slow_and_only_a_warning(tmp_path: Path) -> None:
    store = recorded_check(
        tmp_path,
        {
            ("slow", "oracle"): [finished(tmp_path, "pass", image=150.0)],
            ("slow", "nop"): [finished(tmp_path, "fail", image=0.1)],
            ("quick", "oracle"): [finished(tmp_path, "pass", image=3.0)],
            ("quick", "nop"): [finished(tmp_path, "fail", image=0.1)],
        },
    )
    health = check_health(store, "check", "ds")
    slow, quick = health.tasks
    assert (slow.verdicts, slow.build_secs) == ((Verdict.SLOW_BUILD,), 150.0)
    assert slow.notes == ("its image took 150s (over 120s)",)
    assert quick.verdicts == (Verdict.HEALTHY,)
    assert health.exit_status(strict=True) == 0
    assert check_health(store, "check", "ds", slow_build_secs=2.0).counts() == {"slow_build": 2}


def test_an_infra_error_is_broken_and_a_cancelled_oracle_unchecked(tmp_path: Path) -> None:
    store = recorded_check(
        tmp_path,
        {
            ("infra", "oracle"): [
                finished(tmp_path, "infra_error", error="image build failed: no such package")
            ],
            ("infra", "nop"): [finished(tmp_path, "infra_error")],
            ("stopped", "oracle"): [finished(tmp_path, "cancelled")],
            ("stopped", "nop"): [finished(tmp_path, "fail")],
        },
    )
    health = check_health(store, "check", "ds")
    infra, stopped = health.tasks
    assert infra.verdicts == (Verdict.BROKEN,)
    assert infra.notes == ("oracle infra_error (no reward): image build failed: no such package",)
    assert stopped.verdicts == (Verdict.UNCHECKED,)
    assert health.exit_status() == 1


def test_a_network_error_counts_only_when_the_verifier_had_its_network_cut(
    tmp_path: Path,
) -> None:
    offline = "curl: (6) Could not resolve host: pypi.org"
    outcomes = {
        (task, "oracle"): [finished(tmp_path, "fail", verifier_stderr=offline)]
        for task in ("cut", "public", "refused")
    }
    outcomes["refused", "oracle"] = [
        finished(tmp_path, "fail", verifier_stderr="curl: (7) Connection refused")
    ]
    outcomes |= {
        (task, "nop"): [finished(tmp_path, "fail")] for task in ("cut", "public", "refused")
    }
    for task, network in (("cut", ""), ("public", 'network_mode = "public"\n'), ("refused", "")):
        (tmp_path / "ds" / task).mkdir(parents=True)
        (tmp_path / "ds" / task / "task.toml").write_text(f"[verifier]\n{network}")
    store = recorded_check(tmp_path, outcomes)
    verdicts = {t.task: t.verdicts for t in check_health(store, "check", "ds").tasks}
    assert verdicts == {
        "cut": (Verdict.BROKEN, Verdict.VERIFIER_OFFLINE),
        "public": (Verdict.BROKEN,),  # it had its network: the error is the task's own
        "refused": (Verdict.BROKEN,),  # a local server not running: no network setting fixes it
    }
    (tmp_path / "bridged").mkdir()
    bridged = recorded_check(tmp_path / "bridged", outcomes, run_network="bridge")
    assert check_health(bridged, "check", "ds").tasks[0].verdicts == (Verdict.BROKEN,)


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
def test_a_task_whose_image_built_slowly_at_resolve_is_slow_build(
    hemra: Callable[..., pytest.RunResult], tmp_path: Path, make_task: TaskMaker
) -> None:
    """Images are built at resolve, before the run is recorded: the build time recorded with
    the run (not the trials' image phase, which only finds the image) decides `slow_build`."""
    unique = os.urandom(6).hex()
    make_task(
        "slow", dockerfile=f"FROM debian:bookworm-slim\nWORKDIR /app\nRUN sleep 3 # {unique}\n"
    )
    make_task("quick")
    store_path = tmp_path / "s.db"
    dataset = str(tmp_path / "datasets" / "ds")
    checked = hemra(
        "check", dataset, "--slow-build-secs", "2", "--store", str(store_path), "--format", "json"
    )
    assert checked.ret == 0, checked.errlines[-20:]
    tasks = {task["task"]: task for task in json.loads(checked.stdout.str())["tasks"]}
    assert tasks["slow"]["verdicts"] == ["slow_build"], tasks["slow"]
    assert tasks["slow"]["build_secs"] >= 3
    assert tasks["quick"]["verdicts"] == ["healthy"], tasks["quick"]
