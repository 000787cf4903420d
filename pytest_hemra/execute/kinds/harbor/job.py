"""One Harbor job: `harbor run` started in the runner image, watched, stopped, cleaned up.

The runner gets the Docker socket, and the dataset (read-only) and the run's `harbor/` folder
mounted at the same paths as on the host: Harbor hands those paths to Docker, which resolves
them on the host. A compose overlay labels what Harbor's compose projects create (`hemra=1`,
`hemra.run`, `hemra.harbor=<job>`), so a job's leftovers are found and removed with force, and
cuts the task container's stop grace to 1 s (Harbor's `sleep infinity` ignores SIGTERM, and
stock Harbor waits out Docker's 10 s grace on every trial).
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import time
from contextlib import suppress
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import docker
import docker.errors
from pydantic import BaseModel, ConfigDict

from pytest_hemra.core.errors import InfraError
from pytest_hemra.execute.context import DEFAULT_TIMEOUT_SECS
from pytest_hemra.execute.installs import ensure_installed
from pytest_hemra.execute.kinds.harbor import harbor_version
from pytest_hemra.execute.kinds.harbor.image import runner_tag
from pytest_hemra.execute.sandbox.client import DOCKER_ERRORS
from pytest_hemra.execute.sandbox.removal import remove_container
from pytest_hemra.resolve.datasets import load_task
from pytest_hemra.resolve.harnesses import Harness
from pytest_hemra.resolve.plan import RecordedRun

JOB_LABEL = "hemra.harbor"
JOB_SLACK_SECS = 120.0
TRIAL_SLACK_SECS = 60.0
STOP_GRACE = "1s"
COMPOSE_PROJECT = "com.docker.compose.project"
TELLING = re.compile(r"error|invalid|not valid|failed|not found", re.IGNORECASE)
# runs harbor with its output in a file and its exit status beside it; arguments stay argv
WRAPPER = 'out="$1"; shift; "$@" >"$out" 2>&1; code=$?; echo "$code" >"$out.exit"; exit "$code"'


class HarborJob(BaseModel):
    """One `harbor run`: which tasks, how many attempts each, its runner, how it ended."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    name: str
    harness: str
    dataset: str
    tasks: dict[str, int]
    container: str
    started_at: float
    deadline: float
    ended: str | None = None


def launch_job(
    client: docker.DockerClient,
    run: RecordedRun,
    harness: Harness,
    dataset: tuple[str, Path],
    tasks: dict[str, int],
    name: str,
    root: Path,
) -> HarborJob:
    """Start one `harbor run` of `tasks` (task -> attempts, the same for each) of the dataset
    (name, path) in the runner image, detached; the runner removes itself when it exits."""
    spec = harness.spec
    ensure_installed(harness)  # a no-op unless the runner image was removed since resolve
    dataset_name, dataset_path = dataset
    config = root / f"{name}.config.json"
    model = run.spec.model or spec.model
    agent = {"name": spec.agent, "model_name": model, "override_timeout_sec": run.spec.timeout_secs}
    config.write_text(json.dumps({"agents": [agent]}, indent=1) + "\n")
    labels = {"hemra": "1", "hemra.run": run.id, JOB_LABEL: name}
    overlay = root / f"{name}.compose.json"  # compose reads JSON as YAML
    services = {"main": {"labels": labels, "stop_grace_period": STOP_GRACE}}
    content = {"services": services, "networks": {"default": {"labels": labels}}}
    overlay.write_text(json.dumps(content, indent=1) + "\n")
    concurrency = run.spec.concurrency
    argv = ["harbor", "run", "-c", str(config), "-p", str(dataset_path)]
    for task in tasks:
        argv += ["-i", task]
    argv += ["-k", str(max(tasks.values())), "-o", str(root), "--job-name", name]
    argv += ["-n", str(concurrency), "-y", "-q", "--extra-docker-compose", str(overlay)]
    output = root / f"{name}.output.txt"
    socket = docker_socket()
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
            "COLUMNS": "200",  # fewer of rich's line breaks in its output file
            **{variable: os.environ.get(variable, "") for variable in spec.env},
        },
        "volumes": {
            socket: {"bind": "/var/run/docker.sock", "mode": "rw"},
            str(dataset_path): {"bind": str(dataset_path), "mode": "ro"},
            str(root): {"bind": str(root), "mode": "rw"},
        },
    }
    started_at = time.time()
    try:
        container = client.containers.run(runner_tag(harbor_version(harness)), **options)
    except DOCKER_ERRORS as error:
        raise InfraError(f"docker: the Harbor runner for {name} did not start ({error})") from error
    budget = max(trial_budget(run, dataset_path / task) for task in tasks)
    waves = math.ceil(sum(tasks.values()) / concurrency)
    return HarborJob(
        name=name,
        harness=harness.name,
        dataset=dataset_name,
        tasks=tasks,
        container=str(container.id),
        started_at=started_at,
        deadline=started_at + waves * budget + JOB_SLACK_SECS,
    )


def trial_budget(run: RecordedRun, task: Path) -> float:
    """The longest one Harbor trial of a task may take: build, agent, verifier, slack."""
    config = load_task(task).config
    agent = run.spec.timeout_secs or config.agent.timeout_sec or DEFAULT_TIMEOUT_SECS
    build, verifier = config.environment.build_timeout_sec, config.verifier.timeout_sec
    return build + agent + verifier + TRIAL_SLACK_SECS


def docker_socket() -> str:
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


def is_running(client: docker.DockerClient, job: HarborJob) -> bool:
    try:
        container = client.containers.get(job.container)
    except docker.errors.NotFound:
        return False
    except DOCKER_ERRORS as error:
        raise InfraError(f"docker: cannot inspect the runner of {job.name} ({error})") from error
    alive = ("created", "running", "restarting")  # not a lifecycle state: Docker's statuses
    return str(container.status) in alive


def end_job(client: docker.DockerClient, root: Path, job: HarborJob) -> None:
    """A job whose runner has exited: its exit status noted, whatever it left removed."""
    code = root / f"{job.name}.output.txt.exit"
    text = code.read_text().strip() if code.is_file() else ""
    job.ended = f"exited {text}" if text else "gone, with no exit status"
    sweep_job(client, job.name)


def stop_job(client: docker.DockerClient, job: HarborJob, why: str) -> None:
    """Stop a job at once: its runner removed with force, then whatever it left."""
    with suppress(docker.errors.NotFound):
        remove_container(client.containers.get(job.container))
    sweep_job(client, job.name)
    job.ended = why


def sweep_job(client: docker.DockerClient, name: str) -> None:
    """Remove (force) whatever the job's compose projects left: containers, networks, and the
    images compose built for them."""
    label = {"label": f"{JOB_LABEL}={name}"}
    projects: set[str] = set()
    try:
        for container in client.containers.list(all=True, filters=label, ignore_removed=True):
            projects.add(container.labels.get(COMPOSE_PROJECT, ""))
            remove_container(container)
        for network in client.networks.list(filters=label):
            projects.add((network.attrs.get("Labels") or {}).get(COMPOSE_PROJECT, ""))
            with suppress(docker.errors.NotFound, docker.errors.APIError):
                network.remove()
        for project in sorted(projects - {""}):
            built = {"label": f"{COMPOSE_PROJECT}={project}"}
            for image in client.images.list(filters=built):
                with suppress(docker.errors.NotFound, docker.errors.APIError):
                    client.images.remove(image.id, force=True)
    except DOCKER_ERRORS as error:
        raise InfraError(f"docker: cannot clean up after Harbor job {name} ({error})") from error


def no_result_message(root: Path, job: HarborJob, task: str) -> str:
    """Why a trial got nothing from a job that ended: the job's last word, and where to look."""
    output = root / f"{job.name}.output.txt"
    lines = output.read_text(errors="replace").splitlines() if output.is_file() else []
    said = [line.strip() for line in lines if line.strip()]
    telling = [line for line in said if TELLING.search(line)]
    if said and not said[0].startswith("Traceback") and telling:
        said = telling[:1]  # Harbor's own complaint (rich wraps it over several lines)
    tail = f": {said[-1][:300]}" if said else ""  # else an exception's last line
    return (
        f"Harbor job {job.name} {job.ended} with no result for task {task!r} "
        f"(see {output} and {root / job.name / 'job.log'}){tail}"
    )
