"""The docker provider: task images cached by content digest, one locked-down container a trial.

Containers run Docker's init (docker-init: it reaps every orphan) as PID 1, with `sleep infinity`
(or the image's ENTRYPOINT) its child, as root with every capability but a few dropped; they stop
with SIGKILL (a `sleep` ignores SIGTERM, and waiting out Docker's grace period costs ~10 s a
trial). Killing PID 1 kills the whole PID namespace: that is how a sandbox is emptied
(`DockerSandbox.empty`). Every wait has a deadline enforced here.

A trial's sandbox sits on one of HEMRA's networks of the runner's own engine, never Docker's
default bridge: `hemra-gateway` (internal: no route out; its host side is where the gateway
listens) for a task without internet, its run's `hemra-<run id>` (the way out) for a task with
it. Both have inter-container traffic off, and the host firewall (`firewall.py`) lets a sandbox
reach nothing of the host but the gateway's port (and, for a task with a host allowlist, its
egress proxy's) on `hemra-gateway`'s host address, and no link-local address.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import ipaddress
import os
import re
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import docker
import docker.errors

from pytest_hemra.core.errors import InfraError
from pytest_hemra.execute.sandbox import (
    AGENT_HOME,
    AGENT_USER,
    ROOT_USER,
    WORKDIR,
    SandboxRequest,
    buildkit,
    firewall,
    leftovers,
)
from pytest_hemra.execute.sandbox.container import (
    DOCKER_ERRORS,
    DockerSandbox,
    remove_container,
)
from pytest_hemra.execute.sandbox.health import fixed_environment, ping, probe_client, probe_for
from pytest_hemra.execute.sandbox.images import base_images, build_tail, copy_image, engine_lock
from pytest_hemra.resolve.compose import MAIN
from pytest_hemra.resolve.datasets import Task

SANDBOX_LAYER_VERSION = "2"  # 2: the image's USER kept as a label
TASK_REPOSITORY = "hemra-task"
SANDBOX_REPOSITORY = "hemra-sandbox"
POOL_CONNECTIONS = 256  # kept open to the engine: one a trial at once (`run/lanes.py`)
COPY_TIMEOUT_SECS = 900.0  # the longest a runner waits for another copying the same image
NETWORK_LOCK_SECS = 120.0
MIN_NANO_CPUS = 10_000_000  # Docker's smallest cpu quota (0.01 cpu)
GATEWAY_NETWORK = "hemra-gateway"  # every sandbox of the engine: reaches the gateway, nothing else
# What the sandbox's root may do: manage files it does not own and install packages (dpkg's
# chown and modes, apt's switch to its own user), as a task's setup.sh or a verifier needs; no
# CAP_KILL, no network or system administration. The agent's user holds none of them (a
# process of a user other than root has no effective capabilities, and `no-new-privileges`
# keeps setuid and file-capability programs from granting any).
ROOT_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETUID", "SETGID")
BASE_CAPABILITIES = frozenset({"docker", "network_block", "cpu_limit", "memory_limit"})
NETWORK_OPTIONS = {"com.docker.network.bridge.enable_icc": "false"}  # sandboxes never reach peers

SANDBOX_LAYER = f"""\
FROM {{image}}
USER root
RUN mkdir -p {WORKDIR} /logs/agent /logs/verifier {AGENT_HOME} /hemra \\
 && chown -R {AGENT_USER} {WORKDIR} /logs/agent {AGENT_HOME} \\
 && chmod 0755 /logs /logs/verifier /hemra
WORKDIR {WORKDIR}
LABEL hemra.sandbox-layer="{SANDBOX_LAYER_VERSION}" hemra.image-user="{{user}}"
"""
IMAGE_USER = re.compile(r"[A-Za-z0-9_.-]*(:[A-Za-z0-9_.-]+)?")  # "" (root), name, uid:gid
KEEP_ALIVE = ["sh", "-c", "sleep infinity"]  # handed to an image's ENTRYPOINT, as Harbor does
# How a daemon shutting down (`systemctl restart docker`) stops a sandbox: its `sleep` ignores
# SIGTERM, and waiting out Docker's 10 s grace period for each would only hold the restart up.
STOP_SIGNAL = "SIGKILL"


def connect() -> docker.DockerClient:
    try:
        client = docker.from_env(timeout=120, max_pool_size=POOL_CONNECTIONS)
        fixed_environment(client.api)
        client.ping()
    except DOCKER_ERRORS as error:
        raise InfraError(f"docker: the engine does not answer ({error})") from error
    return client


class DockerProvider:
    """One Docker engine: the runner's own (DOCKER_HOST, else the local socket) unless given a
    `client`. `image_source` gives the runner's engine, from which images missing here are
    copied (a pool's engines start with none); `engine` names this one in locks and errors;
    `probe`, a client for pings alone to the same engine (else one made like `client`)."""

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
        self._client = client
        self._capabilities: frozenset[str] | None = None
        self.engine = engine or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        self._image_source = image_source
        # HEMRA's networks and host firewall: the runner's own local engine (its rules go in the
        # runner's tables); a pool's engines keep Docker's default bridge (docs/scaling.md)
        self.own_networks = (
            client is None and self.engine.startswith("unix://")
            if own_networks is None
            else own_networks
        )
        self._probe: Any = probe  # a short-timeout client for pings alone (`engine_error`)
        self._guarded: set[str] = set()  # bridges whose base rules this process has checked
        self._networks: dict[str, Any] = {}  # HEMRA's networks as this process last found them
        self._network_lock = threading.Lock()  # one of the process's threads looks one up
        self._admitted: set[tuple[str, str, int]] = set()  # (bridge, host, port) let in
        self._engine: buildkit.Engine | None = None  # what builds here, asked once

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            self._client = connect()
        return self._client

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
            client = self._client
            self._probe = probe_client() if client is None else probe_for(client.api, self.engine)
        return ping(self._probe)

    def remove_leftovers(self, is_over: Callable[[str], bool]) -> int:
        """After an outage: what HEMRA left on this engine for trials that are over (`is_over`
        by trial id: their runner finished with them or is gone) removed, containers and
        their services networks; what this process remembers of the engine found again."""
        self._networks.clear()
        self._guarded.clear()
        self._admitted.clear()
        return leftovers.remove(self, is_over)

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
                        user = self.client.images.get(base).attrs["Config"].get("User") or ""
                        if not IMAGE_USER.fullmatch(user):  # it goes into a LABEL line as is
                            raise InfraError(
                                f"{task.path}: image {base}: USER {user!r} is not a user name"
                                " or uid (name, uid, name:group, uid:gid)"
                            )
                        dockerfile = SANDBOX_LAYER.format(image=base, user=user).encode()
                        self._build(task, tag=layer_tag, fileobj=io.BytesIO(dockerfile))
            from pytest_hemra.execute.sandbox import services  # which imports this module

            services.prepare_images(self, task)  # a multi-container task's, no layer on them
            return layer_tag
        except DOCKER_ERRORS as error:
            raise InfraError(f"{task.path}: docker failed preparing the image ({error})") from error

    def missing_images(self, task: Task, default_image: str) -> list[str]:
        """What `prepare` would have to build (or find missing) for a task, building nothing."""
        from pytest_hemra.execute.sandbox import services  # which imports this module

        found = services.missing_images(self, task)
        if not task.has_dockerfile:
            image = task.config.environment.docker_image or default_image
            return found if self._has_image(image) else [f"{image} (not on this engine)", *found]
        tag = f"{TASK_REPOSITORY}:{task.environment_digest()[:24]}"
        return found if self._has_image(tag) else [f"{tag} (from {task.environment_dir})", *found]

    def _task_image(self, task: Task, default_image: str) -> str:
        named = task.config.environment.docker_image
        if not task.has_dockerfile:
            image = named or default_image
            self._copy_if_missing(image)
            if not self._has_image(image):
                raise InfraError(f"{task.path}: image {image!r} is not on this docker engine")
            return str(self.client.images.get(image).id)
        tag = f"{TASK_REPOSITORY}:{task.environment_digest()[:24]}"
        if not self._has_image(tag):  # a pool's engine: built at resolve on the runner's, copied
            self._copy_if_missing(tag)
        if not self._has_image(tag):
            with self._lock(tag, task.config.environment.build_timeout_sec):
                if not self._has_image(tag):
                    dockerfile = (task.environment_dir / "Dockerfile").read_text(errors="replace")
                    for base in base_images(dockerfile):
                        self._copy_if_missing(base)
                    self.build_dockerfile(task, tag=tag, context=task.environment_dir)
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

    def build_dockerfile(
        self,
        task: Task,
        *,
        tag: str,
        context: Path,
        dockerfile: str = "Dockerfile",
        buildargs: Mapping[str, str] | None = None,
    ) -> None:
        """Build `context/dockerfile` as `tag`: by the classic builder, or by the engine's
        BuildKit when a line needs it (`buildkit.py`); a line this engine cannot build refuses
        the build in one line naming the file, the line and what would build it."""
        found = buildkit.buildkit_lines((context / dockerfile).read_text(errors="replace"))
        options: dict[str, Any] = {} if dockerfile == "Dockerfile" else {"dockerfile": dockerfile}
        if buildargs is not None:
            options["buildargs"] = dict(buildargs)
        if not found:
            self._build(task, tag=tag, path=str(context), **options)
            return
        if self._engine is None:
            self._engine = buildkit.engine_builder(self.client.version())
        reason = buildkit.refusal(context / dockerfile, found, self._engine)
        if reason is not None:
            raise InfraError(reason)
        try:
            buildkit.build(
                self.client,
                context,
                tag=tag,
                dockerfile=dockerfile,
                labels={"hemra.task": task.name},
                buildargs=buildargs,
                timeout=task.config.environment.build_timeout_sec,
            )
        except InfraError as error:
            raise InfraError(f"{task.path}: {error}") from error

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
            tail = build_tail(error.build_log)
            raise InfraError(f"{task.path}: image build failed: {error.msg} ({tail})") from error

    def gateway_host(self) -> str | None:
        """The host side of every sandbox's network, where the gateway listens for them:
        `hemra-gateway`'s (created when missing), else (a pool's engine) the default bridge's.
        Runs' networks no sandbox uses any more, and gateway ports whose runner is gone (and
        nothing listens on), are reaped meanwhile."""
        if self.own_networks:
            try:
                gateway = self._network(GATEWAY_NETWORK, internal=True, labels={})
                for network in self.client.networks.list(filters={"label": "hemra.run"}):
                    self._remove_run_network(network.attrs["Labels"]["hemra.run"])  # if empty
                firewall.reap_admitted(_bridge_of(gateway), _listening)  # runners gone
                return _gateway_of(gateway)
            except DOCKER_ERRORS as error:
                raise InfraError(f"docker: cannot create {GATEWAY_NETWORK} ({error})") from error
        try:
            return _gateway_of(self.client.networks.get("bridge"))
        except docker.errors.NotFound:
            return None  # an engine with no bridge network (dockerd --bridge=none): no network
        except DOCKER_ERRORS as error:
            raise InfraError(f"docker: cannot read the bridge network ({error})") from error

    def _network(self, name: str, *, internal: bool, labels: Mapping[str, str]) -> Any:
        """HEMRA's network `name`, created when missing (under the engine's lock, so concurrent
        runners and xdist workers agree on one), its host firewall in place. Remembered: a
        network removed since shows as NotFound where it is used, and `_on_networks` asks again."""
        if name in self._networks:
            return self._networks[name]
        with (  # one thread of the process finds or makes it; the others then find it here
            self._network_lock,
            engine_lock(self.engine, f"network {name}", NETWORK_LOCK_SECS),
        ):
            if name in self._networks:
                return self._networks[name]
            network = self._find_network(name)
            if network is None:
                network = self.client.networks.create(
                    name,
                    driver="bridge",
                    internal=internal,
                    options=NETWORK_OPTIONS,
                    labels={"hemra": "1", **labels},
                    check_duplicate=True,
                )
                network.reload()
            bridge = _bridge_of(network)
            if bridge not in self._guarded:
                firewall.reap()
                firewall.guard(bridge)
                self._guarded.add(bridge)
            self._networks[name] = network
            return network

    def _find_network(self, name: str) -> Any:
        """The network named `name`, inspected; None when there is none (or it was removed
        between listing and inspecting it)."""
        for network in self.client.networks.list(names=[name]):
            if network.name == name:
                try:
                    network.reload()
                except docker.errors.NotFound:
                    return None
                return network
        return None

    def release(self, run_id: str, gateway_port: int | None, *ports: int | None) -> None:
        """A runner process is done: its gateway's port (and `ports`: its egress proxy's) is
        closed again, and its run's network removed unless another process's sandboxes still
        sit on it (the last one removes it). Called while the gateway still holds its ports, so
        no other gateway can have been given one of them yet."""
        if not self.own_networks:
            return
        try:
            if gateway_port is not None:
                gateway = self._find_network(GATEWAY_NETWORK)
                host = _gateway_of(gateway) if gateway is not None else None
                for network in (gateway, self._find_network(run_network(run_id))):
                    for port in (gateway_port, *ports):
                        if network is not None and host is not None and port is not None:
                            firewall.revoke(_bridge_of(network), host, port)
                            self._admitted.discard((_bridge_of(network), host, port))
            self._remove_run_network(run_id)
        except DOCKER_ERRORS as error:
            raise InfraError(f"docker: cannot release run {run_id}'s networks ({error})") from error

    def _remove_run_network(self, run_id: str) -> None:
        name = run_network(run_id)
        with (
            engine_lock(self.engine, f"connect {name}", NETWORK_LOCK_SECS),
            engine_lock(self.engine, f"network {name}", NETWORK_LOCK_SECS),
        ):
            network = self._find_network(name)
            if network is None or network.attrs.get("Containers"):
                return
            filters = {"label": [f"hemra.run={run_id}"]}
            if self.client.containers.list(all=True, filters=filters, ignore_removed=True):
                return  # a sandbox of the run still exists (one cut off for its verifier, say)
            bridge = _bridge_of(network)
            try:
                network.remove()
            except docker.errors.APIError as error:
                if error.status_code not in (403, 404, 409):  # still in use, or already gone
                    raise
                return
            firewall.unguard(bridge)
            self._guarded.discard(bridge)
            self._networks.pop(name, None)

    def remove_sandboxes(self, labels: Mapping[str, str]) -> int:
        from pytest_hemra.execute.sandbox import services  # which imports this module

        filters = {"label": ["hemra=1", *(f"{key}={value}" for key, value in labels.items())]}
        try:
            found = self.client.containers.list(all=True, filters=filters, ignore_removed=True)
            for container in found:
                remove_container(container)
            services.remove_networks(self, filters["label"])
            if self.own_networks and "hemra.run" in labels and len(labels) == 1:
                self._remove_run_network(labels["hemra.run"])
        except DOCKER_ERRORS as error:
            raise InfraError(f"docker: cannot remove sandboxes {dict(labels)} ({error})") from error
        return len(found)

    @contextmanager
    def open(self, request: SandboxRequest) -> Iterator[DockerSandbox]:
        """The sandbox, started: the image's ENTRYPOINT kept when it has one (its services may
        run; the keep-alive is its command), else `sleep infinity` as PID 1."""
        limits = request.limits
        try:
            entrypoint = self.client.images.get(request.image).attrs["Config"].get("Entrypoint")
        except DOCKER_ERRORS as error:
            raise InfraError(f"docker: cannot read image {request.image} ({error})") from error
        options: dict[str, Any] = {
            "entrypoint": None if entrypoint else ["sleep", "infinity"],
            "command": KEEP_ALIVE if entrypoint else [],
            "user": ROOT_USER,  # PID 1: root, so root's commands hold ROOT_CAPABILITIES
            "init": True,  # docker-init as PID 1: it reaps, and its death empties the sandbox
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
        container = None
        try:
            run_id = request.labels.get("hemra.run")
            if self.own_networks and run_id:
                container = self._on_networks(request, options, run_id)
            elif request.services_network and not request.network:  # a pool's, with services
                container = self._on_services(request, options)
            else:  # a pool's, or outside any run (tests, benchmarks): Docker's default bridge
                container = self.client.containers.create(request.image, **options)
                self._join_services(container, request)
                container.start()
            kept = (request.services_network,) if request.services_network else ()
            yield DockerSandbox(
                self.client,
                container,
                runs_services=bool(entrypoint),
                entrypoint=tuple(entrypoint or ()),
                kept=kept,
                gateway_network=GATEWAY_NETWORK if self.own_networks and run_id else None,
                output_cap=request.output_cap,
            )
        except DOCKER_ERRORS as error:
            raise InfraError(f"docker: sandbox failed ({error})") from error
        finally:
            if container is not None:  # slow for what the trial left, with the engine up: waited
                remove_container(container, answers=lambda: self.engine_error() is None)

    def _on_networks(self, request: SandboxRequest, options: dict[str, Any], run_id: str) -> Any:
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
            self._networks.clear()  # one was removed meanwhile: find (or make) them again
        if not request.network:
            return self._place(request, options, run_id, whole=False)
        name = run_network(run_id)
        with engine_lock(self.engine, f"connect {name}", NETWORK_LOCK_SECS, shared=True):
            return self._place(request, options, run_id, whole=True)

    def _place(
        self, request: SandboxRequest, options: dict[str, Any], run_id: str, *, whole: bool
    ) -> Any:
        """Create and start the container on its network (`_on_networks`); `whole`: the caller
        holds the run network's lock, else it is taken while the container is created."""
        gateway = self._network(GATEWAY_NETWORK, internal=True, labels={})
        host = _gateway_of(gateway)
        network = gateway
        lock: AbstractContextManager[Any] = contextlib.nullcontext()
        if request.network:
            name = run_network(run_id)
            if not whole:  # shared: sandboxes join at once; only its removal waits for them
                lock = engine_lock(self.engine, f"connect {name}", NETWORK_LOCK_SECS, shared=True)
            network = self._network(name, internal=False, labels={"hemra.run": run_id})
        admits = [(network, request.gateway_port), (network, request.proxy_port)]
        if network is not gateway:  # a verifier's allowlist or model moves it to hemra-gateway
            admits += [(gateway, request.proxy_port), (gateway, request.gateway_port)]
        for on, port in admits:
            admitted = (_bridge_of(on), host or "", port or 0)
            if port is not None and host and admitted not in self._admitted:
                firewall.admit(*admitted)
                self._admitted.add(admitted)
        container = None
        try:
            with lock:
                container = self.client.containers.create(
                    request.image, network=network.name, **options
                )
            self._join_services(container, request)
            container.start()
            return container
        except BaseException:
            if container is not None:
                remove_container(container)
            raise

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
            container.start()
        except BaseException:
            remove_container(container)
            raise
        return container

    def _join_services(self, container: Any, request: SandboxRequest) -> None:
        """A multi-container task's sandbox joins its trial's services network as `main`,
        before it starts (its services are up by then: `open_services`)."""
        if request.services_network:
            network = self.client.networks.get(request.services_network)
            network.connect(container, aliases=[MAIN])

    def open_services(
        self, task: Task, request: SandboxRequest, logs: Path
    ) -> AbstractContextManager[str | None]:
        """A multi-container task's services running beside the trial (`services.py`): the
        network's name for the sandbox (`SandboxRequest.services_network`), None without."""
        from pytest_hemra.execute.sandbox import services  # which imports this module

        return services.running(self, task, request, logs)


def run_network(run_id: str) -> str:
    """The network of a run's sandboxes with internet: `hemra-<run id>`."""
    return f"hemra-{run_id}"


def _bridge_of(network: Any) -> str:
    options = network.attrs.get("Options") or {}
    return str(options.get("com.docker.network.bridge.name") or f"br-{network.id[:12]}")


def _gateway_of(network: Any) -> str | None:
    for config in network.attrs["IPAM"]["Config"] or []:
        if config.get("Gateway"):
            return str(config["Gateway"]).split("/")[0]
        if config.get("Subnet") and ":" not in config["Subnet"]:
            subnet = ipaddress.ip_network(config["Subnet"], strict=False)
            return str(next(subnet.hosts()))
    return None


def _listening(host: str, port: int) -> bool:
    """Whether something on this machine still accepts connections at host:port."""
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False
