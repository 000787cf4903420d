"""A trial's sandbox container on one docker engine: created locked down and started, on its
network, and removed with force on every path.

Containers run a PID 1 that reaps every orphan: HEMRA's keeper (`keeper.py`) for an image with
perl and no ENTRYPOINT, else Docker's init (docker-init) with `sleep infinity` (or the image's
ENTRYPOINT) its child, as root with every capability but a few dropped; they stop
with SIGKILL (a `sleep` ignores SIGTERM, and waiting out Docker's grace period costs ~10 s a
trial). Killing PID 1 kills the whole PID namespace: that is how a sandbox is emptied
(`DockerSandbox.empty`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import docker
import docker.errors
from docker.models.containers import _create_container_args

from pytest_hemra.core.errors import InfraError
from pytest_hemra.execute.sandbox import ROOT_USER, WORKDIR, SandboxRequest, storage
from pytest_hemra.execute.sandbox.client import DOCKER_ERRORS, EngineClient
from pytest_hemra.execute.sandbox.container import DockerSandbox
from pytest_hemra.execute.sandbox.files import files_archive
from pytest_hemra.execute.sandbox.images import Images
from pytest_hemra.execute.sandbox.keeper import keeper_for
from pytest_hemra.execute.sandbox.networks import GATEWAY_NETWORK, Networks
from pytest_hemra.execute.sandbox.overlay import overlay_put
from pytest_hemra.execute.sandbox.removal import remove_container
from pytest_hemra.resolve.compose import MAIN

MIN_NANO_CPUS = 10_000_000  # Docker's smallest cpu quota (0.01 cpu)
# What the sandbox's root may do: manage files it does not own and install packages (dpkg's
# chown and modes, apt's switch to its own user), as a task's setup.sh or a verifier needs; no
# CAP_KILL, no network or system administration. The agent's user holds none of them (a
# process of a user other than root has no effective capabilities, and `no-new-privileges`
# keeps setuid and file-capability programs from granting any).
ROOT_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETUID", "SETGID")
KEEP_ALIVE = ["sh", "-c", "sleep infinity"]  # handed to an image's ENTRYPOINT, as Harbor does
# How a daemon shutting down (`systemctl restart docker`) stops a sandbox: its `sleep` ignores
# SIGTERM, and waiting out Docker's 10 s grace period for each would only hold the restart up.
STOP_SIGNAL = "SIGKILL"


class Containers:
    """The sandboxes of one engine, on its `networks`; `answers` says whether the engine
    answers a ping now (a removal slow for what a trial left is then waited for)."""

    def __init__(
        self,
        engine: EngineClient,
        networks: Networks,
        images: Images,
        answers: Callable[[], bool],
    ) -> None:
        self.engine = engine
        self.networks = networks
        self.images = images
        self.answers = answers

    @property
    def client(self) -> docker.DockerClient:
        return self.engine.client

    @contextmanager
    def open(self, request: SandboxRequest) -> Iterator[DockerSandbox]:
        """The sandbox, started: the image's ENTRYPOINT kept when it has one (its services may
        run; the keep-alive is its command), else `sleep infinity` as PID 1."""
        try:
            image = self.images.inspect(request.image)
        except DOCKER_ERRORS as error:
            raise InfraError(f"docker: cannot read image {request.image} ({error})") from error
        if image is None:
            raise InfraError(f"docker: image {request.image} is not on the engine")
        entrypoint = image["Config"].get("Entrypoint")
        keeper = keeper_for(image)
        options = _options(request, bool(entrypoint), keeper)
        container = None
        own = self.networks.own
        on: dict[str, str] | None = None  # its networks, name: id, where known here
        try:
            run_id = request.labels.get("hemra.run")
            if own and run_id:
                container, on = self._on_networks(request, options, run_id)
            elif request.services_network and not request.network:  # a pool's, with services
                container = self._on_services(request, options)
            else:  # a pool's, or outside any run (tests, benchmarks): Docker's default bridge
                container = self.client.containers.create(request.image, **options)
                self._join_services(container, request)
                self._start(container, request, read=False)  # the SDK's create read it
            kept = (request.services_network,) if request.services_network else ()
            yield DockerSandbox(
                self.client,
                container,
                runs_services=bool(entrypoint),
                entrypoint=tuple(entrypoint or ()),
                kept=kept,
                gateway_network=GATEWAY_NETWORK if own and run_id else None,
                output_cap=request.output_cap,
                networks=on,
                guarded_init=keeper is not None,
            )
        except DOCKER_ERRORS as error:
            if isinstance(error, docker.errors.ImageNotFound):  # removed since it was seen
                self.images.forget()
            raise InfraError(f"docker: sandbox failed ({error})") from error
        finally:
            if container is not None:  # slow for what the trial left, with the engine up: waited
                remove_container(container, answers=self.answers)

    def remove(self, labels: list[str]) -> int:
        """Remove every container carrying all `labels` ("key=value"), a trial's services
        included; return how many there were."""
        filters = {"label": labels}
        found = self.client.containers.list(all=True, filters=filters, sparse=True)
        for container in found:
            remove_container(container)
        return len(found)

    def _on_networks(
        self, request: SandboxRequest, options: dict[str, Any], run_id: str
    ) -> tuple[Any, dict[str, str]]:
        """The container on one network of HEMRA's: `hemra-gateway` (internal) without internet,
        its run's own network with it; either way its firewall lets in the gateway's port on
        `hemra-gateway`'s host address, the one address the gateway listens on. One network, one
        endpoint to set up and one to cut for the verifier. A network removed meanwhile (its
        run's last process released it between this one's create and start) is made again,
        under the lock its remover takes, held until the container has started."""
        del options["network_mode"]
        try:
            return self._place(request, options, run_id, whole=False)
        except docker.errors.NotFound:
            self.networks.forget(everything=False)  # one was removed meanwhile: find them again
        if not request.network:
            return self._place(request, options, run_id, whole=False)
        with self.networks.run_lock(run_id):
            return self._place(request, options, run_id, whole=True)

    def _place(
        self, request: SandboxRequest, options: dict[str, Any], run_id: str, *, whole: bool
    ) -> tuple[Any, dict[str, str]]:
        """Create and start the container on its network (`_on_networks`), with it (name: id);
        `whole`: the caller holds the run network's lock, else it is taken while the container
        is created."""
        network, lock = self.networks.sandbox_network(request, run_id, locked=whole)
        container = None
        try:
            with lock:  # by id: never a network of the same name made since by another
                # process, whose bridge this one never let its gateway's port into
                container = self._create(request.image, network=network.id, **options)
            self._join_services(container, request)
            self._start(container, request)
            return container, {network.name: network.id}
        except BaseException:
            if container is not None:
                remove_container(container)
            raise

    def _start(self, container: Any, request: SandboxRequest, *, read: bool = True) -> None:
        """Started, with the request's files in first, and (`read`) read once: a container that
        takes files is read before it starts (where its storage is: they are unpacked there on
        a local engine, no request; else one archive to the created container), its PID 1 then
        read where it is needed (`listening_ports`); one that takes none once started."""
        if not (request.files or request.folders):
            container.start()
            if read:
                container.reload()
            return
        if read:
            container.reload()
        archive = files_archive(request.files, request.folders)
        writes = storage.writes_storage(self.client)
        if not (writes and overlay_put(container.attrs, True, archive)):
            container.put_archive("/", archive)
        container.start()

    def _create(self, image: str, **options: Any) -> Any:
        """A container created, without the SDK's read of it back (`containers.create` reads
        it at once, before it has a PID 1): `_place` reads it once it has started. The options
        go through the SDK's own translation of `containers.create`'s (private, as named)."""
        kwargs = {**options, "image": image, "version": self.client.api._version}
        created = self.client.api.create_container(**_create_container_args(kwargs))
        return self.client.containers.prepare_model({"Id": created["Id"]})

    def _on_services(self, request: SandboxRequest, options: dict[str, Any]) -> Any:
        """A sandbox without internet on an engine without HEMRA's networks (a pool's): on its
        trial's services network alone (internal: no way out), as `main`. It cannot join that
        network later: a container created without a network has none to add to."""
        name = request.services_network or ""
        del options["network_mode"]
        endpoint = self.client.api.create_endpoint_config(aliases=[MAIN])
        container = self.client.containers.create(
            request.image, network=name, networking_config={name: endpoint}, **options
        )
        try:
            self._start(container, request, read=False)  # the SDK's create read it
        except BaseException:
            remove_container(container)
            raise
        return container

    def _join_services(self, container: Any, request: SandboxRequest) -> None:
        """A multi-container task's sandbox joins its trial's services network as `main`,
        before it starts (its services are up by then: `DockerEngine.open_services`)."""
        if request.services_network:
            network = self.client.networks.get(request.services_network)
            network.connect(container, aliases=[MAIN])


def _options(
    request: SandboxRequest, has_entrypoint: bool, keeper: list[str] | None = None
) -> dict[str, Any]:
    """The container's options: locked down, its limits, labels, name and mounts; `keeper`:
    the guarded PID 1 (`keeper.py`), else docker-init runs `sleep infinity` (or the image's
    entrypoint)."""
    limits = request.limits
    options: dict[str, Any] = {
        "entrypoint": None if has_entrypoint else (keeper or ["sleep", "infinity"]),
        "command": KEEP_ALIVE if has_entrypoint else [],
        "user": ROOT_USER,  # PID 1: root, so root's commands hold ROOT_CAPABILITIES
        # docker-init as PID 1 (unless the keeper is): it reaps, its death empties the sandbox
        "init": keeper is None,
        "working_dir": WORKDIR,
        "cap_drop": ["ALL"],
        "cap_add": list(ROOT_CAPABILITIES),
        "security_opt": ["no-new-privileges"],
        "pids_limit": limits.pids,
        "stop_signal": STOP_SIGNAL,
        "network_mode": "bridge" if request.network else "none",
        "labels": {"hemra": "1", **request.labels},
        "environment": {},
    }
    if limits.memory_mb:
        options["mem_limit"] = f"{limits.memory_mb}m"
        options["memswap_limit"] = f"{limits.memory_mb}m"
    if limits.cpus:
        options["nano_cpus"] = max(int(limits.cpus * 1e9), MIN_NANO_CPUS)  # never 0: unlimited
    if limits.disk_mb:
        options["storage_opt"] = {"size": f"{limits.disk_mb}M"}
    if request.name:
        options["name"] = request.name
    if request.mounts:
        options["volumes"] = {
            str(mount.source): {"bind": mount.target, "mode": "ro" if mount.read_only else "rw"}
            for mount in request.mounts
        }
    return options
