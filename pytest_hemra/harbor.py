"""The harbor harness kind: a harness's trials run by Harbor itself, as supervised Harbor jobs.

A Harbor job (`harbor run`) runs in the runner image (harbor_image.py) with the Docker socket
mounted, and the dataset and the run's `harbor/` folder mounted at the same paths as on the
host: Harbor hands those paths to Docker, which resolves them on the host. Each trial item
still claims its own job in the store; the first item of a (harness, dataset) that finds no
Harbor job coming for its task starts one for every unfinished trial of that harness and
dataset, and every item then waits for a Harbor trial of its task, claims it and imports it
as its result. Items in other xdist workers agree on jobs and claims through the board, a
JSON file under a file lock in the run's `harbor/` folder. A waiting item is also the job's
supervisor: it ends a job whose runner has exited, stops one past its deadline or cancelled,
and then removes every container, network and image the job left behind.

What HEMRA cannot observe: Harbor's agents call their models directly, not through HEMRA's
gateway (their tokens are recorded as zero and the report flags the harness); Harbor builds
its own task images and runs its own verifier, in the agent's container.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import shutil
import stat
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import docker
import docker.errors
from pydantic import BaseModel, ConfigDict, Field

from pytest_hemra.datasets import load_task
from pytest_hemra.errors import HemraError, InfraError, outcome_of
from pytest_hemra.harbor_image import runner_tag
from pytest_hemra.harbor_result import HarborTrialResult, classify, read_harbor_result
from pytest_hemra.installs import ensure_installed, harbor_version
from pytest_hemra.plan import RecordedRun
from pytest_hemra.records import TrialRecord
from pytest_hemra.sandbox.docker import DOCKER_ERRORS, connect, remove_container
from pytest_hemra.store import Store
from pytest_hemra.trial import DEFAULT_TIMEOUT_SECS, TrialContext, TrialResult

BOARD_SCHEMA_VERSION = 1
POLL_SECS = 0.5
EXIT_WAIT_SECS = 120.0  # for the runner to exit once every result of its job is written
JOB_SLACK_SECS = 120.0
TRIAL_SLACK_SECS = 60.0
JOB_LABEL = "hemra.harbor"
# Harbor's stop of a `sleep infinity` container waits out Docker's 10 s grace: 1 s will do
STOP_GRACE = "1s"
# runs harbor with its output in a file and its exit status beside it; arguments stay argv
WRAPPER = 'out="$1"; shift; "$@" >"$out" 2>&1; code=$?; echo "$code" >"$out.exit"; exit "$code"'


class HarborJob(BaseModel):
    """One `harbor run`: which tasks, how many attempts each, its runner, how it ended."""

    model_config = ConfigDict(extra="forbid")

    name: str
    harness: str
    dataset: str
    tasks: dict[str, int]
    container: str
    started_at: float
    deadline: float
    ended: str | None = None


class Board(BaseModel):
    """A run's Harbor jobs and which HEMRA trial claimed which Harbor trial."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = BOARD_SCHEMA_VERSION
    jobs: list[HarborJob] = Field(default_factory=list)
    claims: dict[str, str] = Field(default_factory=dict)  # "job/trial folder" -> trial id


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
        """The run's Harbor folder: Harbor's jobs directory, the board, configs and logs."""
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
        result = _unfinished(waiting, "cancelled", str(cancelled), started_at, clock)
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
    outcome, reward, rewards, error = classify(found)
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
    here. A job started after this wait began that ends without one is an infra_error."""
    since = time.time()
    client = connect()
    task, trial_id = waiting.trial.task, waiting.trial.id
    while True:
        finishing: str | None = None
        with _board(waiting.root) as board:
            mine = [job for job in board.jobs if waiting.is_mine(job)]
            _supervise(client, waiting.root, mine)
            results = {job.name: _results(waiting.root, job) for job in mine}
            claimed = _claim(board, mine, results, task, trial_id)
            if claimed is not None:
                job = next(job for job in mine if claimed[0].startswith(job.name + "/"))
                produced = results[job.name]
                if not job.ended and all(
                    _produced(produced, name) >= count for name, count in job.tasks.items()
                ):
                    finishing = job.name
            elif _pending(mine, results, task) == 0:
                spent = [
                    job
                    for job in mine
                    if job.ended and job.started_at >= since and task in job.tasks
                ]
                if spent:
                    raise InfraError(_no_result(waiting.root, spent[-1], task))
                _start_jobs(client, waiting, board, mine, results)
        if claimed is not None:
            if finishing is not None:
                _end_when_exited(client, waiting, finishing)
            return claimed
        if waiting.store.job_state(trial_id) == "cancelling":
            _stop_all(client, waiting, "cancelled")
            raise Cancelled("cancelled by hemra cancel")
        try:
            time.sleep(POLL_SECS)
        except KeyboardInterrupt:
            _stop_all(client, waiting, "interrupted (Ctrl-C)")
            raise


@contextmanager
def _board(root: Path) -> Iterator[Board]:
    """The run's board, read and written back under an exclusive lock."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "board.json"
    with (root / "board.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            board = Board.model_validate_json(path.read_text()) if path.is_file() else Board()
            try:
                yield board
            finally:  # a job started before a failure is on the board all the same
                partial = path.with_suffix(".partial")
                partial.write_text(board.model_dump_json(indent=1) + "\n")
                partial.replace(path)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _results(root: Path, job: HarborJob) -> list[tuple[str, HarborTrialResult]]:
    """The job's finished Harbor trials, as ("job/trial folder", result)."""
    found = []
    for path in sorted((root / job.name).glob("*/result.json")):
        result = read_harbor_result(path)
        if result is not None:
            found.append((f"{job.name}/{path.parent.name}", result))
    return found


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
        and row.status in ("planned", "running")
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
        board.jobs.append(_launch(client, waiting, name, {task: count for task in tasks}))


def _launch(
    client: docker.DockerClient, waiting: Waiting, name: str, tasks: dict[str, int]
) -> HarborJob:
    """Start one `harbor run` in the runner image, detached; the runner removes itself."""
    harness, spec, run = waiting.context.harness, waiting.context.harness.spec, waiting.run
    ensure_installed(harness)  # a no-op unless the runner image was removed since resolve
    root = waiting.root
    config = root / f"{name}.config.json"
    model = run.spec.model or spec.model
    agent = {"name": spec.agent, "model_name": model, "override_timeout_sec": run.spec.timeout_secs}
    config.write_text(json.dumps({"agents": [agent]}, indent=1) + "\n")
    labels = {"hemra": "1", "hemra.run": run.id, JOB_LABEL: name}
    overlay = root / f"{name}.compose.json"  # compose reads JSON as YAML
    overlay.write_text(
        json.dumps(
            {
                "services": {"main": {"labels": labels, "stop_grace_period": STOP_GRACE}},
                "networks": {"default": {"labels": labels}},
            },
            indent=1,
        )
        + "\n"
    )
    concurrency = run.spec.concurrency
    argv = ["harbor", "run", "-c", str(config), "-p", str(waiting.dataset_path)]
    for task in tasks:
        argv += ["-i", task]
    argv += ["-k", str(max(tasks.values())), "-o", str(root), "--job-name", name]
    argv += ["-n", str(concurrency), "-y", "-q", "--extra-docker-compose", str(overlay)]
    output = root / f"{name}.output.txt"
    socket = _docker_socket(client)
    options: dict[str, Any] = {
        "command": ["sh", "-c", WRAPPER, "harbor-job", str(output), *argv],
        "detach": True,
        "auto_remove": True,
        "labels": {**labels, "hemra.harbor-runner": "1"},
        "name": f"hemra-harbor-{run.id}-{name}".replace("__", "-"),
        "user": f"{os.getuid()}:{os.getgid()}",
        "group_add": [str(os.stat(socket).st_gid)],
        "environment": {
            "HARBOR_TELEMETRY": "0",
            "HOME": "/tmp",
            **{variable: os.environ.get(variable, "") for variable in spec.env},
        },
        "volumes": {
            socket: {"bind": "/var/run/docker.sock", "mode": "rw"},
            str(waiting.dataset_path): {"bind": str(waiting.dataset_path), "mode": "ro"},
            str(root): {"bind": str(root), "mode": "rw"},
        },
    }
    started_at = time.time()
    try:
        container = client.containers.run(runner_tag(harbor_version(harness)), **options)
    except DOCKER_ERRORS as error:
        raise InfraError(f"docker: the Harbor runner for {name} did not start ({error})") from error
    total = sum(tasks.values())
    budget = max(_trial_budget(waiting, task) for task in tasks)
    deadline = started_at + math.ceil(total / concurrency) * budget + JOB_SLACK_SECS
    return HarborJob(
        name=name,
        harness=waiting.trial.harness,
        dataset=waiting.trial.dataset,
        tasks=tasks,
        container=str(container.id),
        started_at=started_at,
        deadline=deadline,
    )


def _trial_budget(waiting: Waiting, task: str) -> float:
    """The longest one Harbor trial of `task` may take: build, agent, verifier, slack."""
    config = load_task(waiting.dataset_path / task).config
    agent = waiting.run.spec.timeout_secs or config.agent.timeout_sec or DEFAULT_TIMEOUT_SECS
    return (
        config.environment.build_timeout_sec + agent + config.verifier.timeout_sec
    ) + TRIAL_SLACK_SECS


def _docker_socket(client: docker.DockerClient) -> str:
    """The engine's Unix socket on the host, which the runner gets mounted."""
    base = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    parsed = urlparse(base)
    path = parsed.path
    if parsed.scheme != "unix" or not path or not stat.S_ISSOCK(os.stat(path).st_mode):
        raise InfraError(
            f"DOCKER_HOST={base}: a harbor harness needs the engine's local Unix socket, to "
            "mount into Harbor's runner"
        )
    return path


def _supervise(client: docker.DockerClient, root: Path, jobs: list[HarborJob]) -> None:
    """End the jobs whose runner is gone, and stop those past their deadline."""
    for job in jobs:
        if job.ended:
            continue
        if not _is_running(client, job):
            job.ended = _exit_status(root, job)
            _sweep(client, job.name)
        elif time.time() > job.deadline:
            _stop(
                client,
                job,
                f"stopped: ran past its deadline ({job.deadline - job.started_at:.0f} s)",
            )


def _is_running(client: docker.DockerClient, job: HarborJob) -> bool:
    try:
        container = client.containers.get(job.container)
    except docker.errors.NotFound:
        return False
    except DOCKER_ERRORS as error:
        raise InfraError(
            f"docker: cannot inspect the Harbor runner of {job.name} ({error})"
        ) from error
    return str(container.status) in ("created", "running", "restarting")


def _exit_status(root: Path, job: HarborJob) -> str:
    code = root / f"{job.name}.output.txt.exit"
    text = code.read_text().strip() if code.is_file() else ""
    return f"exited {text}" if text else "gone, with no exit status"


def _end_when_exited(client: docker.DockerClient, waiting: Waiting, name: str) -> None:
    """Every result of the job is in: give its runner a moment to exit (no lock held), then
    end the job, so no waiting item is needed for its clean-up."""
    with _board(waiting.root) as board:
        job = next(job for job in board.jobs if job.name == name)
    deadline = time.monotonic() + EXIT_WAIT_SECS
    while _is_running(client, job) and time.monotonic() < deadline:
        time.sleep(POLL_SECS)
    with _board(waiting.root) as board:
        job = next(job for job in board.jobs if job.name == name)
        if job.ended:
            return
        if _is_running(client, job):
            _stop(client, job, "stopped: every result was in but the runner did not exit")
        else:
            job.ended = _exit_status(waiting.root, job)
            _sweep(client, job.name)


def _stop_all(client: docker.DockerClient, waiting: Waiting, why: str) -> None:
    with _board(waiting.root) as board:
        for job in board.jobs:
            if waiting.is_mine(job) and not job.ended:
                _stop(client, job, why)


def _stop(client: docker.DockerClient, job: HarborJob, why: str) -> None:
    with suppress(docker.errors.NotFound):
        remove_container(client.containers.get(job.container))
    _sweep(client, job.name)
    job.ended = why


def _sweep(client: docker.DockerClient, name: str) -> None:
    """Remove (force) whatever the job's compose projects left: containers, networks, and the
    images compose built for them."""
    label = {"label": f"{JOB_LABEL}={name}"}
    projects: set[str] = set()
    try:
        for container in client.containers.list(all=True, filters=label):
            projects.add(container.labels.get("com.docker.compose.project", ""))
            remove_container(container)
        for network in client.networks.list(filters=label):
            projects.add((network.attrs.get("Labels") or {}).get("com.docker.compose.project", ""))
            with suppress(docker.errors.NotFound, docker.errors.APIError):
                network.remove()
        for project in sorted(projects - {""}):
            built = {"label": f"com.docker.compose.project={project}"}
            for image in client.images.list(filters=built):
                with suppress(docker.errors.NotFound, docker.errors.APIError):
                    client.images.remove(image.id, force=True)
    except DOCKER_ERRORS as error:
        raise InfraError(f"docker: cannot clean up after Harbor job {name} ({error})") from error


def _no_result(root: Path, job: HarborJob, task: str) -> str:
    output = root / f"{job.name}.output.txt"
    lines = output.read_text(errors="replace").splitlines() if output.is_file() else []
    said = [line.strip() for line in lines if line.strip()]
    tail = f": {said[-1][:300]}" if said else ""
    return (
        f"Harbor job {job.name} {job.ended} with no result for task {task!r} "
        f"(see {output} and {root / job.name / 'job.log'}){tail}"
    )
