"""The harbor harness kind: a harness's trials run by Harbor itself, as supervised Harbor jobs.

Each trial item still claims its own job in the store. The first item of a (harness, dataset)
that finds no Harbor job coming for its task starts one (harbor_job.py) for every unfinished
trial of that harness and dataset; every item then waits for a Harbor trial of its task,
claims the earliest unclaimed one and imports it as its result (harbor_result.py). Items in
other xdist workers, or in a later `--hemra-resume`, agree on jobs and claims through the
run's board of shared jobs in the store (`store/shared.py`). The waiting items are the
jobs' supervisors: they end a job whose runner has exited, stop one past its deadline, and
stop their harness's jobs when the run is cancelled or interrupted.

What HEMRA cannot observe: Harbor's agents call their models directly, not through HEMRA's
gateway (their tokens are recorded as zero and the report flags the harness); Harbor builds
its own task images and runs its own verifier, in the agent's container.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import docker

from pytest_hemra.core.errors import HemraError, InfraError, outcome_of
from pytest_hemra.core.lifecycle import JobState, TrialStatus
from pytest_hemra.core.outcome import Outcome
from pytest_hemra.core.records import TrialRecord
from pytest_hemra.core.trial import TrialResult
from pytest_hemra.execute.context import TrialContext
from pytest_hemra.execute.kinds.harbor.job import (
    HarborJob,
    end_job,
    is_running,
    launch_job,
    no_result_message,
    stop_job,
)
from pytest_hemra.execute.kinds.harbor.result import HarborTrialResult, classify, read_harbor_result
from pytest_hemra.execute.sandbox.client import connect
from pytest_hemra.resolve.plan import RecordedRun
from pytest_hemra.store import Store

KIND = "harbor"  # the board's name in the store
POLL_SECS = 0.5
EXIT_WAIT_SECS = 120.0  # for the runner to exit once every result of its job is written


@dataclass
class Board:
    """A run's Harbor jobs and which HEMRA trial claimed which Harbor trial."""

    jobs: list[HarborJob] = field(default_factory=list)
    claims: dict[str, str] = field(default_factory=dict)  # "job/trial folder" -> trial id


class Cancelled(HemraError):
    """The trial was cancelled while it waited for Harbor."""


@dataclass(frozen=True)
class Waiting:
    """One HEMRA trial waiting for its Harbor result."""

    context: TrialContext
    run: RecordedRun
    store: Store
    trial: TrialRecord

    @property
    def root(self) -> Path:
        """The run's Harbor folder: Harbor's jobs directory, configs and logs."""
        return self.run.trials_dir.resolve() / "harbor"

    @property
    def dataset_path(self) -> Path:
        return self.run.dataset_paths[self.trial.dataset].resolve()

    def is_mine(self, job: HarborJob) -> bool:
        return (job.harness, job.dataset) == (self.trial.harness, self.trial.dataset)


def run_harbor_trial(
    context: TrialContext, run: RecordedRun, store: Store, trial: TrialRecord
) -> TrialResult:
    """A harbor harness's trial: its Harbor result once Harbor has one; never raises for what
    a trial can end in."""
    started_at = time.time()
    clock = time.monotonic()
    context.trial_dir.mkdir(parents=True, exist_ok=True)
    waiting = Waiting(context, run, store, trial)
    try:
        key, found = _await_result(waiting)
        result = _import(waiting, key, found, started_at, time.monotonic() - clock)
    except Cancelled as cancelled:
        result = _unfinished(waiting, Outcome.CANCELLED, str(cancelled), started_at, clock)
    except HemraError as failure:
        result = _unfinished(waiting, outcome_of(failure)[0], str(failure), started_at, clock)
    except Exception as failure:  # anything unexpected under a trial is infrastructure
        message = f"{type(failure).__name__}: {failure}"
        result = _unfinished(waiting, "infra_error", message, started_at, clock)
    (context.trial_dir / "result.json").write_text(json.dumps(asdict(result), indent=2) + "\n")
    return result


def _unfinished(
    waiting: Waiting, outcome: str, error: str, started_at: float, clock: float
) -> TrialResult:
    return TrialResult(
        outcome=outcome,
        reward=None,
        rewards={},
        exit_code=None,
        error=error,
        started_at=started_at,
        finished_at=time.time(),
        duration=round(time.monotonic() - clock, 4),
        phases={"harbor_wait": round(time.monotonic() - clock, 4)},
        trial_dir=str(waiting.context.trial_dir),
        retried=outcome == "infra_error",
    )


def _import(
    waiting: Waiting, key: str, found: HarborTrialResult, started_at: float, waited: float
) -> TrialResult:
    """The Harbor trial as this trial's result; its folder copied in, the job's linked."""
    folder = waiting.context.trial_dir
    source = waiting.root / key
    shutil.rmtree(folder / "harbor", ignore_errors=True)
    shutil.copytree(source, folder / "harbor", symlinks=True)
    job_link = folder / "harbor-job"
    if job_link.is_symlink():
        job_link.unlink()
    job_link.symlink_to(os.path.relpath(source.parent, folder))
    outcome, reward, rewards, error = classify(found, waiting.context.reward_keys)
    phases = {"harbor_wait": round(waited, 4), **found.phases()}
    return TrialResult(
        outcome=outcome,
        reward=reward,
        rewards=rewards,
        exit_code=None,
        error=error,
        started_at=found.started_at.timestamp() if found.started_at else started_at,
        finished_at=found.finished_at.timestamp() if found.finished_at else time.time(),
        duration=found.duration if found.duration is not None else round(waited, 4),
        phases=phases,
        trial_dir=str(folder),
        own_report=found.own_report(),
        retried=outcome == "infra_error",
    )


def _await_result(waiting: Waiting) -> tuple[str, HarborTrialResult]:
    """Claim a Harbor trial of this task: from a job already running, or from one started
    here. A job started after this wait began that ends without one is an infra_error.
    Cancelled or interrupted, it stops its harness's jobs on this dataset."""
    since = time.time()
    client = connect()
    try:
        while True:
            claimed = _poll(client, waiting, since)
            if claimed is not None:
                return claimed
            if waiting.store.job_state(waiting.trial.id) == JobState.CANCELLING:
                _stop_all(client, waiting, Outcome.CANCELLED)
                raise Cancelled("cancelled by hemra cancel")
            time.sleep(POLL_SECS)
    except KeyboardInterrupt:
        _stop_all(client, waiting, "interrupted (Ctrl-C)")
        raise


def _poll(
    client: docker.DockerClient, waiting: Waiting, since: float
) -> tuple[str, HarborTrialResult] | None:
    """One look at the board: supervise this harness's jobs on this dataset, claim a result
    if there is one, else start jobs if none will bring one."""
    task = waiting.trial.task
    finishing: str | None = None
    with _board(waiting) as board:
        mine = [job for job in board.jobs if waiting.is_mine(job)]
        _supervise(client, waiting.root, mine)
        results = {job.name: _results(waiting.root, job) for job in mine}
        claimed = _claim(board, mine, results, task, waiting.trial.id)
        if claimed is not None:
            job = next(job for job in mine if claimed[0].startswith(job.name + "/"))
            produced = results[job.name]
            if not job.ended and all(
                _produced(produced, name) >= count for name, count in job.tasks.items()
            ):
                finishing = job.name
        elif _pending(mine, results, task) == 0:
            # a job that ended without a result for this wait (one started since, or one that
            # exited having produced nothing at all: Harbor refused it) is an answer: no new
            # job. One stopped (cancelled, interrupted) is not: a resume starts another.
            spent = [
                job
                for job in mine
                if job.ended
                and task in job.tasks
                and (job.started_at >= since or (_exited(job) and not results[job.name]))
            ]
            if spent:
                raise InfraError(no_result_message(waiting.root, spent[-1], task))
            _start_jobs(client, waiting, board, mine, results)
    if finishing is not None:  # every result of its job is in: see the job out, unlocked
        _end_when_exited(client, waiting, finishing)
    return claimed


@contextmanager
def _board(waiting: Waiting) -> Iterator[Board]:
    """The run's board, read from the store and written back under its write lock."""
    waiting.root.mkdir(parents=True, exist_ok=True)
    with waiting.store.locked_shared_board(waiting.run.id, KIND) as shared:
        board = Board([HarborJob.model_validate(job) for job in shared.jobs], shared.claims)
        try:
            yield board
        finally:  # a job started before a failure is on the board all the same
            shared.jobs = [job.model_dump(mode="json") for job in board.jobs]


def _results(root: Path, job: HarborJob) -> list[tuple[str, HarborTrialResult]]:
    """The job's finished Harbor trials, as ("job/trial folder", result)."""
    found = []
    for path in sorted((root / job.name).glob("*/result.json")):
        result = read_harbor_result(path)
        if result is not None:
            found.append((f"{job.name}/{path.parent.name}", result))
    return found


def _exited(job: HarborJob) -> bool:
    """Whether the job's runner exited by itself (rather than being stopped)."""
    return bool(job.ended and job.ended.startswith("exited"))


def _produced(results: list[tuple[str, HarborTrialResult]], task: str) -> int:
    return sum(result.task == task for _, result in results)


def _pending(
    jobs: list[HarborJob], results: dict[str, list[tuple[str, HarborTrialResult]]], task: str
) -> int:
    """How many more Harbor trials of `task` running jobs will still produce."""
    return sum(
        max(0, job.tasks.get(task, 0) - _produced(results[job.name], task))
        for job in jobs
        if not job.ended
    )


def _claim(
    board: Board,
    jobs: list[HarborJob],
    results: dict[str, list[tuple[str, HarborTrialResult]]],
    task: str,
    trial_id: str,
) -> tuple[str, HarborTrialResult] | None:
    """The earliest finished, unclaimed Harbor trial of `task`, now claimed by `trial_id`."""
    candidates = [
        (result.finished_at.timestamp() if result.finished_at else 0.0, key, result)
        for job in jobs
        for key, result in results[job.name]
        if result.task == task and key not in board.claims
    ]
    if not candidates:
        return None
    _, key, result = min(candidates, key=lambda found: (found[0], found[1]))
    board.claims[key] = trial_id
    return key, result


def _start_jobs(
    client: docker.DockerClient,
    waiting: Waiting,
    board: Board,
    mine: list[HarborJob],
    results: dict[str, list[tuple[str, HarborTrialResult]]],
) -> None:
    """Harbor jobs for every unfinished trial of this harness and dataset that no running job
    or unclaimed result covers; one job per attempt count (Harbor's -k is per job)."""
    rows = [
        row
        for row in waiting.store.trials(waiting.run.id)
        if (row.harness, row.dataset) == (waiting.trial.harness, waiting.trial.dataset)
        and row.status in TrialStatus.UNFINISHED
    ]
    unclaimed = Counter(
        result.task for job in mine for key, result in results[job.name] if key not in board.claims
    )
    needed: dict[str, int] = {}
    for task, count in Counter(row.task for row in rows).items():
        missing = count - unclaimed[task] - _pending(mine, results, task)
        if missing > 0:
            needed[task] = missing
    needed[waiting.trial.task] = max(needed.get(waiting.trial.task, 0), 1)
    by_count: dict[int, list[str]] = {}
    for task, count in sorted(needed.items()):
        by_count.setdefault(count, []).append(task)
    for count, tasks in sorted(by_count.items()):
        index = len([job for job in board.jobs if waiting.is_mine(job)]) + 1
        name = f"{waiting.trial.harness}__{waiting.trial.dataset}__{index}"
        dataset = (waiting.trial.dataset, waiting.dataset_path)
        planned = {task: count for task in tasks}
        job = launch_job(
            client, waiting.run, waiting.context.harness, dataset, planned, name, waiting.root
        )
        board.jobs.append(job)


def _supervise(client: docker.DockerClient, root: Path, jobs: list[HarborJob]) -> None:
    """End the jobs whose runner is gone, and stop those past their deadline."""
    for job in jobs:
        if job.ended:
            continue
        if not is_running(client, job):
            end_job(client, root, job)
        elif time.time() > job.deadline:
            stop_job(
                client, job, f"stopped: past its deadline ({job.deadline - job.started_at:.0f} s)"
            )


def _end_when_exited(client: docker.DockerClient, waiting: Waiting, name: str) -> None:
    """Every result of the job is in: give its runner a moment to exit (no lock held), then
    end the job, so no waiting item is needed for its clean-up."""
    with _board(waiting) as board:
        job = next(job for job in board.jobs if job.name == name)
    deadline = time.monotonic() + EXIT_WAIT_SECS
    while is_running(client, job) and time.monotonic() < deadline:
        time.sleep(POLL_SECS)
    with _board(waiting) as board:
        job = next(job for job in board.jobs if job.name == name)
        if job.ended:
            return
        if is_running(client, job):
            stop_job(client, job, "stopped: every result was in but the runner did not exit")
        else:
            end_job(client, waiting.root, job)


def _stop_all(client: docker.DockerClient, waiting: Waiting, why: str) -> None:
    with _board(waiting) as board:
        for job in board.jobs:
            if waiting.is_mine(job) and not job.ended:
                stop_job(client, job, why)
