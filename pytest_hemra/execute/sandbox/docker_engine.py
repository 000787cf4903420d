"""One Docker engine as a sandbox provider: task images cached by content digest (`images.py`),
HEMRA's networks and the host firewall (`networks.py`), one locked-down container a trial
(`containers.py`, `container.py`), a multi-container task's services beside it (`services.py`),
and what trials that are over left behind (`leftovers.py`). Every wait has a deadline.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import docker

from pytest_hemra.core.errors import InfraError
from pytest_hemra.execute.sandbox import (
    SandboxProvider,
    SandboxRequest,
    cleaning,
    firewall,
    leftovers,
)
from pytest_hemra.execute.sandbox.cleaning import Leftover
from pytest_hemra.execute.sandbox.client import DOCKER_ERRORS, EngineClient, on_this_machine
from pytest_hemra.execute.sandbox.container import DockerSandbox
from pytest_hemra.execute.sandbox.containers import Containers
from pytest_hemra.execute.sandbox.health import ping, probe_client, probe_for
from pytest_hemra.execute.sandbox.images import Images
from pytest_hemra.execute.sandbox.networks import Networks
from pytest_hemra.execute.sandbox.services import running
from pytest_hemra.resolve.datasets import Task

BASE_CAPABILITIES = frozenset({"docker", "network_block", "cpu_limit", "memory_limit"})


class DockerEngine(SandboxProvider):
    """One Docker engine: the runner's own (DOCKER_HOST, else the local socket) unless given a
    `client`. `image_source` gives the runner's engine, from which images missing here are
    copied (a pool's engines start with none); `engine` names this one in locks and errors;
    `probe`, a client for pings alone to the same engine (else one made like `client`);
    `own_networks`, whether HEMRA's networks and host firewall are used (by default on the
    runner's own local engine alone: a pool's engines keep Docker's default bridge)."""

    name = "docker"

    def __init__(
        self,
        client: docker.DockerClient | None = None,
        *,
        engine: str | None = None,
        image_source: Callable[[], docker.DockerClient | None] | None = None,
        own_networks: bool | None = None,
        probe: docker.APIClient | None = None,
    ) -> None:
        self._engine = EngineClient(client, engine)
        self.engine = self._engine.address
        if own_networks is None:
            own_networks = client is None and on_this_machine(self.engine)
        self._capabilities: frozenset[str] | None = None
        self._probe: Any = probe  # a short-timeout client for pings alone (`engine_error`)
        self.images = Images(self._engine, image_source)
        self.networks = Networks(self._engine, own_networks)
        self.containers = Containers(
            self._engine, self.networks, self.images, lambda: self.engine_error() is None
        )

    @property
    def client(self) -> docker.DockerClient:
        return self._engine.client

    @property
    def own_networks(self) -> bool:
        return self.networks.own

    @property
    def capabilities(self) -> frozenset[str]:
        """What this engine can do: `disk_limit` when its storage driver can cap a container's
        writable layer (btrfs, zfs, overlay2 on xfs; not overlay2 on ext4)."""
        if self._capabilities is None:
            found = set(BASE_CAPABILITIES)
            try:
                info = self.client.info()
            except DOCKER_ERRORS:
                info = {}
            backing = dict(info.get("DriverStatus") or []).get("Backing Filesystem")
            driver = info.get("Driver")
            if driver in ("btrfs", "zfs") or (driver == "overlay2" and backing == "xfs"):
                found.add("disk_limit")
            self._capabilities = frozenset(found)
        return self._capabilities

    def check(self) -> None:
        _ = self.client
        if self.own_networks:
            firewall.check()

    def engine_error(self, engine: str | None = None) -> str | None:
        """None when the engine answers now (a ping with a short timeout), else why not."""
        if self._probe is None:
            client = self._engine.connected
            self._probe = (
                probe_client() if client is None else probe_for(client.api, self._engine.address)
            )
        return ping(self._probe)

    def remove_leftovers(self, is_over: Callable[[str], bool]) -> int:
        """After an outage: what HEMRA left on this engine for trials that are over (`is_over`
        by trial id: their runner finished with them or is gone) removed, containers and
        their services networks, and runs' networks no sandbox is on (what the engine keeps
        anyway: `kept`); what this process remembers of the engine found again."""
        self.networks.forget()
        removed = leftovers.remove(self.networks, is_over)
        self.networks.reap_run_networks()
        return removed

    def clean(self, is_over: Callable[[str], bool], *, dry_run: bool) -> list[Leftover]:
        try:
            return cleaning.clean(self.networks, is_over, dry_run=dry_run)
        except DOCKER_ERRORS as error:
            raise InfraError(f"docker: cannot clean the engine {self.engine} ({error})") from error

    def prepare(self, task: Task, default_image: str) -> str:
        """The task image with HEMRA's sandbox layer on top, built once per content digest, and
        a multi-container task's service images (no layer on them)."""
        return self.images.prepare(task, default_image)

    def missing_images(self, task: Task, default_image: str) -> list[str]:
        """What `prepare` would have to build (or find missing) for a task, building nothing."""
        return self.images.missing_images(task, default_image)

    def task_image(self, task: Task, default_image: str) -> str:
        """The reference of a task's own image (before HEMRA's layer), as `prepare` names it."""
        return self.images.task_image(task, default_image)

    def has_image(self, reference: str) -> bool:
        """Whether this engine holds `reference` (False when it does not answer)."""
        return self.images.has_image(reference)

    def gateway_host(self) -> str | None:
        """The host side of every sandbox's network, where the gateway listens for them."""
        return self.networks.gateway_host()

    def kept(self) -> dict[str, str]:
        return dict(self.networks.stuck)

    def release(self, run_id: str, ports: Sequence[int]) -> None:
        """The gateway's `ports` closed again in the host firewall, and the run's network
        removed unless another process's sandboxes still sit on it (`Networks.release`)."""
        self.networks.release(run_id, ports)

    def remove_sandboxes(self, labels: Mapping[str, str]) -> int:
        filters = ["hemra=1", *(f"{key}={value}" for key, value in labels.items())]
        try:
            removed = self.containers.remove(filters)
            self.networks.remove_services_networks(filters)
            if self.own_networks and "hemra.run" in labels and len(labels) == 1:
                self.networks.remove_run_network(labels["hemra.run"])
        except DOCKER_ERRORS as error:
            raise InfraError(f"docker: cannot remove sandboxes {dict(labels)} ({error})") from error
        return removed

    def open(self, request: SandboxRequest) -> AbstractContextManager[DockerSandbox]:
        """The sandbox, started (`Containers.open`), removed with force when the context exits."""
        return self.containers.open(request)

    def open_services(
        self, task: Task, request: SandboxRequest, logs: Path
    ) -> AbstractContextManager[str | None]:
        """A multi-container task's services running beside the trial (`services.py`): the
        network's name for the sandbox (`SandboxRequest.services_network`), None without."""
        return running(self.networks, task, request, logs)
