"""Faults a run survives, for real (docs/runs.md, "Faults"): the Docker daemon stopped and
started again, or killed, in the middle of a run (a dockerd of this test's own, in its own
namespaces: tests/dockerd.py; the machine's engine is never touched); `hemra cancel` racing
trials that finish; the store's disk full for a moment; the store locked by another process for
longer than its timeout; the gateway's ports taken; containers removed while being listed.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import docker
import pytest

from conftest import BASE_IMAGE, REPO, TaskMaker, wait_for
from pytest_hemra.cli import main as hemra
from pytest_hemra.cli.running import run_summary
from pytest_hemra.core import progress
from pytest_hemra.core.backoff import Backoff, engine_backoff, store_backoff
from pytest_hemra.core.errors import SpecError, StoreUnavailable
from pytest_hemra.store import Store
from tests.dockerd import ExtraEngine, free_loopback_hosts, running_engines

OFFLINE_TASK = "[agent]\ntimeout_sec = 60\n[verifier]\ntimeout_sec = 30\n" + (
    "[environment]\nallow_internet = false\n"  # the extra engine has no bridge network
)
FAILING_TEST = "echo 0 > /logs/verifier/reward.txt"
QUICK_WAITS = {  # the runner pings a lost engine every 0.1-1 s (docs/runs.md, "Faults")
    "HEMRA_BACKOFF_FIRST_SECS": "0.2",
    "HEMRA_BACKOFF_MAX_SECS": "1",
    "HEMRA_ENGINE_GIVE_UP_SECS": "120",
    "HEMRA_STORE_GIVE_UP_SECS": "120",
}


@pytest.fixture(scope="module")
def engine(docker_client: Any) -> Iterator[ExtraEngine]:
    """A dockerd of this module's own (stopped, killed and started again by its tests), holding
    the base image the tasks build from; removed with everything it had on every path."""
    with running_engines(1, "an engine", first=40, image=(docker_client, BASE_IMAGE)) as found:
        yield found[0]


def labelled(address: str) -> dict[str, list[str]]:
    """What carries HEMRA's labels on an engine (and every volume: the engine is the test's)."""
    client = docker.DockerClient(base_url=address, timeout=30)
    try:
        return {
            "containers": [
                c.name
                for c in client.containers.list(
                    all=True, ignore_removed=True, filters={"label": "hemra"}
                )
            ],
            "networks": [n.name for n in client.networks.list(filters={"label": "hemra"})],
            "volumes": [v.name for v in client.volumes.list()],
        }
    finally:
        client.close()


def reading(store_path: Path, read: Callable[[Store], Any]) -> Any:
    """What `read` finds in the store (None before the run is recorded)."""
    if not store_path.exists():
        return None
    store = Store(store_path)
    try:
        return read(store) if store.runs() else None
    finally:
        store.close()


def finished(store_path: Path) -> int:
    return int(
        reading(store_path, lambda s: sum(t.is_finished for t in s.trials(s.runs()[0].id))) or 0
    )


def reached(store_path: Path, count: int) -> bool:
    return finished(store_path) >= count


def status(store_path: Path) -> str | None:
    """The run's status as `hemra runs` shows it."""
    summary = reading(store_path, lambda s: run_summary(s, s.runs()[0]))
    return None if summary is None else str(summary["status"])


@pytest.fixture
def sleeper_tasks(
    tmp_path: Path, make_task: TaskMaker, write_harness: Callable[[str, str], Path]
) -> Callable[..., Path]:
    """A run file over offline tasks (`failing` of them fail by design) of a harness that
    sleeps, then solves the task; `extra` goes at its end."""

    def write(tasks: int, attempts: int, sleep: float, failing: int = 0, extra: str = "") -> Path:
        for n in range(tasks):
            test = {"test": FAILING_TEST} if n < failing else {}
            make_task(f"task-{n}", task_toml=OFFLINE_TASK, **test)
        write_harness(
            "sleeper",
            f"""\
            kind = "program"
            command = ["bash", "-c", "sleep {sleep}; echo hi > /app/out.txt"]
            """,
        )
        run_file = tmp_path / "run.toml"
        run_file.write_text(
            f'harnesses = ["sleeper"]\ndatasets = ["ds"]\nattempts = {attempts}\n'
            + textwrap.dedent(extra)
        )
        return run_file

    return write


def start_run(
    tmp_path: Path, run_file: Path, *flags: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """`pytest --hemra-run` in a process group of its own, its output in runner.log."""
    log = (tmp_path / "runner.log").open("wb")
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--hemra-run"]
    try:
        return subprocess.Popen(
            [*argv, str(run_file), *flags],
            cwd=tmp_path,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                **QUICK_WAITS,
                "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
                **(env or {}),
            },
            start_new_session=True,
        )
    finally:
        log.close()


def finish(runner: subprocess.Popen[bytes], tmp_path: Path, timeout: float) -> int:
    """The runner's exit code; killed (with its group) if it is still running after `timeout`."""
    try:
        return runner.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(runner.pid, signal.SIGKILL)
        runner.wait()
        raise AssertionError((tmp_path / "runner.log").read_text()[-4000:]) from None


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
def test_a_daemon_stopped_then_killed_mid_run_costs_no_retry_and_leaves_nothing(
    tmp_path: Path,
    sleeper_tasks: Callable[..., Path],
    engine: ExtraEngine,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """48 trials on one engine (DOCKER_HOST) with max_infra_retries = 1: its daemon stopped
    (SIGTERM, as `systemctl restart docker` does) and started again, later killed (SIGKILL)
    and started again. Every trial finishes in this one run, as it should, using up no retry,
    and nothing with HEMRA's labels is left on the engine."""
    run_file = sleeper_tasks(4, 12, 0.2, failing=1, extra="max_infra_retries = 1\n")
    store_path = tmp_path / ".hemra" / "hemra.db"
    runner = start_run(tmp_path, run_file, "-n", "3", env={"DOCKER_HOST": engine.address})
    try:
        faults: list[tuple[int, Callable[[], None]]] = [
            (6, engine.stop),
            (24, lambda: engine.kill(whole=True)),
        ]
        for done, fault in faults:
            wait_for(partial(reached, store_path, done), 180, f"{done} trials finished")
            fault()  # its containers go with it: the trials in flight lose their sandboxes
            wait_for(lambda: status(store_path) == "waiting", 30, "hemra runs saying waiting")
            engine.start()
        code = finish(runner, tmp_path, 240)
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
            runner.wait()
    log = (tmp_path / "runner.log").read_text()
    assert code == 1, log[-4000:]  # task-0's trials failed, as they should; no error
    assert " error" not in log.splitlines()[-1], log[-4000:]
    store = Store(store_path)
    (run,) = store.runs()
    current = store.trials(run.id)
    assert len(current) == 48 and all(t.status == "finished" for t in current)
    outcomes = {(t.task, t.outcome) for t in current}
    assert outcomes == {("task-0", "fail"), *((f"task-{n}", "pass") for n in (1, 2, 3))}
    lost = [t for t in store.trials(run.id, history=True) if t.status == "replaced"]
    retried = [(t.id, t.retries) for t in current if t.retries]
    why = [(t.id, t.outcome, t.cause, t.error) for t in lost]
    assert all(t.retries == 0 for t in current), (retried, why)  # outages use up no retry
    assert lost and all(t.cause == "engine_outage" for t in lost)
    assert store.run(run.id).status == "finished"
    kinds = [e.kind for e in store.events([t.id for t in lost])]
    assert kinds.count("engine_down") >= 2 and kinds.count("engine_back") >= 2
    assert labelled(engine.address) == {"containers": [], "networks": [], "volumes": []}

    rerun = next(t for t in current if t.replaces)
    assert hemra(["show", rerun.id, "--store", str(store_path)]) == 0
    shown = capsys.readouterr().out
    assert "engine_outage: waited out, no retry used" in shown
    assert "engine_down: engine " + engine.address in shown
    assert "runs again after engine_outage" in shown


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
def test_an_engine_told_to_stop_is_down_to_the_runners_pings_at_once(
    engine: ExtraEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dockerd told to stop (SIGTERM) closes its socket at once, but goes on answering on
    connections already open until its containers have stopped (10 s for `sleep infinity`):
    the runner's pings, each on a new connection, find it down from the start, so an error
    its API gives meanwhile is the engine's outage, not the trial's own."""
    from pytest_hemra.execute.sandbox.docker import DockerProvider
    from pytest_hemra.run.outage import settled

    monkeypatch.setenv("DOCKER_HOST", engine.address)
    provider = DockerProvider()
    sleeper = provider.client.containers.run(
        BASE_IMAGE, ["sleep", "infinity"], detach=True, network_mode="none"
    )
    try:
        assert provider.engine_error() is None and provider.engine_error() is None
        assert engine.pid is not None
        os.kill(engine.pid, signal.SIGTERM)
        wait_for(lambda: provider.engine_error() is not None, 5, "a ping to find it down")
        assert settled(provider, None, 30) is not None
        assert provider.client.ping()  # a connection open before still answers
        sleeper.reload()
        assert sleeper.status == "running"  # still stopping: the daemon has not gone yet
    finally:
        engine.stop()
        engine.start()
        client = docker.DockerClient(base_url=engine.address, timeout=30)
        client.containers.get(sleeper.id).remove(force=True)
        client.close()


def sandboxes(docker_client: Any, run_id: str) -> list[Any]:
    return list(
        docker_client.containers.list(
            all=True, ignore_removed=True, filters={"label": f"hemra.run={run_id}"}
        )
    )


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
def test_hemra_cancel_racing_trials_that_finish_exits_0_every_time_and_leaves_nothing(
    tmp_path: Path,
    make_task: TaskMaker,
    docker_client: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """20 runs of one trial, each worked by a runner (a thread of this process, five runs at
    once) and cancelled by `hemra cancel` as the trial finishes: from its diff on, a little
    later each time (its verifier, its sandbox being removed, its result being recorded, or
    just recorded). Every cancel exits 0 and says what it did; nothing is left."""
    from pytest_hemra.execute.provisioning import provision
    from pytest_hemra.execute.sandbox.docker import DockerProvider
    from pytest_hemra.resolve.overrides import Overrides
    from pytest_hemra.resolve.plan import load_recorded, record_plan, resolve_plan
    from pytest_hemra.run.job import Runner, folder_name

    make_task("one")
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["oracle"]\ndatasets = ["ds"]\n')
    plan = resolve_plan(run_file, Overrides(), tmp_path)
    provision(plan, {"docker": DockerProvider})
    store_path = tmp_path / ".hemra" / "hemra.db"
    store = Store(store_path)
    owner = f"race@{os.uname()[1]}:{os.getpid()}"

    def race(run_id: str, delay: float) -> tuple[int, list[Any], str]:
        run = load_recorded(store, run_id)
        (trial,) = run.trials
        runner = Runner(Store(store_path), run, DockerProvider(), owner)
        worker = threading.Thread(target=runner.work, args=(trial,), daemon=True)
        worker.start()
        diff = run.trials_dir / trial.dataset / trial.task / folder_name(trial) / "diff.patch"
        wait_for(lambda: diff.exists() or not worker.is_alive(), 120, "the trial's diff")
        time.sleep(delay)
        code = hemra(["cancel", run_id, "--store", str(store_path), "--wait", "30"])
        worker.join(60)
        runner.close()
        return code, sandboxes(docker_client, run_id), Store(store_path).trial(trial.id).status

    draw = random.Random(18)
    run_ids = [record_plan(plan, store) for _ in range(20)]
    results: list[tuple[int, list[Any], str]] = []
    for start in range(0, 20, 5):
        batch = [
            threading.Thread(target=lambda r=r, d=d: results.append(race(r, d)))
            for r, d in ((r, draw.uniform(0, 1.5)) for r in run_ids[start : start + 5])
        ]
        for thread in batch:
            thread.start()
        for thread in batch:
            thread.join(300)
    said = capsys.readouterr()
    assert [code for code, _, _ in results] == [0] * 20, said.err
    assert said.err == ""
    assert [left for _, left, _ in results] == [[]] * 20
    assert {status for _, _, status in results} <= {"finished", "cancelled"}
    assert all(store.run(run_id).status == "cancelled" for run_id in run_ids)
    for run_id in run_ids:
        assert f"run {run_id}: " in said.out
    assert said.out.count(" removed") == 20  # N sandboxes, or 1 sandbox


@pytest.mark.usefixtures("docker_test")
def test_containers_removed_while_being_listed_are_no_error(docker_client: Any) -> None:
    """Three removals of one run's sandboxes at once (as `hemra cancel`, a trial's teardown and
    a reaper may meet), while something else removes them one by one: each lists containers
    another has just removed, and none of them fails."""
    from pytest_hemra.execute.sandbox.docker import DockerProvider

    run_id = f"race-{os.getpid()}-{time.monotonic_ns()}"
    labels = {"hemra": "1", "hemra.run": run_id}
    made = [
        docker_client.containers.create(BASE_IMAGE, ["true"], labels=labels, network_mode="none")
        for _ in range(12)
    ]
    failures: list[BaseException] = []

    def remove_sandboxes() -> None:
        try:
            DockerProvider().remove_sandboxes({"hemra.run": run_id})
        except BaseException as error:  # collected: asserted below
            failures.append(error)

    def remove_one_by_one() -> None:
        for container in reversed(made):
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                container.remove(force=True)

    threads = [threading.Thread(target=remove_sandboxes) for _ in range(3)]
    threads.append(threading.Thread(target=remove_one_by_one))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert failures == []
    assert sandboxes(docker_client, run_id) == []


@pytest.fixture
def recorded_run(
    tmp_path: Path, make_task: TaskMaker, write_harness: Callable[[str, str], Path]
) -> Callable[..., str]:
    """Record a run of `tasks` tasks on this machine's engine, of a harness that sleeps, in the
    store at `store_path`; its id."""
    from pytest_hemra.execute.provisioning import provision
    from pytest_hemra.execute.sandbox.docker import DockerProvider
    from pytest_hemra.resolve.overrides import Overrides
    from pytest_hemra.resolve.plan import record_plan, resolve_plan

    def record(store_path: Path, tasks: int, sleep: float) -> str:
        for n in range(tasks):
            make_task(f"task-{n}")
        write_harness(
            "sleeper",
            f"""\
            kind = "program"
            command = ["bash", "-c", "sleep {sleep}; echo hi > /app/out.txt"]
            """,
        )
        run_file = tmp_path / "run.toml"
        run_file.write_text('harnesses = ["sleeper"]\ndatasets = ["ds"]\n')
        plan = resolve_plan(run_file, Overrides(), tmp_path)
        provision(plan, {"docker": DockerProvider})
        return record_plan(plan, Store(store_path))

    return record


def work_run(store_path: Path, run_id: str, workers: int) -> list[threading.Thread]:
    """Runners working a recorded run's trials (threads of this process, started), each trial
    as the pytest item does: run, then its next attempt while there is one."""
    from pytest_hemra.execute.sandbox.docker import DockerProvider
    from pytest_hemra.resolve.plan import load_recorded
    from pytest_hemra.run.job import Runner

    run = load_recorded(Store(store_path), run_id)

    def work(number: int) -> None:
        owner = f"gw{number}@{os.uname()[1]}:{os.getpid()}"
        runner = Runner(Store(store_path), run, DockerProvider(), owner)
        try:
            for planned in run.trials[number::workers]:
                trial: Any = planned
                while trial is not None:
                    runner.work(trial)
                    trial = runner.next_attempt(runner.store.trial(trial.id))
        finally:
            runner.close()

    threads = [threading.Thread(target=work, args=(n,), daemon=True) for n in range(workers)]
    for thread in threads:
        thread.start()
    return threads


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
def test_a_store_locked_by_another_process_past_its_timeout_loses_nothing(
    tmp_path: Path, recorded_run: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process holds the store's write lock for 8 s, past the runners' 1 s timeout
    (HEMRA_STORE_TIMEOUT_SECS), while trials finish and start: their writes wait for it."""
    for name, value in {**QUICK_WAITS, "HEMRA_STORE_TIMEOUT_SECS": "1"}.items():
        monkeypatch.setenv(name, value)
    store_path = tmp_path / ".hemra" / "hemra.db"
    run_id = recorded_run(store_path, 6, 1)
    workers = work_run(store_path, run_id, 2)
    wait_for(lambda: 1 <= finished(store_path) <= 3, 120, "one to three trials finished")
    holder = subprocess.run(
        [sys.executable, "-c", LOCK_HOLDER, str(store_path), "8"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert holder.stdout.split()[::2] == ["locked", "released"], holder.stderr
    left = int(holder.stdout.split()[1])  # trials not finished when the lock was taken
    assert left >= 2, "the trials had all but finished before the lock was taken"
    for worker in workers:
        worker.join(120)
    store = Store(store_path)
    trials = store.trials(run_id, history=True)
    assert len(trials) == 6 and all(t.outcome == "pass" for t in trials)
    assert store.run(run_id).status == "finished"
    waits = [e for e in store.events([t.id for t in trials]) if e.kind == "store_wait"]
    assert waits and all("database is locked" in e.data["error"] for e in waits)
    assert all(float(e.data["waited"]) < 20 for e in waits)


LOCK_HOLDER = """
import sqlite3, sys, time
connection = sqlite3.connect(sys.argv[1], isolation_level=None)
connection.execute("BEGIN EXCLUSIVE")
left = "SELECT count(*) FROM trials WHERE status IN ('planned', 'running')"
print("locked", connection.execute(left).fetchone()[0], flush=True)
time.sleep(float(sys.argv[2]))
connection.execute("COMMIT")
print("released", flush=True)
"""


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 32 MB tmpfs of this test's own, unmounted on every path."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        message = "needs root to mount a small filesystem"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    folder = tmp_path / "disk"
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(folder: Path) -> Path:
    """Write zeros into `folder` until its disk is full; the file that did it."""
    path = folder / "filler"
    with path.open("wb") as handle:
        try:
            while True:
                handle.write(b"\0" * (1 << 20))
                handle.flush()
        except OSError:
            pass
    return path


@pytest.mark.usefixtures("docker_test")
def test_the_stores_disk_full_for_a_moment_loses_no_trial(
    tmp_path: Path,
    recorded_run: Callable[..., str],
    small_disk: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The disk of the store and the trial folders fills up while a trial's agent runs, and
    stays full until the trial has tried to write its diff: what is written waits for space,
    that trial runs again (using up no retry), and every trial passes. Space comes back before
    the trial has been torn down and classed; the full disk it met still classes it."""
    for name, value in QUICK_WAITS.items():
        monkeypatch.setenv(name, value)
    store_path = small_disk / ".hemra" / "hemra.db"
    run_id = recorded_run(store_path, 3, 2)
    workers = work_run(store_path, run_id, 2)
    folders = small_disk / ".hemra" / "runs" / run_id / "ds"

    def agent_running() -> list[Path]:
        return [
            started.parent.parent
            for started in folders.glob("*/*/agent/stdout.txt")
            if not (started.parent.parent / "diff.patch").exists()
        ]

    wait_for(lambda: bool(agent_running()), 120, "a trial's agent running")
    (folder,) = agent_running()[:1]
    filler = fill(small_disk)
    wait_for(lambda: (folder / "diff.patch").exists(), 120, "the trial writing its diff")
    filler.unlink()  # at once: the trial's teardown may still be running when space is back
    for worker in workers:
        worker.join(120)
    store = Store(store_path)
    current = store.trials(run_id)
    seen = [(t.item_id, t.outcome, t.retries, t.cause, t.error) for t in current]
    assert len(current) == 3 and all(t.outcome == "pass" and t.retries == 0 for t in current), seen
    assert store.run(run_id).status == "finished"
    history = store.trials(run_id, history=True)
    (full,) = [t for t in history if t.trial_dir == str(folder)]
    assert (full.status, full.outcome, full.cause) == (
        "replaced", "infra_error", "runner_disk_full"
    )  # fmt: skip
    assert "No space left on device" in (full.error or "")
    assert json.loads((folder / "result.json").read_text())["cause"] == "runner_disk_full"
    assert all(json.loads(Path(t.trial_dir or "", "result.json").read_text()) for t in current)


def test_an_engine_that_does_not_come_back_is_given_up_on_and_the_run_left_to_resume(
    tmp_path: Path,
    make_task: TaskMaker,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A runner whose engine never answers (nothing listens at its address) waits for it up
    to HEMRA_ENGINE_GIVE_UP_SECS, then its trial ends `engine_gone`, not run again (retries
    left or not); its next trial finds the engine still down and ends so at once."""
    from pytest_hemra.execute.sandbox.docker import DockerProvider
    from pytest_hemra.resolve.overrides import Overrides
    from pytest_hemra.resolve.plan import load_recorded, record_plan, resolve_plan
    from pytest_hemra.run.job import Runner
    from tests.upstream import closed_port

    for name, value in {**QUICK_WAITS, "HEMRA_ENGINE_GIVE_UP_SECS": "2"}.items():
        monkeypatch.setenv(name, value)
    # progress to this test's stderr, not to the one an earlier session of this process kept
    monkeypatch.setattr(progress, "_kept", None)
    make_task("one")
    make_task("two")
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["oracle"]\ndatasets = ["ds"]\nmax_infra_retries = 2\n')
    store = Store(tmp_path / "hemra.db")
    run = load_recorded(store, record_plan(resolve_plan(run_file, Overrides(), tmp_path), store))
    address = f"tcp://127.0.0.1:{closed_port()}"
    dead = docker.DockerClient(base_url=address, version="1.41", timeout=5)
    owner = f"w@{os.uname()[1]}:{os.getpid()}"
    runner = Runner(store, run, DockerProvider(dead, engine=address), owner)
    took = []
    for trial in run.trials:
        started = time.monotonic()
        assert runner.work(trial) is None
        took.append(time.monotonic() - started)
        assert runner.next_attempt(store.trial(trial.id)) is None
    runner.close()
    assert took[0] >= 1 and took[1] < 1  # the second did not wait the give-up total again
    trials = store.trials(run.id, history=True)
    assert [(t.outcome, t.cause, t.retries) for t in trials] == [
        ("infra_error", "engine_gone", 0)
    ] * 2
    assert all(f"engine {address} did not answer for" in (t.error or "") for t in trials)
    kinds = [e.kind for e in store.events([t.id for t in trials])]
    assert kinds == ["engine_down", "engine_gone", "finished"] * 2
    assert store.run(run.id).status == "finished"
    waiting = capsys.readouterr().err  # the wait says so, on stderr (a line, not a tty)
    assert f"hemra: trial {trials[0].id}: waiting for engine {address} to answer" in waiting
    assert hemra(["show", trials[0].id, "--store", str(store.path)]) == 0
    shown = capsys.readouterr().out
    assert f"engine_gone: engine {address} did not answer for " in shown
    assert "s: given up (" in shown


def test_a_store_locked_past_its_give_up_stops_the_runner_and_leaves_the_run_to_resume(
    tmp_path: Path, make_task: TaskMaker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Locked for longer than HEMRA_STORE_GIVE_UP_SECS: the runner's claim gives up with one
    line naming the store and `--resume`, it runs no more trials, and the trial stays queued."""
    from pytest_hemra.execute.sandbox.docker import DockerProvider
    from pytest_hemra.resolve.overrides import Overrides
    from pytest_hemra.resolve.plan import load_recorded, record_plan, resolve_plan
    from pytest_hemra.run.job import Runner

    waits = {"HEMRA_STORE_TIMEOUT_SECS": "0.2", "HEMRA_STORE_GIVE_UP_SECS": "1"}
    for name, value in {**QUICK_WAITS, **waits}.items():
        monkeypatch.setenv(name, value)
    make_task("one")
    make_task("two")
    (tmp_path / "run.toml").write_text('harnesses = ["oracle"]\ndatasets = ["ds"]\n')
    store = Store(tmp_path / "hemra.db")
    plan = resolve_plan(tmp_path / "run.toml", Overrides(), tmp_path)
    run = load_recorded(store, record_plan(plan, store))
    runner = Runner(store, run, DockerProvider(), f"w@{os.uname()[1]}:{os.getpid()}")
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(store.path), "4"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().startswith("locked ")
        with pytest.raises(StoreUnavailable) as gave_up:
            runner.work(run.trials[0])
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            runner.work(run.trials[1])  # lost to this runner: no second wait
        assert time.monotonic() - started < 0.5
    finally:
        holder.wait(30)
    message = str(gave_up.value)
    assert message.startswith(f"{store.path}: database is locked (for ")
    assert message.endswith(f"`hemra run --resume {run.id}` finishes the run")
    assert "\n" not in message
    assert [(t.status, store.job_state(t.id)) for t in store.trials(run.id)] == [
        ("planned", "queued")
    ] * 2


HOG = """
import socket, sys
held = []
for port in range(int(sys.argv[2]), int(sys.argv[3])):
    if port % 2000 == 0:
        continue  # a few left free: the gateway's fallback finds one
    sock = socket.socket()
    try:
        sock.bind((sys.argv[1], port))
    except OSError:
        sock.close()
        continue
    held.append(sock)
print(len(held), flush=True)
sys.stdin.read()
"""


@pytest.fixture
def taken_ports() -> Iterator[str]:
    """A loopback address of its own on which nearly every ephemeral port is taken (by two
    processes: one holds no more than its open-file limit); the address."""
    (host,) = free_loopback_hosts(1, first=120)
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    middle = (low + high) // 2
    hogs = [
        subprocess.Popen(
            [sys.executable, "-c", HOG, host, str(start), str(end)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for start, end in ((low, middle), (middle, high + 1))
    ]
    try:
        held = sum(int(hog.stdout.readline() or 0) for hog in hogs if hog.stdout is not None)
        assert held > (high - low) * 0.9, f"only {held} ports held on {host}"
        yield host
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def test_the_gateway_listens_when_its_port_is_taken_on_a_sandbox_address(
    taken_ports: str,
) -> None:
    """The gateway and its egress proxy take one port on loopback and try it on each address
    sandboxes reach them at; taken there, each listens on another port of that address."""
    from pytest_hemra.execute.gateway.server import Gateway
    from pytest_hemra.resolve.upstreams import BUILTIN_UPSTREAMS

    with Gateway(BUILTIN_UPSTREAMS, lambda call: None, ["127.0.0.1", taken_ports]) as gateway:
        urls = [gateway.base_urls, gateway.egress.urls]
        assert all(set(found) == {"127.0.0.1", taken_ports} for found in urls)
        for url in gateway.base_urls.values():
            with contextlib.suppress(urllib.error.HTTPError):
                urllib.request.urlopen(f"{url}/t/nobody/v1/messages", timeout=10)
            assert urlsplit(url).port
        ports = [{urlsplit(u).port for u in found.values()} for found in urls]
        assert all(len(found) == 2 for found in ports)  # the first host's port was taken


@pytest.mark.usefixtures("docker_test")
def test_a_run_whose_gateway_port_is_taken_at_start_finishes(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker, taken_ports: str
) -> None:
    """A pool run (this machine's engine) whose sandboxes reach the gateway at an address on
    which its port is taken: every trial still runs (the gateway could not start before)."""
    for name in ("one", "two"):
        make_task(name, task_toml=OFFLINE_TASK)
    run_file = tmp_path / "run.toml"
    address = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    run_file.write_text(
        'harnesses = ["oracle"]\ndatasets = ["ds"]\n[[sandbox.engines]]\nname = "main"\n'
        f'address = "{address}"\ncapacity = 2\ngateway_host = "{taken_ports}"\n'
    )
    result = pytester.runpytest("--hemra-run", str(run_file))
    result.assert_outcomes(passed=2)


def test_backoff_doubles_with_jitter_to_its_bound() -> None:
    backoff = Backoff(first_secs=1, max_secs=8, give_up_secs=60)
    delays = list(itertools.islice(backoff.delays(random.Random(1)), 8))
    bounds = [1, 2, 4, 8, 8, 8, 8, 8]
    assert all(bound / 2 <= delay <= bound for delay, bound in zip(delays, bounds, strict=True))
    assert len(set(delays)) == len(delays)  # jitter: runners that lost an engine at once spread
    assert engine_backoff({}) == Backoff(1.0, 30.0, 300.0)
    assert store_backoff({"HEMRA_STORE_GIVE_UP_SECS": "7"}) == Backoff(1.0, 30.0, 7.0)


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        (
            {"HEMRA_ENGINE_GIVE_UP_SECS": "soon"},
            "HEMRA_ENGINE_GIVE_UP_SECS: expected a number of seconds greater than 0, got 'soon'",
        ),
        (
            {"HEMRA_BACKOFF_FIRST_SECS": "-1"},
            "HEMRA_BACKOFF_FIRST_SECS: expected a number of seconds greater than 0, got '-1'",
        ),
        (
            {"HEMRA_BACKOFF_FIRST_SECS": "10", "HEMRA_BACKOFF_MAX_SECS": "5"},
            "HEMRA_BACKOFF_MAX_SECS: expected at least HEMRA_BACKOFF_FIRST_SECS (10), got 5",
        ),
    ],
    ids=["not-a-number", "negative", "max-below-first"],
)
def test_bad_backoff_settings_are_refused_in_one_line_naming_the_variable(
    environ: dict[str, str], expected: str
) -> None:
    with pytest.raises(SpecError) as refused:
        engine_backoff(environ)
    assert str(refused.value) == expected
