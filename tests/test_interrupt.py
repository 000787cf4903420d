"""Ctrl-C on a real `hemra run`: one line saying how to finish the run, the run recorded
`interrupted` with what is left, and that line's command, run as printed, finishing every trial
once. (A run cancelled on purpose stays cancelled on a plain resume: tests/test_runs.py.)"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import TaskMaker, wait_for
from pytest_hemra.core.interrupts import AGAIN_AFTER_SECS, RUNNING, filter_interrupts
from pytest_hemra.core.lifecycle import RunStatus, TrialStatus
from pytest_hemra.core.records import PlannedTrial
from pytest_hemra.store import Store
from tests.test_runs import hemra_containers


def finished_count(store_path: Path) -> int:
    """Trials with a result in the store's runs, 0 before the store exists."""
    if not store_path.exists():
        return 0
    store = Store(store_path)
    try:
        return sum(
            1 for run in store.runs() for t in store.trials(run.id) if t.status == "finished"
        )
    finally:
        store.close()


def listed(store_path: Path, run_id: str) -> dict[str, Any]:
    """The run as `hemra runs --format json` lists it, found by its id."""
    done = subprocess.run(
        ["hemra", "runs", "--store", str(store_path), "--format", "json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    (run,) = [run for run in json.loads(done.stdout) if run["id"] == run_id]
    return dict(run)


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["serial", "xdist"])
@pytest.mark.parametrize(
    "stop",
    [signal.SIGINT, signal.SIGTERM],  # a terminal's Ctrl-C; a CI job cancelled, a `kill`
    ids=["ctrl-c", "sigterm"],
)
def test_ctrl_c_prints_the_command_that_finishes_the_run_and_it_finishes_every_trial_once(
    stop: signal.Signals,
    xdist: list[str],
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[[str, str], Path],
    docker_client: Any,
) -> None:
    for name in ("one", "two", "three", "four"):
        make_task(name)
    sleeps = '["bash", "-c", "sleep 3; echo hi > /app/out.txt"]'
    write_harness("sleeper", f'kind = "program"\ncommand = {sleeps}\n')
    (tmp_path / "run.toml").write_text(
        'harnesses = ["sleeper"]\ndatasets = ["ds"]\nattempts = 2\nconcurrency = 4\n'
    )
    store_path = tmp_path / "s.db"
    argv = ["hemra", "run", "run.toml", "--store", "s.db", *xdist]
    with (tmp_path / "interrupted.log").open("wb") as log:
        runner = subprocess.Popen(
            argv, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            wait_for(lambda: finished_count(store_path) >= 1, 180, "a trial with a result")
            os.killpg(runner.pid, stop)  # the whole group, as a terminal's Ctrl-C does
            assert runner.wait(timeout=60) == 2
        finally:
            if runner.poll() is None:
                os.killpg(runner.pid, signal.SIGKILL)
                runner.wait()
    output = (tmp_path / "interrupted.log").read_text()
    said = [line for line in output.splitlines() if line.startswith("hemra: interrupted")]
    assert len(said) == 1, output
    for noise in ("Traceback", "KeyboardInterrupt", "gate tripped"):
        assert noise not in output, output

    store = Store(store_path)
    (run,) = store.runs()
    assert run.status == RunStatus.INTERRUPTED
    trials = store.trials(run.id)
    done = sum(1 for t in trials if t.status == TrialStatus.FINISHED)
    assert 1 <= done < 8
    assert said[0] == (
        f"hemra: interrupted: {done} of 8 trials have a result; finish the run with:"
        f" hemra run --resume {run.id} --store s.db"
    )
    shown = listed(store_path, run.id)
    assert shown["status"] == "interrupted" and shown["left"] == 8 - done
    table = subprocess.run(
        ["hemra", "runs", "--store", str(store_path), "--wide"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    (row,) = [line for line in table.stdout.splitlines() if line.startswith(run.id)]
    assert f"interrupted ({8 - done} left)" in row
    assert hemra_containers(docker_client, run.id) == []

    command = shlex.split(said[0].partition("finish the run with: ")[2])
    resumed = subprocess.run(
        command, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    after = store.trials(run.id)
    assert len(after) == 8 and all(t.status == TrialStatus.FINISHED for t in after)
    assert sorted(t.item_id for t in after) == sorted(t.item_id for t in trials)
    assert {t.id for t in trials if t.status == TrialStatus.FINISHED} <= {t.id for t in after}
    assert store.run(run.id).status == RunStatus.FINISHED
    assert listed(store_path, run.id)["left"] == 0


def test_an_interrupted_run_stays_interrupted_until_resumed(
    tmp_path: Path, store_address: str
) -> None:
    """The store's side: a trial finishing after the interrupt does not finish the run; taken
    up again with nothing left to run, it is finished at once."""
    store = Store(store_address)
    planned = [PlannedTrial("ds", f"t{n}", "nop", 1) for n in range(3)]
    store.record_plan("r1", "r1", {}, tmp_path, planned)
    first, second, third = (t.id for t in store.trials("r1"))
    assert store.claim(first, "me", 30).is_leased
    assert store.claim(second, "me", 30).is_leased

    assert store.interrupt_run("r1") == 3
    assert store.run("r1").status == RunStatus.INTERRUPTED
    assert {t.error for t in store.trials("r1")} == {"interrupted (Ctrl-C)"}
    store.cancel_trials([third], "again")  # a late write closes nothing
    assert store.run("r1").status == RunStatus.INTERRUPTED
    assert not store.claim(third, "late", 30).is_leased

    store.replace_trial(first, retry=False)
    store.reopen_run("r1")  # its cancelled trials queued again first, as a resume does
    assert store.run("r1").status == RunStatus.RUNNING
    assert store.claim(store.trials("r1")[0].id, "resume", 30).is_leased

    assert store.interrupt_run("r1") == 1  # interrupted again
    assert store.run("r1").status == RunStatus.INTERRUPTED
    store.reopen_run("r1")  # nothing queued again: nothing left to run
    assert store.run("r1").status == RunStatus.FINISHED
    store.close()


def test_interrupting_a_run_with_every_result_in_leaves_it_finished(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    store.record_plan("r1", "r1", {}, tmp_path, [])
    assert store.interrupt_run("r1") == 0
    assert store.run("r1").status != RunStatus.INTERRUPTED
    store.close()


SLOW_START_CONFTEST = '''
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from pytest_hemra.execute.sandbox.docker import DockerProvider


class SlowStartProvider(DockerProvider):
    """Docker whose containers come up seconds after they are asked for: a stop (Ctrl-C)
    lands while none is there to remove yet."""

    name = "slowstart"

    @contextmanager
    def open(self, request):
        Path("starting").write_text(request.labels["hemra.trial"])
        time.sleep(4)
        with super().open(request) as sandbox:
            yield sandbox


@pytest.hookimpl
def pytest_hemra_sandbox_providers():
    return {"slowstart": SlowStartProvider}
'''


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
def test_a_sandbox_that_comes_up_just_after_ctrl_c_is_removed_by_its_trial(
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[[str, str], Path],
    docker_client: Any,
) -> None:
    make_task("one", task_toml="[agent]\ntimeout_sec = 600\n[verifier]\ntimeout_sec = 30\n")
    write_harness("sleeper", 'kind = "program"\ncommand = ["sleep", "300"]\n')
    (tmp_path / "conftest.py").write_text(SLOW_START_CONFTEST)
    (tmp_path / "run.toml").write_text(
        'harnesses = ["sleeper"]\ndatasets = ["ds"]\nconcurrency = 2\n'  # on a lane: not
        '[sandbox]\nprovider = "slowstart"\n'  # the thread pytest's KeyboardInterrupt stops
    )
    with (tmp_path / "interrupted.log").open("wb") as log:
        runner = subprocess.Popen(
            ["hemra", "run", "run.toml", "--store", "s.db"],
            cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            wait_for((tmp_path / "starting").exists, 180, "the trial's sandbox being started")
            os.killpg(runner.pid, signal.SIGINT)  # before its container exists
            # the trial, not its 300 s agent, ends the session: its container is removed
            # as soon as it comes up
            assert runner.wait(timeout=120) == 2, (tmp_path / "interrupted.log").read_text()
        finally:
            if runner.poll() is None:
                os.killpg(runner.pid, signal.SIGKILL)
                runner.wait()
    store = Store(tmp_path / "s.db")
    (run,) = store.runs()
    (trial,) = store.trials(run.id)
    assert (trial.outcome, trial.error) == ("cancelled", "interrupted (Ctrl-C)")
    assert "agent" not in store.trial_detail(trial.id).phases  # stopped before its agent ran
    assert hemra_containers(docker_client, run.id) == []


def test_a_ctrl_c_landing_in_a_finaliser_is_delivered_again_and_not_printed() -> None:
    """Ctrl-C reaches an xdist worker while its garbage collector runs a finaliser: the
    KeyboardInterrupt cannot propagate from there (Python would print it as "Exception
    ignored" and lose it). HEMRA's filter prints nothing and, while the session runs, raises it
    again in the main thread; once the session is ending, it is only dropped. Any other
    unraisable exception goes on to the hook behind it."""

    class Finalised:
        def __init__(self, error: type[BaseException]) -> None:
            self.error = error

        def __del__(self) -> None:
            raise self.error("raised in a finaliser")

    passed_on: list[Any] = []
    before = sys.unraisablehook
    sys.unraisablehook = passed_on.append
    try:
        filter_interrupts()
        filter_interrupts()  # once in front is enough
        Finalised(ValueError)  # collected at once: its finaliser runs here
        assert [type(u.exc_value) for u in passed_on] == [ValueError]
        RUNNING.set()
        with pytest.raises(KeyboardInterrupt):
            Finalised(KeyboardInterrupt)
            for _ in range(100):  # the main thread's next bytecodes
                time.sleep(0.01)
        RUNNING.clear()  # the session is ending: dropped, not raised again
        Finalised(KeyboardInterrupt)
        time.sleep(10 * AGAIN_AFTER_SECS)
    finally:
        RUNNING.clear()
        sys.unraisablehook = before
    assert len(passed_on) == 1


CTRL_C_IN_FINALISERS = """
import pytest


class Finalised:
    def __del__(self):
        raise KeyboardInterrupt("a Ctrl-C landing in a finaliser")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    Finalised()  # the session ending


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    Finalised()  # after pytest collected what was left

"""


def test_a_ctrl_c_in_a_finaliser_at_any_point_of_a_session_is_never_printed(
    pytester: pytest.Pytester, make_task: TaskMaker, tmp_path: Path
) -> None:
    """A Ctrl-C that lands in a finaliser while a HEMRA session ends, or after pytest collected
    what was left at its end (where the last CI's came from an xdist worker), is dropped: no
    traceback, no "Exception ignored", no PytestUnraisableExceptionWarning, and the session's
    own exit status. (One while it runs is raised again: the test above.)"""
    make_task("one")
    pytester.makeconftest(CTRL_C_IN_FINALISERS)
    dataset = str(tmp_path / "datasets" / "ds")
    result = pytester.runpytest_subprocess(
        "--collect-only", "--hemra-harness", "oracle", "--hemra-dataset", dataset
    )
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.OK, output
    for noise in ("Traceback", "Exception ignored", "Unraisable", "a Ctrl-C landing"):
        assert noise not in output, output
