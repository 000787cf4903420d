"""The run phase under stress, for real: xdist, infrastructure retries, a runner killed -9 and
resumed, Ctrl-C, `hemra cancel` on a run served by `hemra serve`, and exit gates."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import TaskMaker, wait_for
from pytest_hemra.store import Store

pytestmark = pytest.mark.usefixtures("docker_test")

FLAKY_CONFTEST = '''
from contextlib import contextmanager

import pytest

from pytest_hemra.core.errors import InfraError
from pytest_hemra.execute.sandbox.docker import DockerProvider


class FlakyProvider(DockerProvider):
    """Docker that refuses every other container start (in each process)."""

    name = "flaky"
    starts = 0

    @contextmanager
    def open(self, request):
        FlakyProvider.starts += 1
        if FlakyProvider.starts % 2 == 1:
            raise InfraError("flaky: the daemon refused to start the container")
        with super().open(request) as sandbox:
            yield sandbox


@pytest.hookimpl
def pytest_hemra_sandbox_providers():
    return {"flaky": FlakyProvider}
'''


@pytest.fixture
def sleeper(write_harness: Callable[[str, str], Path]) -> Callable[[float], None]:
    """A program harness that sleeps, then solves the task (`make_task`'s default)."""

    def write(seconds: float) -> None:
        write_harness(
            "sleeper",
            f"""\
            kind = "program"
            command = ["bash", "-c", "sleep {seconds}; echo hi > /app/out.txt"]
            """,
        )

    return write


@pytest.fixture
def sleeper_run(
    tmp_path: Path, make_task: TaskMaker, sleeper: Callable[[float], None]
) -> Callable[..., tuple[Path, Path]]:
    """A run file over `tasks` tasks whose `sleeper` harness sleeps `seconds`: (run file, store)."""

    def write(
        seconds: float, tasks: int = 3, harnesses: str = '"sleeper"', attempts: int = 1
    ) -> tuple[Path, Path]:
        for name in ("one", "two", "three", "four")[:tasks]:
            make_task(name)
        sleeper(seconds)
        run_file = tmp_path / "run.toml"
        run_file.write_text(
            f'harnesses = [{harnesses}]\ndatasets = ["ds"]\nattempts = {attempts}\n'
        )
        return run_file, tmp_path / ".hemra" / "hemra.db"

    return write


def statuses(store_path: Path) -> list[str]:
    if not store_path.exists():
        return []
    store = Store(store_path)
    try:
        return [t.status for run in store.runs() for t in store.trials(run.id)]
    finally:
        store.close()


def hemra_containers(docker_client: Any, run_id: str) -> list[Any]:
    return list(
        docker_client.containers.list(
            all=True, ignore_removed=True, filters={"label": f"hemra.run={run_id}"}
        )
    )


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start a command in its own process group; whatever is left is killed at the end."""
    children: list[subprocess.Popen[bytes]] = []

    def start(*argv: str) -> subprocess.Popen[bytes]:
        log = (tmp_path / f"child-{len(children)}.log").open("wb")
        child = subprocess.Popen(
            argv, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        children.append(child)
        return child

    yield start
    for child in children:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()


@pytest.mark.slow
@pytest.mark.parametrize(
    "xdist",
    [[], ["-n", "2"], ["--hemra-concurrency", "3"]],
    ids=["serial", "xdist", "lanes"],
)
def test_infra_errors_are_retried_as_linked_attempts_and_junit_has_one_case_per_trial(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker, xdist: list[str]
) -> None:
    # every other start refused (in each process); on lanes, whose starts interleave: each
    # trial's first row (seqs 0-2: a retry is a new row)
    first_rows = 'int(request.labels["hemra.trial"].rpartition(".")[2]) < 3'
    lanes = "--hemra-concurrency" in xdist
    pytester.makeconftest(
        FLAKY_CONFTEST.replace("FlakyProvider.starts % 2 == 1", first_rows)
        if lanes
        else FLAKY_CONFTEST
    )
    for name in ("one", "two", "three"):
        make_task(name)
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        'harnesses = ["oracle"]\ndatasets = ["ds"]\nmax_infra_retries = 1\n'
        '[sandbox]\nprovider = "flaky"\n'
    )
    junit = tmp_path / "junit.xml"

    result = pytester.runpytest("--hemra-run", str(run_file), f"--junitxml={junit}", *xdist)

    result.assert_outcomes(passed=3)
    assert result.parseoutcomes()["rerun"] == 3  # each trial's first start fails, its retry runs
    store = Store(pytester.path / ".hemra" / "hemra.db")
    (run,) = store.runs()
    current = store.trials(run.id)
    assert [(t.task, t.outcome) for t in current] == [(n, "pass") for n in ("one", "three", "two")]
    history = store.trials(run.id, history=True)
    replaced = {t.id: t for t in history if t.status == "replaced"}
    assert all(t.outcome == "infra_error" for t in replaced.values())
    assert all("daemon refused" in (t.error or "") for t in replaced.values())
    assert {t.replaces for t in current} == set(replaced)
    assert [t.retries for t in current] == [1, 1, 1]
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    assert len(cases) == 3
    properties = [{p.get("name"): p.get("value") for p in case.iter("property")} for case in cases]
    assert [p["retries"] for p in properties] == ["1", "1", "1"]
    assert {p["outcome"] for p in properties} == {"pass"}
    assert {"reward", "tokens", "cost", "duration"} <= set(properties[0])


def test_retries_exhausted_end_in_an_error_and_a_failing_exit(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker
) -> None:
    pytester.makeconftest(FLAKY_CONFTEST.replace("% 2 == 1", "> 0"))  # never starts
    make_task("one")
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        'harnesses = ["oracle"]\ndatasets = ["ds"]\nmax_infra_retries = 2\n'
        '[sandbox]\nprovider = "flaky"\n'
    )
    result = pytester.runpytest("--hemra-run", str(run_file), "--hemra-fail-on", "unfinished")
    result.assert_outcomes(errors=1)
    assert result.parseoutcomes()["rerun"] == 2
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*fail-on gate tripped: 1 trial without a result (infra_error)*"])
    store = Store(pytester.path / ".hemra" / "hemra.db")
    (run,) = store.runs()
    assert [t.retries for t in store.trials(run.id, history=True)] == [0, 1, 2]


@pytest.mark.slow
def test_a_runner_killed_mid_run_is_resumed_with_every_trial_finished_exactly_once(
    pytester: pytest.Pytester,
    sleeper_run: Callable[..., tuple[Path, Path]],
    spawn: Callable[..., subprocess.Popen[bytes]],
    docker_client: Any,
) -> None:
    run_file, store_path = sleeper_run(2, harnesses='"sleeper", "oracle"', attempts=2)
    runner = spawn(
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
        "--hemra-run", str(run_file), "-n", "2",
    )  # fmt: skip
    wait_for(
        lambda: "finished" in statuses(store_path) and statuses(store_path).count("running") == 2,
        120,
        "two trials in flight after one finished",
    )
    os.killpg(runner.pid, signal.SIGKILL)  # the controller and both workers, at once
    runner.wait()
    store = Store(store_path)
    (run,) = store.runs()
    before = store.trials(run.id)
    assert len(before) == 12
    finished_before = {t.id for t in before if t.is_finished}
    assert len(hemra_containers(docker_client, run.id)) >= 1  # left running by the dead runner

    result = pytester.runpytest(
        "--hemra-resume", run.id, "--hemra-store", str(store_path), "-n", "2"
    )

    result.assert_outcomes(passed=12)
    after = store.trials(run.id)
    assert len(after) == 12 and {t.item_id for t in after} == {t.item_id for t in before}
    assert all(t.status == "finished" and t.outcome == "pass" for t in after)
    assert finished_before <= {t.id for t in after}  # finished trials were not run again
    replaced = [t for t in store.trials(run.id, history=True) if t.status == "replaced"]
    assert replaced and all(t.retries == 0 for t in after)  # a resume is not a retry
    assert {t.item_id for t in replaced} <= {t.item_id for t in after}
    assert store.run(run.id).status == "finished"
    assert hemra_containers(docker_client, run.id) == []


@pytest.mark.slow
@pytest.mark.parametrize("xdist", [[], ["--concurrency", "2"]], ids=["serial", "xdist"])
def test_ctrl_c_cancels_what_did_not_finish_and_removes_its_containers(
    xdist: list[str],
    sleeper_run: Callable[..., tuple[Path, Path]],
    spawn: Callable[..., subprocess.Popen[bytes]],
    docker_client: Any,
) -> None:
    run_file, store_path = sleeper_run(60)
    runner = spawn("hemra", "run", str(run_file), "--store", str(store_path), *xdist)
    wait_for(lambda: "running" in statuses(store_path), 60, "a running trial")
    time.sleep(1.0)  # its container is up
    os.killpg(runner.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    assert runner.wait(timeout=30) != 0

    store = Store(store_path)
    (run,) = store.runs()
    trials = store.trials(run.id)
    assert [t.outcome for t in trials] == ["cancelled"] * 3
    assert all(t.is_finished for t in trials)
    assert hemra_containers(docker_client, run.id) == []


@pytest.fixture
def detached(
    tmp_path: Path, sleeper_run: Callable[..., tuple[Path, Path]]
) -> Callable[[float], tuple[str, Path]]:
    """`hemra run --detach` of 4 trials whose harness sleeps: the run id and its store."""

    def record(seconds: float) -> tuple[str, Path]:
        run_file, store_path = sleeper_run(seconds, tasks=4)
        done = subprocess.run(
            ["hemra", "run", str(run_file), "--detach", "--store", str(store_path)],
            capture_output=True, text=True, check=True, cwd=tmp_path,
        )  # fmt: skip
        return done.stdout.strip(), store_path

    return record


@pytest.mark.slow
def test_hemra_cancel_stops_a_served_run_within_seconds(
    detached: Callable[[float], tuple[str, Path]],
    spawn: Callable[..., subprocess.Popen[bytes]],
    docker_client: Any,
) -> None:
    run_id, store_path = detached(120)
    store = Store(store_path)
    assert store.run(run_id).status == "queued"
    assert store.job_counts(run_id) == {"queued": 4}

    server = spawn("hemra", "serve", "--store", str(store_path), "--concurrency", "2")
    wait_for(lambda: statuses(store_path).count("running") == 2, 120, "two running trials")
    wait_for(lambda: len(hemra_containers(docker_client, run_id)) == 2, 30, "two containers")
    runs = subprocess.run(
        ["hemra", "runs", "--store", str(store_path)], capture_output=True, text=True, check=True
    )
    assert run_id in runs.stdout and "0/4" in runs.stdout

    started = time.monotonic()
    subprocess.run(["hemra", "cancel", run_id, "--store", str(store_path)], check=True)
    wait_for(
        lambda: (
            not hemra_containers(docker_client, run_id)
            and all(t.outcome == "cancelled" for t in store.trials(run_id))
        ),
        10 - (time.monotonic() - started),
        "every trial cancelled and no container left",
    )
    assert store.run(run_id).status == "cancelled"
    os.killpg(server.pid, signal.SIGTERM)
    server.wait(timeout=30)
    assert hemra_containers(docker_client, run_id) == []


@pytest.mark.slow
def test_exit_gates_for_ci(pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker) -> None:
    make_task("one")
    store = str(tmp_path / "s.db")
    base = ["hemra", "run", "-H", "oracle", "-H", "nop", "-d", str(tmp_path / "datasets" / "ds")]
    assert pytester.run(*base, "--store", store).ret == 0  # nop failing is a result
    assert pytester.run(*base, "--store", store, "--fail-on", "failure").ret == 1
    assert pytester.run(*base, "--store", store, "--fail-on", "oracle:score<1").ret == 0
    # nop is worse than oracle, but one task cannot make that significant
    assert pytester.run(*base, "--store", store, "--fail-on", "regression").ret == 0
    gated = pytester.run(*base, "--store", store, "--fail-on", "score<0.5")
    assert gated.ret == 1
    gated.stdout.fnmatch_lines(["*gate tripped: nop: mean reward 0.000 < 0.5*"])
    bad = pytester.run(*base, "--store", store, "--fail-on", "score>1")
    assert bad.ret == 4 and "expected 'unfinished', 'failure'" in bad.stderr.str()


@pytest.mark.slow
def test_a_stopped_server_leaves_its_run_to_the_next_one(
    detached: Callable[[float], tuple[str, Path]],
    spawn: Callable[..., subprocess.Popen[bytes]],
    docker_client: Any,
) -> None:
    run_id, store_path = detached(3)
    server = spawn("hemra", "serve", "--store", str(store_path), "--concurrency", "2")
    wait_for(lambda: statuses(store_path).count("running") == 2, 120, "two running trials")
    os.killpg(server.pid, signal.SIGTERM)
    server.wait(timeout=30)
    assert hemra_containers(docker_client, run_id) == []  # the server removed its sandboxes

    again = subprocess.run(
        ["hemra", "serve", "--store", str(store_path), "--once"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    store = Store(store_path)
    trials = store.trials(run_id)
    assert len(trials) == 4 and all(t.outcome == "pass" for t in trials)
    history = store.trials(run_id, history=True)
    assert len(history) - len(trials) == 2  # the two the stopped server left, run again
    assert store.run(run_id).status == "finished"


@pytest.mark.slow
def test_a_cancelled_run_resumes_only_when_asked(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker
) -> None:
    make_task("one")
    make_task("two")
    store = str(tmp_path / "s.db")
    detached = pytester.run(
        "hemra", "run", "-H", "oracle", "-d", str(tmp_path / "datasets" / "ds"),
        "--store", store, "--detach",
    )  # fmt: skip
    run_id = detached.outlines[0].strip()
    cancelled = pytester.run("hemra", "cancel", run_id, "--store", store)
    cancelled.stdout.fnmatch_lines([f"run {run_id}: 2 trials cancelled, 0 sandboxes removed"])

    resumed = pytester.run("hemra", "run", "--resume", run_id, "--store", store)
    assert resumed.ret == 1  # cancelled cells did not finish
    kept = Store(Path(store))
    assert [t.status for t in kept.trials(run_id, history=True)] == ["cancelled", "cancelled"]
    assert kept.run(run_id).status == "cancelled"  # not interrupted: its resume runs nothing

    finished = pytester.run(
        "hemra", "run", "--resume", run_id, "--resume-cancelled", "--store", store
    )
    assert finished.ret == 0
    assert [t.outcome for t in kept.trials(run_id)] == ["pass", "pass"]
    again = pytester.run("hemra", "run", "--resume", run_id, "--store", store, "-v")
    assert again.ret == 0  # reported from the store, not run again
    again.stdout.fnmatch_lines(["*2 passed*"])
    trials = Store(Path(store)).trials(run_id, history=True)
    assert [t.status for t in trials] == ["replaced", "finished", "replaced", "finished"]
