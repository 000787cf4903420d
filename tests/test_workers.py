"""`hemra worker`: workers sharing one store's queue, one killed mid-run.

The two-worker test runs for real: a PostgreSQL store (tests/postgres.py), a run queued by
`hemra run --detach`, two `hemra worker` processes each with a Docker engine of its own
(tests/dockerd.py; DOCKER_HOST per worker), one of them on a "machine" of its own (its own
host name, so the other can only tell it is gone by its leases expiring), killed with SIGKILL
in the middle of the run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from conftest import BASE_IMAGE, REPO, TaskMaker, wait_for
from pytest_hemra.cli import main as hemra
from pytest_hemra.core.records import PlannedTrial
from pytest_hemra.store import Store
from tests.dockerd import ExtraEngine, running_engines
from tests.records import trial_result

OFFLINE_TASK = "[agent]\ntimeout_sec = 60\n[verifier]\ntimeout_sec = 30\n" + (
    "[environment]\nallow_internet = false\n"  # the extra engines have no bridge network
)
FAILING_TEST = "echo 0 > /logs/verifier/reward.txt"
LEASE_SECS = 5


def planned(task: str) -> PlannedTrial:
    return PlannedTrial("ds", task, "h", 1)


def test_a_trial_whose_runner_is_gone_is_taken_over_once(
    tmp_path: Path, store_address: str
) -> None:
    """A runner on another machine counts as alive until its lease expires; then the trial is
    taken over once (a second taker gets nothing), and the old runner's late result is not
    kept: the trial has one current row, the new one."""
    store = Store(store_address)
    store.record_plan("r1", "run", {}, tmp_path, [planned("a"), planned("b")])
    first, second = store.trials("r1")
    store.claim(first.id, "main@elsewhere:1", 0.5)
    store.claim(second.id, "main@elsewhere:1", 30)
    assert store.take_over(first.id, lambda owner: True) is None  # its lease runs
    time.sleep(0.6)
    taken = store.take_over(first.id, lambda owner: True)
    assert taken is not None and taken.replaces == first.id and taken.retries == 0
    assert store.job_state(taken.id) == "queued"
    assert store.take_over(first.id, lambda owner: True) is None  # taken once
    assert store.replacement(first.id) == taken
    assert store.replace_trial(first.id, retry=False) == taken  # a resume gets the same row
    dead = store.take_over(second.id, lambda owner: False)  # seen dead (this host): at once
    assert dead is not None
    assert store.heartbeat(first.id, "main@elsewhere:1", 30) is None  # its lease is gone

    late = {"outcome": "pass", "reward": 1.0, "rewards": {}, "exit_code": 0, "error": None}
    late |= {"finished_at": time.time(), "duration": 1.0, "phases": {}, "trial_dir": None}
    store.finish_trial(first.id, trial_result(late))
    assert store.trial(first.id).status == "replaced"
    assert [t.id for t in store.trials("r1")] == [taken.id, dead.id]


def test_a_worker_on_an_empty_queue_exits_0_with_once(
    tmp_path: Path, store_address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    Store(store_address).close()  # the store exists, with no run
    assert hemra(["worker", "--store", store_address, "--once"]) == 0


@pytest.mark.parametrize(
    "address", ["postgresql://hemra:s3cret@db:port/hemra", "postgresql://hemra@db/x?sslmode=no"]
)
def test_a_worker_given_a_malformed_store_url_exits_4_in_one_line(
    address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert hemra(["worker", "--store", address, "--once"]) == 4
    said = capsys.readouterr()
    assert said.out == ""
    assert said.err.startswith("hemra: ") and said.err.count("\n") == 1
    assert "s3cret" not in said.err


# --- two workers, one killed mid-run ---------------------------------------------------------


@pytest.fixture(scope="module")
def worker_engines(docker_client: Any) -> Iterator[list[ExtraEngine]]:
    """Two more engines on this machine, one a worker, each holding the tasks' base image;
    removed (processes, mounts, folders) on every path."""
    with running_engines(2, "more engines", first=60, image=(docker_client, BASE_IMAGE)) as found:
        yield found


def hemra_containers(address: str) -> list[str]:
    client = docker.DockerClient(base_url=address, timeout=30)
    try:
        return [
            c.name
            for c in client.containers.list(
                all=True, ignore_removed=True, filters={"label": "hemra"}
            )
        ]
    finally:
        client.close()


RESULT_KEYS = ("planned", "finished", "scored", "passes", "tasks", "outcomes", "reward")
RESULT_KEYS += ("pass_rate", "pass_at_k", "pass_hat_k")


def results(report: dict[str, Any]) -> list[Any]:
    """A report's results per dataset and harness (not its run id, store, times or costs):
    what two runs of one plan must share."""
    return [
        (
            dataset["name"],
            dataset["digest"],
            [{key: row[key] for key in ("harness", *RESULT_KEYS)} for row in dataset["harnesses"]],
        )
        for dataset in report["datasets"]
    ]


def outcomes(store: Store, run_id: str) -> dict[tuple[str, str, int], str | None]:
    """Each trial's outcome by harness, task and attempt."""
    return {(t.harness, t.task, t.attempt): t.outcome for t in store.trials(run_id)}


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
def test_two_workers_finish_a_run_when_one_is_killed_mid_run(
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[[str, str], Path],
    worker_engines: list[ExtraEngine],
    postgres_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """12 trials of 3 s (one task failing by design) queued in PostgreSQL, worked by two
    workers at 3 trials at once each, on engines of their own; worker A, on a host name of
    its own, is killed with SIGKILL once it runs trials. B takes A's trials over when their
    leases expire (5 s), and finishes the run: each trial finishes once, nothing is left on
    either engine (A's leftovers removed by a worker started on its engine again), and the
    report equals that of the same plan run by one `pytest --hemra-run` on SQLite."""
    for n in range(4):
        make_task(f"task-{n}", task_toml=OFFLINE_TASK, **({"test": FAILING_TEST} if n == 0 else {}))
    write_harness(
        "sleeper",
        'kind = "program"\ncommand = ["bash", "-c", "sleep 3; echo hi > /app/out.txt"]\n',
    )
    plan = 'harnesses = ["sleeper"]\ndatasets = ["ds"]\nattempts = 3\nconcurrency = 3\n'
    (tmp_path / "run.toml").write_text(plan + 'trials_dir = "shared/trials"\n')
    env = {
        **os.environ,
        "HEMRA_LEASE_SECS": str(LEASE_SECS),
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    queued = subprocess.run(
        ["hemra", "run", "run.toml", "--detach", "--store", postgres_url],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert queued.returncode == 0, queued.stderr
    run_id = queued.stdout.strip()
    store = Store(postgres_url)
    assert len(store.trials(run_id)) == 12

    engine_a, engine_b = worker_engines
    logs: dict[str, Path] = {}

    def start_worker(name: str, engine: ExtraEngine, *flags: str) -> subprocess.Popen[bytes]:
        folder = tmp_path / name
        folder.mkdir(exist_ok=True)
        logs[name] = folder / "worker.log"
        argv = ["hemra", "worker", "--store", postgres_url, *flags]
        if name.startswith("a"):  # a machine of its own: a host name of its own
            argv = ["unshare", "--uts", "--", "sh", "-c", 'hostname "$0"; exec "$@"', name, *argv]
        with logs[name].open("ab") as log:
            return subprocess.Popen(
                argv,
                cwd=folder,
                env={**env, "DOCKER_HOST": engine.address},
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def log_tails() -> str:
        return "\n".join(f"--- {n}\n{p.read_text()[-3000:]}" for n, p in logs.items())

    def running_on(host: str) -> list[str]:
        return [
            t.id
            for t in store.trials(run_id)
            if t.status == "running" and (store.trial_detail(t.id).worker or "").count(f"@{host}:")
        ]

    started = time.monotonic()
    worker_a = start_worker("a-machine", engine_a)
    worker_b = start_worker("b", engine_b)
    try:
        wait_for(lambda: len(running_on("a-machine")) >= 2, 180, "worker A running trials")
        wait_for(lambda: len(hemra_containers(engine_a.address)) >= 2, 30, "A's sandboxes")
        held = running_on("a-machine")
        worker_a.kill()  # SIGKILL: its session dies with it, its sandboxes stay
        killed_at = time.monotonic()
        worker_a.wait(30)
        wait_for(lambda: store.run(run_id).status == "finished", 240, "the run finished")
        finished_at = time.monotonic()
    except BaseException:
        print(log_tails())
        raise
    finally:
        for worker in (worker_a, worker_b):
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
                worker.wait(60)
    assert engine_a.address and hemra_containers(engine_a.address)  # A's, left on its engine
    again = start_worker("a-again", engine_a, "--once")  # its machine back: it sweeps
    assert again.wait(120) == 0, log_tails()
    assert hemra_containers(engine_a.address) == [] and hemra_containers(engine_b.address) == []

    current = store.trials(run_id)
    history = store.trials(run_id, history=True)
    assert len(current) == 12 and len({t.item_id for t in current}) == 12, log_tails()
    assert all(t.status == "finished" for t in current)
    taken = [t for t in current if t.replaces in held]
    assert len(taken) == len(held)  # each trial A ran when it died, taken over once
    assert {t.id for t in history if t.status == "replaced"} >= set(held)
    b_worker = {store.trial_detail(t.id).worker for t in taken}
    assert all(w and "@a-machine:" not in w for w in b_worker)

    capsys.readouterr()
    assert hemra(["report", run_id, "--store", postgres_url, "--format", "json"]) == 0
    shared = json.loads(capsys.readouterr().out)

    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "run.toml").write_text(plan)
    for folder in ("datasets", "harnesses"):
        (alone / folder).symlink_to(tmp_path / folder)
    single = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--hemra-run",
         "run.toml", "--hemra-store", str(alone / "s.db")],
        cwd=alone, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert single.returncode == 1, single.stdout[-3000:]  # task-0 fails, by design
    (single_run,) = Store(alone / "s.db").runs()
    capsys.readouterr()
    assert hemra(["report", single_run.id, "--store", str(alone / "s.db"), "--format", "json"]) == 0
    by_one = json.loads(capsys.readouterr().out)
    assert results(shared) == results(by_one)
    assert shared["datasets"][0]["harnesses"][0]["outcomes"] == {"pass": 9, "fail": 3}
    assert outcomes(store, run_id) == outcomes(Store(alone / "s.db"), single_run.id)
    print(
        f"12 trials, {len(held)} taken over; killed after {killed_at - started:.1f} s,"
        f" run finished {finished_at - killed_at:.1f} s later"
    )
