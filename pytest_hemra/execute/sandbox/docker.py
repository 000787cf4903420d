"""The docker provider: task images cached by content digest, one locked-down container a trial.

Containers run `sleep infinity` as PID 1 as the agent user with every capability dropped; they
are removed with force (a `sleep` PID 1 ignores SIGTERM, and waiting out Docker's grace period
costs ~10 s a trial). Every wait has a deadline enforced here.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import ipaddress
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import docker
import docker.errors

from pytest_hemra.core.errors import InfraError
from pytest_hemra.execute.sandbox import (
    AGENT_HOME,
    AGENT_USER,
    WORKDIR,
    SandboxRequest,
)
from pytest_hemra.execute.sandbox.container import (
    DOCKER_ERRORS,
    DockerSandbox,
    remove_container,
)
from pytest_hemra.execute.sandbox.images import base_images, copy_image, engine_lock
from pytest_hemra.resolve.datasets import Task

SANDBOX_LAYER_VERSION = "1"
TASK_REPOSITORY = "hemra-task"
SANDBOX_REPOSITORY = "hemra-sandbox"
COPY_TIMEOUT_SECS = 900.0  # the longest a runner waits for another copying the same image

SANDBOX_LAYER = f"""\
FROM {{image}}
USER root
RUN mkdir -p {WORKDIR} /logs/agent /logs/verifier {AGENT_HOME} /hemra \\
 && chown -R {AGENT_USER} {WORKDIR} /logs/agent {AGENT_HOME} \\
 && chmod 0755 /logs /logs/verifier /hemra
WORKDIR {WORKDIR}
LABEL hemra.sandbox-layer="{SANDBOX_LAYER_VERSION}"
"""


def connect() -> docker.DockerClient:
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except DOCKER_ERRORS as error:
        raise InfraError(f"docker: the engine does not answer ({error})") from error
    return client


class DockerProvider:
    """One Docker engine: the runner's own (DOCKER_HOST, else the local socket) unless given a
    `client`. `image_source` gives the runner's engine, from which images missing here are
    copied (a pool's engines start with none); `engine` names this one in locks and errors."""

    name = "docker"
    capabilities = frozenset({"docker", "network_block", "cpu_limit", "memory_limit"})

    def __init__(
        self,
        client: docker.DockerClient | None = None,
        *,
        engine: str | None = None,
        image_source: Callable[[], docker.DockerClient | None] | None = None,
    ) -> None:
        self._client = client
        self.engine = engine or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        self._image_source = image_source

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            self._client = connect()
        return self._client

    def check(self) -> None:
        _ = self.client

    def prepare(self, task: Task, default_image: str) -> str:
        """The task image with HEMRA's sandbox layer on top, built once per content digest."""
        try:
            base = self._task_image(task, default_image)
            layer_tag = (
                f"{SANDBOX_REPOSITORY}:"
                + hashlib.sha256(f"{base}\0{SANDBOX_LAYER_VERSION}".encode()).hexdigest()[:24]
            )
            if not self._has_image(layer_tag):
                with self._lock(layer_tag, task.config.environment.build_timeout_sec):
                    if not self._has_image(layer_tag):
                        dockerfile = SANDBOX_LAYER.format(image=base).encode()
                        self._build(task, tag=layer_tag, fileobj=io.BytesIO(dockerfile))
            return layer_tag
        except DOCKER_ERRORS as error:
            raise InfraError(f"{task.path}: docker failed preparing the image ({error})") from error

    def missing_images(self, task: Task, default_image: str) -> list[str]:
        """What `prepare` would have to build (or find missing) for a task, building nothing."""
        if not task.has_dockerfile:
            image = task.config.environment.docker_image or default_image
            return [] if self._has_image(image) else [f"{image} (not on this engine)"]
        tag = f"{TASK_REPOSITORY}:{task.environment_digest()[:24]}"
        return [] if self._has_image(tag) else [f"{tag} (from {task.environment_dir})"]

    def _task_image(self, task: Task, default_image: str) -> str:
        named = task.config.environment.docker_image
        if not task.has_dockerfile:
            image = named or default_image
            self._copy_if_missing(image)
            if not self._has_image(image):
                raise InfraError(f"{task.path}: image {image!r} is not on this docker engine")
            return str(self.client.images.get(image).id)
        tag = f"{TASK_REPOSITORY}:{task.environment_digest()[:24]}"
        if not self._has_image(tag):
            with self._lock(tag, task.config.environment.build_timeout_sec):
                if not self._has_image(tag):
                    dockerfile = (task.environment_dir / "Dockerfile").read_text(errors="replace")
                    for base in base_images(dockerfile):
                        self._copy_if_missing(base)
                    self._build(task, tag=tag, path=str(task.environment_dir))
        return str(self.client.images.get(tag).id)

    def _copy_if_missing(self, reference: str) -> None:
        """An image missing on this engine but on the runner's is copied over (save | load)."""
        if self._image_source is None or self._has_image(reference):
            return
        source = self._image_source()
        if source is None:
            return
        with self._lock(reference, COPY_TIMEOUT_SECS):
            if self._has_image(reference):
                return
            try:
                source.images.get(reference)
            except docker.errors.ImageNotFound:
                return  # not on the runner's engine either: a build pulls it, or says so
            copy_image(source, self.client, reference)

    def _lock(self, image: str, timeout: float) -> contextlib.AbstractContextManager[None]:
        return engine_lock(self.engine, image, timeout)

    def has_image(self, reference: str) -> bool:
        """Whether this engine holds `reference` (False when it does not answer)."""
        try:
            return self._has_image(reference)
        except DOCKER_ERRORS:
            return False

    def task_image(self, task: Task, default_image: str) -> str:
        """The reference of a task's own image (before HEMRA's layer), as `prepare` names it."""
        if not task.has_dockerfile:
            return task.config.environment.docker_image or default_image
        return f"{TASK_REPOSITORY}:{task.environment_digest()[:24]}"

    def _has_image(self, reference: str) -> bool:
        try:
            self.client.images.get(reference)
        except docker.errors.ImageNotFound:
            return False
        return True

    def _build(self, task: Task, *, tag: str, **source: Any) -> None:
        try:
            self.client.images.build(
                tag=tag,
                rm=True,
                forcerm=True,
                pull=False,
                timeout=task.config.environment.build_timeout_sec,
                labels={"hemra.task": task.name},
                **source,
            )
        except docker.errors.BuildError as error:
            tail = " | ".join(
                str(line.get("stream") or line.get("error") or "").strip()
                for line in list(error.build_log)[-3:]
            )
            raise InfraError(f"{task.path}: image build failed: {error.msg} ({tail})") from error

    def gateway_host(self) -> str | None:
        """The bridge network's gateway address: the host side of every sandbox's network."""
        try:
            configs = self.client.networks.get("bridge").attrs["IPAM"]["Config"] or []
        except DOCKER_ERRORS as error:
            raise InfraError(f"docker: cannot read the bridge network ({error})") from error
        for config in configs:
            if config.get("Gateway"):
                return str(config["Gateway"])
            if config.get("Subnet") and ":" not in config["Subnet"]:
                network = ipaddress.ip_network(config["Subnet"], strict=False)
                return str(next(network.hosts()))
        return None

    def remove_sandboxes(self, labels: Mapping[str, str]) -> int:
        filters = {"label": ["hemra=1", *(f"{key}={value}" for key, value in labels.items())]}
        try:
            found = self.client.containers.list(all=True, filters=filters)
            for container in found:
                remove_container(container)
        except DOCKER_ERRORS as error:
            raise InfraError(f"docker: cannot remove sandboxes {dict(labels)} ({error})") from error
        return len(found)

    @contextmanager
    def open(self, request: SandboxRequest) -> Iterator[DockerSandbox]:
        limits = request.limits
        options: dict[str, Any] = {
            "entrypoint": ["sleep", "infinity"],
            "command": [],
            "user": AGENT_USER,
            "working_dir": WORKDIR,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "pids_limit": limits.pids,
            "network_mode": "bridge" if request.network else "none",
            "labels": {"hemra": "1", **request.labels},
            "detach": True,
            "environment": {},
        }
        if limits.memory_mb:
            options["mem_limit"] = f"{limits.memory_mb}m"
            options["memswap_limit"] = f"{limits.memory_mb}m"
        if limits.cpus:
            options["nano_cpus"] = int(limits.cpus * 1e9)
        if request.name:
            options["name"] = request.name
        if request.mounts:
            options["volumes"] = {
                str(mount.source): {"bind": mount.target, "mode": "ro" if mount.read_only else "rw"}
                for mount in request.mounts
            }
        container = None
        try:
            container = self.client.containers.run(request.image, **options)
            yield DockerSandbox(self.client, container)
        except DOCKER_ERRORS as error:
            raise InfraError(f"docker: sandbox failed ({error})") from error
        finally:
            if container is not None:
                remove_container(container)
