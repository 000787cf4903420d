"""A multi-container task's services (its compose file), started beside the trial's sandbox.

Services are the task's own code, trusted like its Dockerfile: no HEMRA layer on their images,
which are built at resolve (`images.py`: cached by the digest of their build context) or must
already be on the engine (nothing is pulled). Each trial gets a network of its own, `internal`
(no route out, no host but the gateway's port through the firewall), on which every service is
reached by its name and `main`, the sandbox, joins beside its own HEMRA network. A service of a
task with internet also joins its run's network (HEMRA's, no inter-container traffic) for its
way out, so the trial network never gives a route out, and a verifier whose network is cut
keeps it: it reaches the task's services and nothing else.

Services start in `depends_on` order, each condition waited for with a deadline; the sandbox
starts after main's. Every container and the network are removed with force on every path.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import docker.errors

from pytest_hemra.core.errors import InfraError
from pytest_hemra.execute.sandbox import SandboxRequest, firewall
from pytest_hemra.execute.sandbox.client import DOCKER_ERRORS
from pytest_hemra.execute.sandbox.containers import MIN_NANO_CPUS, ROOT_CAPABILITIES, STOP_SIGNAL
from pytest_hemra.execute.sandbox.images import service_image
from pytest_hemra.execute.sandbox.networks import SERVICES_LABEL, Networks
from pytest_hemra.execute.sandbox.removal import remove_container
from pytest_hemra.resolve.compose import Compose, Dependency, Service
from pytest_hemra.resolve.datasets import Task
from pytest_hemra.resolve.templates import render_sandbox_env

SERVICE_LABEL = "hemra.service"
POLL_SECS = 0.2
HEALTH_SLACK_SECS = 10.0
IMAGE_HEALTH_SECS = 300.0  # a service_healthy wait on the image's own HEALTHCHECK
COMPLETION_SECS = 600.0  # a service_completed_successfully wait
LOG_BYTES = 1 << 20  # each service's output kept in the trial folder


@contextmanager
def running(
    networks: Networks, task: Task, request: SandboxRequest, logs: Path
) -> Iterator[str | None]:
    """The task's services running and main's dependencies met: yields the trial network's
    name for the sandbox to join (None: the task has no services). Everything is removed on
    exit, whatever ended it; each service's output is kept as `logs/<name>.log`."""
    compose = task.compose
    if compose is None or not compose.services:
        yield None
        return
    client = networks.client
    labels = {"hemra": "1", **request.labels}
    name = f"{request.name or 'hemra-' + uuid.uuid4().hex[:12]}-services"
    network: Any = None
    bridge: str | None = None
    containers: dict[str, Any] = {}
    try:
        try:
            network = client.networks.create(
                name,
                driver="bridge",
                internal=True,
                labels={**labels, SERVICES_LABEL: "1"},
                check_duplicate=True,
            )
            network.reload()
            bridge = networks.guard_services(network, request.gateway_port)
            for service_name in compose.order():
                service = compose.services[service_name]
                _wait_for(containers, service.needed(), compose, service_name, logs)
                containers[service_name] = _start(
                    networks, task, request, network, service_name, service, labels
                )
            _wait_for(containers, compose.main.needed(), compose, "main", logs)
        except DOCKER_ERRORS as error:
            raise InfraError(
                f"{compose.path}: docker failed starting services ({error})"
            ) from error
        yield name
    finally:
        logs.mkdir(parents=True, exist_ok=True)
        for service_name, container in containers.items():
            with contextlib.suppress(*DOCKER_ERRORS, OSError):
                output = container.logs(stdout=True, stderr=True, tail=2000)[-LOG_BYTES:]
                (logs / f"{service_name}.log").write_bytes(output)
        _remove(list(containers.values()), network, bridge)


def _start(
    networks: Networks,
    task: Task,
    request: SandboxRequest,
    network: Any,
    name: str,
    service: Service,
    labels: Mapping[str, str],
) -> Any:
    """One service container, created on the trial network (its name as alias) and started."""
    client, limits = networks.client, request.limits
    assert task.compose is not None
    options: dict[str, Any] = {
        "labels": {**labels, SERVICE_LABEL: name},
        "environment": render_sandbox_env(service.environment, request.pass_env),
        # the sandbox root's set (files, switching users, as entrypoints of databases do)
        "cap_drop": ["ALL"],
        "cap_add": list(ROOT_CAPABILITIES),
        "security_opt": ["no-new-privileges"],
        "pids_limit": limits.pids,
        "stop_signal": STOP_SIGNAL,  # a daemon restart is not held up by services
        "network": network.name,
        "networking_config": {
            network.name: client.api.create_endpoint_config(aliases=[name]),
        },
    }
    if request.name:
        options["name"] = f"{request.name}-{name}"
    if limits.memory_mb:
        options["mem_limit"] = options["memswap_limit"] = f"{limits.memory_mb}m"
    if limits.cpus:
        options["nano_cpus"] = max(int(limits.cpus * 1e9), MIN_NANO_CPUS)
    if service.command is not None:
        options["command"] = service.command
    if service.entrypoint is not None:
        options["entrypoint"] = service.entrypoint
    if service.working_dir:
        options["working_dir"] = service.working_dir
    if service.user is not None:
        options["user"] = str(service.user)
    if service.healthcheck is not None:
        options["healthcheck"] = _docker_healthcheck(service)
    image = service_image(task, task.compose, name)
    container = client.containers.create(image, **options)
    try:
        if request.network:  # its way out: the run's network (no inter-container traffic)
            networks.join_egress(container, request)
        container.start()
    except BaseException:
        remove_container(container)
        raise
    return container


def _docker_healthcheck(service: Service) -> dict[str, Any]:
    check = service.healthcheck
    assert check is not None
    test = check.argv
    if test is None:
        return {"test": ["NONE"]}
    found: dict[str, Any] = {
        "test": test,
        "interval": int(check.interval * 1e9),
        "timeout": int(check.timeout * 1e9),
        "retries": check.retries,
        "start_period": int(check.start_period * 1e9),
    }
    return found


def _wait_for(
    containers: Mapping[str, Any],
    needed: Mapping[str, Dependency],
    compose: Compose,
    whose: str,
    logs: Path,
) -> None:
    """Each of `needed`'s conditions met, in order, each with its deadline; else InfraError
    naming the service, or, for a dependency with `required: false`, a line in
    `logs/depends_on.log` and on to the next."""
    for name, dependency in needed.items():
        container, condition = containers[name], dependency.condition
        where = f"{compose.path}: service {name!r} ({whose} depends on it, {condition})"
        try:
            if condition == "service_healthy":
                _wait_healthy(container, compose.services[name], where)
            elif condition == "service_completed_successfully":
                _wait_completed(container, where)
        except InfraError as error:
            if dependency.required:
                raise
            logs.mkdir(parents=True, exist_ok=True)
            with (logs / "depends_on.log").open("a") as log:
                log.write(f"not required, went on: {error}\n")


def _wait_healthy(container: Any, service: Service, where: str) -> None:
    check = service.healthcheck
    if check is not None and check.argv is None:
        raise InfraError(f"{where}: its healthcheck is disabled, so it is never healthy")
    if check is not None:
        rounds = check.retries + 1
        limit = check.start_period + (check.interval + check.timeout) * rounds + HEALTH_SLACK_SECS
    else:
        limit = IMAGE_HEALTH_SECS
    deadline = time.monotonic() + limit
    while True:
        container.reload()
        state = container.attrs["State"]
        health = state.get("Health")
        if state.get("Status") in ("exited", "dead"):
            raise InfraError(
                f"{where}: exited (code {state.get('ExitCode')}) before it was healthy"
                f"{_tail(container)}"
            )
        if health is None:
            raise InfraError(f"{where}: it has no healthcheck (compose's or its image's)")
        if health.get("Status") == "healthy":
            return
        if health.get("Status") == "unhealthy":
            raise InfraError(f"{where}: unhealthy{_last_check(health)}")
        if time.monotonic() > deadline:
            raise InfraError(f"{where}: not healthy after {limit:.0f} s{_last_check(health)}")
        time.sleep(POLL_SECS)


def _wait_completed(container: Any, where: str) -> None:
    try:
        status = container.wait(timeout=COMPLETION_SECS)
    except DOCKER_ERRORS as error:
        raise InfraError(f"{where}: did not finish within {COMPLETION_SECS:.0f} s") from error
    code = status.get("StatusCode")
    if code != 0:
        raise InfraError(f"{where}: exited with code {code}{_tail(container)}")


def _last_check(health: Mapping[str, Any]) -> str:
    checks = health.get("Log") or []
    if not checks:
        return ""
    last = checks[-1]
    output = " ".join(str(last.get("Output") or "").split())[-200:]
    return f" (last check: exit {last.get('ExitCode')}{': ' + output if output else ''})"


def _tail(container: Any) -> str:
    try:
        text = container.logs(tail=3).decode(errors="replace")
    except DOCKER_ERRORS:
        return ""
    text = " | ".join(line.strip() for line in text.splitlines() if line.strip())[-300:]
    return f": {text}" if text else ""


def _remove(containers: list[Any], network: Any, bridge: str | None) -> None:
    """Containers with force, then the network and its firewall rules; on every path."""
    for container in containers:
        with contextlib.suppress(*DOCKER_ERRORS):
            remove_container(container)
    if network is None:
        return
    with contextlib.suppress(docker.errors.NotFound):
        network.remove()
    if bridge is not None:
        firewall.unguard(bridge)
