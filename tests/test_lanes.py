"""Many trials at once from one pytest process (`run/lanes.py`), for real: a run's
`concurrency` honoured by plain `pytest --hemra-run`, with and without xdist, pytest's view
exact (one item and one JUnit testcase per trial), `-x` stopping what runs, and a wide run of
64 trials at once."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import TaskMaker
from pytest_hemra.core.records import TrialRecord
from pytest_hemra.store import Store

pytestmark = pytest.mark.usefixtures("docker_test")

SLEEPER = """\
kind = "program"
command = ["bash", "-c", "sleep {seconds}; echo hi > /app/out.txt"]
"""


def most_at_once(trials: list[TrialRecord], store: Store) -> int:
    """The most trials whose agents ran at the same moment (from their recorded times)."""
    spans = []
    for trial in trials:
        detail = store.trial_detail(trial.id)
        assert detail.started_at is not None and detail.finished_at is not None
        spans.append((detail.started_at, detail.finished_at))
    return max(sum(1 for s, f in spans if s <= start < f) for start, _ in spans)


def junit_cases(junit: Path) -> list[str]:
    return [str(case.get("name")) for case in ET.parse(junit).getroot().iter("testcase")]


@pytest.fixture
def sleepers(
    tmp_path: Path, make_task: TaskMaker, write_harness: Callable[[str, str], Path]
) -> Callable[..., Path]:
    """A run file over `tasks` tasks that a harness sleeping `seconds` solves."""

    def write(tasks: int, seconds: float, concurrency: int | None = None) -> Path:
        for n in range(tasks):
            make_task(f"task-{n:03d}")
        write_harness("sleeper", SLEEPER.format(seconds=seconds))
        run_file = tmp_path / "run.toml"
        run_file.write_text(
            'harnesses = ["sleeper"]\ndatasets = ["ds"]\n'
            + ("" if concurrency is None else f"concurrency = {concurrency}\n")
        )
        return run_file

    return write


def test_a_run_files_concurrency_runs_its_trials_at_once_in_one_process(
    pytester: pytest.Pytester, tmp_path: Path, sleepers: Callable[..., Path]
) -> None:
    run_file = sleepers(8, 4, concurrency=8)
    junit = tmp_path / "junit.xml"

    result = pytester.runpytest("--hemra-run", str(run_file), f"--junitxml={junit}")

    result.assert_outcomes(passed=8)
    store = Store(pytester.path / ".hemra" / "hemra.db")
    (run,) = store.runs()
    trials = store.trials(run.id)
    assert [t.outcome for t in trials] == ["pass"] * 8
    assert len({store.trial_detail(t.id).worker for t in trials}) == 1  # one process
    assert most_at_once(trials, store) >= 6  # at once (a few may start late on 2 cores)
    cases = junit_cases(junit)
    assert sorted(cases) == sorted(f"task-{n:03d}[sleeper-1]" for n in range(8))


def test_without_concurrency_a_process_runs_one_trial_at_a_time(
    pytester: pytest.Pytester, sleepers: Callable[..., Path]
) -> None:
    run_file = sleepers(3, 1)

    pytester.runpytest("--hemra-run", str(run_file)).assert_outcomes(passed=3)

    store = Store(pytester.path / ".hemra" / "hemra.db")
    (run,) = store.runs()
    assert most_at_once(store.trials(run.id), store) == 1


def test_the_concurrency_option_is_shared_out_among_xdist_workers(
    pytester: pytest.Pytester, tmp_path: Path, sleepers: Callable[..., Path]
) -> None:
    """`--hemra-concurrency 8 -n 2`: 4 lanes in each of 2 workers; an item whose trial the
    other worker's lanes took waits for its result."""
    run_file = sleepers(8, 4)
    junit = tmp_path / "junit.xml"

    result = pytester.runpytest(
        "--hemra-run", str(run_file), "--hemra-concurrency", "8", "-n", "2", f"--junitxml={junit}"
    )

    result.assert_outcomes(passed=8)
    store = Store(pytester.path / ".hemra" / "hemra.db")
    (run,) = store.runs()
    trials = store.trials(run.id)
    assert len(store.trials(run.id, history=True)) == 8  # each trial ran once
    assert most_at_once(trials, store) >= 5  # more than the 2 workers alone
    assert len(junit_cases(junit)) == 8 and len(set(junit_cases(junit))) == 8


def test_x_stops_the_trials_still_running_and_records_them_cancelled(
    pytester: pytest.Pytester, make_task: TaskMaker, tmp_path: Path, write_harness: Any
) -> None:
    """`-x`: the first failure ends the session; trials running then are stopped (their
    sandboxes removed) and recorded cancelled, never failed; none is left running."""
    make_task("fails-fast", task_toml="[agent]\ntimeout_sec = 2\n[verifier]\ntimeout_sec = 30\n")
    for n in range(3):
        make_task(f"slow-{n}")
    write_harness("sleeper", SLEEPER.format(seconds=60))
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["sleeper"]\ndatasets = ["ds"]\nconcurrency = 4\n')

    result = pytester.runpytest("--hemra-run", str(run_file), "-x")

    assert result.ret == pytest.ExitCode.TESTS_FAILED
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) + outcomes.get("errors", 0) == 1
    assert "passed" not in outcomes
    store = Store(pytester.path / ".hemra" / "hemra.db")
    (run,) = store.runs()
    trials = {t.task: t for t in store.trials(run.id)}
    assert trials["fails-fast"].outcome in ("fail", "timeout")
    for n in range(3):
        slow = trials[f"slow-{n}"]
        assert slow.outcome == "cancelled", slow
        assert "(-x, --maxfail)" in (slow.error or "")
        assert (slow.duration or 0) < 50  # stopped, not waited out


@pytest.mark.slow
def test_sixty_four_trials_at_once_each_reported_once(
    pytester: pytest.Pytester, tmp_path: Path, sleepers: Callable[..., Path]
) -> None:
    """64 sleeping trials at concurrency 64 under `pytest --hemra-run` with --junitxml: 64
    testcases, each once; the store consistent (each trial one current row, finished; a row
    replaced only by a rerun after its engine stopped answering, which the suite's other tests
    can cause). Issue 17's 200 at 200 is `benchmarks/concurrency.py`, which checks the same: at
    that width, in the suite, the engine keeps the tests running beside it waiting."""
    run_file = sleepers(64, 5, concurrency=64)
    junit = tmp_path / "junit.xml"

    result = pytester.runpytest("--hemra-run", str(run_file), f"--junitxml={junit}", "-q")

    result.assert_outcomes(passed=64)
    cases = junit_cases(junit)
    assert len(cases) == 64 and len(set(cases)) == 64
    store = Store(pytester.path / ".hemra" / "hemra.db")
    (run,) = store.runs()
    current = store.trials(run.id)
    assert len(current) == 64 and all(t.status == "finished" for t in current)
    assert len({t.item_id for t in current}) == 64
    replaced = [t for t in store.trials(run.id, history=True) if t.status == "replaced"]
    assert all(t.cause == "engine_outage" for t in replaced)
    assert store.run(run.id).status == "finished"
    assert most_at_once(current, store) >= 16


def test_the_docker_client_reads_no_environment_at_each_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pytest sets and unsets PYTEST_CURRENT_TEST around each item while lanes talk to the
    engine; requests, reading every environment variable at each call, failed with a KeyError
    when one went away mid-read (3 trials of 64 at once ended infra_error). The client reads
    the environment once, when it is made: going through it afterwards is an error here."""
    import os

    from pytest_hemra.execute.sandbox.client import connect

    class NoWalking(dict[str, str]):
        def __iter__(self) -> Any:
            raise AssertionError("the environment was walked through at a request")

        def items(self) -> Any:
            raise AssertionError("the environment was walked through at a request")

        def keys(self) -> Any:
            raise AssertionError("the environment was walked through at a request")

    client = connect()
    try:
        monkeypatch.setattr(os, "environ", NoWalking(os.environ))
        assert client.ping()
        assert client.api.trust_env is False
    finally:
        client.close()
