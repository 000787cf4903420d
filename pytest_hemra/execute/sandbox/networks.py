"""HEMRA's networks on the runner's own engine, and the host firewall around them.

A trial's sandbox sits on one of HEMRA's networks, never Docker's default bridge:
`hemra-gateway` (internal: no route out; its host side is where the gateway listens) for a task
without internet, its run's `hemra-<run id>` (the way out) for a task with it. Both have
inter-container traffic off, and the host firewall (`firewall.py`) lets a sandbox reach nothing
of the host but the gateway's port (and, for a task with a host allowlist, its egress proxy's)
on `hemra-gateway`'s host address, and no link-local address: a port is admitted before the
first sandbox that needs it starts, and revoked when its runner releases it. A multi-container
task's services network (`services.py`) is guarded the same way. A pool's engines keep Docker's
default bridge (docs/scaling.md).
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

import docker
import docker.errors

from pytest_hemra.core.errors import InfraError
from pytest_hemra.execute.sandbox import SandboxRequest, firewall
from pytest_hemra.execute.sandbox.client import DOCKER_ERRORS, EngineClient
from pytest_hemra.execute.sandbox.images import engine_lock

NETWORK_LOCK_SECS = 120.0
GATEWAY_NETWORK = "hemra-gateway"  # every sandbox of the engine: reaches the gateway, nothing else
NETWORK_OPTIONS = {"com.docker.network.bridge.enable_icc": "false"}  # sandboxes never reach peers
SERVICES_LABEL = "hemra.services"  # a trial's services network
RUN_LABEL = "hemra.run"  # a run's network (`hemra-<run id>`), and its sandboxes
STUCK_NETWORK = (
    "the engine refuses, holding an endpoint it no longer lists (a Docker fault under load);"
    " restarting the Docker daemon clears it, and `hemra clean` then removes the network"
)


class Networks:
    """HEMRA's networks of one engine as this process found them; `own`: whether the engine has
    them (the runner's own local engine: its firewall rules go in the runner's tables)."""

    def __init__(self, engine: EngineClient, own: bool) -> None:
        self.engine = engine
        self.own = own
        self._guarded: set[str] = set()  # bridges whose base rules this process has checked
        self._networks: dict[str, Any] = {}  # HEMRA's networks as this process last found them
        self._lock = threading.Lock()  # one of the process's threads looks one up
        self._admitted: set[tuple[str, str, int]] = set()  # (bridge, host, port) let in
        # what the engine (networks) and the host (firewall chains) kept at this process's
        # start that HEMRA could not remove, by kind and name ("network hemra-<run id>"), each
        # with what to do
        self.stuck: dict[str, str] = {}

    @property
    def client(self) -> docker.DockerClient:
        return self.engine.client

    def forget(self, *, everything: bool = True) -> None:
        """Find the networks again at their next use (one was removed meanwhile); with
        `everything`, the bridges guarded and the ports admitted too (after an outage)."""
        self._networks.clear()
        if everything:
            self._guarded.clear()
            self._admitted.clear()

    def gateway_host(self) -> str | None:
        """The host side of every sandbox's network, where the gateway listens for them:
        `hemra-gateway`'s (created when missing), else (a pool's engine) the default bridge's.
        Gateway ports whose runner is gone (and nothing listens on) are reaped meanwhile."""
        if self.own:
            try:
                gateway = self.network(GATEWAY_NETWORK, internal=True, labels={})
                firewall.reap_admitted(bridge_of(gateway), listening)  # runners gone
                return gateway_of(gateway)
            except DOCKER_ERRORS as error:
                raise InfraError(f"docker: cannot create {GATEWAY_NETWORK} ({error})") from error
        try:
            return gateway_of(self.client.networks.get("bridge"))
        except docker.errors.NotFound:
            return None  # an engine with no bridge network (dockerd --bridge=none): no network
        except DOCKER_ERRORS as error:
            raise InfraError(f"docker: cannot read the bridge network ({error})") from error

    def network(self, name: str, *, internal: bool, labels: Mapping[str, str]) -> Any:
        """HEMRA's network `name`, created when missing (under the engine's lock, so concurrent
        runners and xdist workers agree on one), its host firewall in place. Remembered: a
        network removed since shows as NotFound where it is used, which then asks again."""
        if name in self._networks:
            return self._networks[name]
        with (  # one thread of the process finds or makes it; the others then find it here
            self._lock,
            self._lock_of(f"network {name}"),
        ):
            if name in self._networks:
                return self._networks[name]
            network = self.find(name)
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
            bridge = bridge_of(network)
            if bridge not in self._guarded:
                firewall.reap()
                firewall.guard(bridge, internal=internal)
                self._guarded.add(bridge)
            self._networks[name] = network
            return network

    def find(self, name: str) -> Any:
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

    def _lock_of(self, what: str, *, shared: bool = False) -> AbstractContextManager[None]:
        """The engine's lock on `what` (one of its networks), by the engine's own ID: every
        process of the machine agrees on it, whatever path it reaches the engine at."""
        key = self.engine.lock_key
        return engine_lock(self.engine.address, what, NETWORK_LOCK_SECS, shared=shared, key=key)

    def run_lock(self, run_id: str) -> AbstractContextManager[None]:
        """Held, shared, while a container joins the run's network; its removal takes it alone."""
        name = run_network(run_id)
        return self._lock_of(f"connect {name}", shared=True)

    def sandbox_network(
        self, request: SandboxRequest, run_id: str, *, locked: bool
    ) -> tuple[Any, AbstractContextManager[Any]]:
        """The network a sandbox of the run is created on (`hemra-gateway` without internet,
        its run's network with it), the gateway's and egress proxy's ports admitted on it and on
        `hemra-gateway` (a verifier's allowlist or model moves it there); and the lock to hold
        while the container is created (the run network's, unless the caller holds it: `locked`)."""
        gateway = self.network(GATEWAY_NETWORK, internal=True, labels={})
        host = gateway_of(gateway)
        network = gateway
        lock: AbstractContextManager[Any] = contextlib.nullcontext()
        if request.network:
            if not locked:  # shared: sandboxes join at once; only its removal waits for them
                lock = self.run_lock(run_id)
            name = run_network(run_id)
            network = self.network(name, internal=False, labels={RUN_LABEL: run_id})
        admits = [(network, request.gateway_port), (network, request.proxy_port)]
        if network is not gateway:
            admits += [(gateway, request.proxy_port), (gateway, request.gateway_port)]
        for on, port in admits:
            admitted = (bridge_of(on), host or "", port or 0)
            if port is not None and host and admitted not in self._admitted:
                firewall.admit(*admitted)
                self._admitted.add(admitted)
        return network, lock

    def release(self, run_id: str, ports: Sequence[int]) -> None:
        """A runner process is done: its gateway's `ports` (the gateway's, its egress proxy's)
        are closed again, and its run's network removed unless another process's sandboxes
        still sit on it (the last one removes it). Called while the gateway still holds its
        ports, so no other gateway can have been given one of them yet."""
        if not self.own:
            return
        try:
            removed = self.remove_run_network(run_id)  # its firewall chain with it
            if ports:
                gateway = self.find(GATEWAY_NETWORK)
                host = gateway_of(gateway) if gateway is not None else None
                kept = None if removed else self.find(run_network(run_id))
                for network in (gateway, kept):
                    for port in ports:
                        if network is not None and host is not None:
                            firewall.revoke(bridge_of(network), host, port)
                            self._admitted.discard((bridge_of(network), host, port))
        except DOCKER_ERRORS as error:
            raise InfraError(f"docker: cannot release run {run_id}'s networks ({error})") from error

    def reap_run_networks(self) -> None:
        """Runs' networks no sandbox of their run sits on, removed; one the engine keeps is
        tried again with its stale endpoints (containers gone) disconnected by force, and then
        named in `stuck` with what to do (each runner's start tries again); the same for the
        firewall chains of bridges that are gone. Only on the engine whose networks are
        HEMRA's (`own`)."""
        self.stuck = {}
        if not self.own:
            return
        self._reap_networks()
        firewall.reap()
        self.stuck.update({f"firewall chain {c}": w for c, w in firewall.stuck_chains().items()})

    def _reap_networks(self) -> None:
        for network in self.client.networks.list(filters={"label": RUN_LABEL}):
            run_id = (network.attrs.get("Labels") or {}).get(RUN_LABEL)
            if not run_id:
                continue
            self.remove_run_network(run_id)  # if no sandbox of its run is on it
            if self.find(network.name) is None or self.run_has_containers(run_id):
                continue  # removed, or in use
            self.drop_stale_endpoints(network)
            self.remove_run_network(run_id)
            left = self.find(network.name)
            if left is not None:
                self.stuck[f"network {network.name}"] = why_stuck(left)

    def run_has_containers(self, run_id: str) -> bool:
        filters = {"label": [f"{RUN_LABEL}={run_id}"]}
        return bool(self.client.containers.list(all=True, filters=filters, sparse=True))

    def drop_stale_endpoints(self, network: Any) -> None:
        """Disconnect, with force, the endpoints of containers that no longer exist."""
        with contextlib.suppress(docker.errors.NotFound):
            network.reload()
        for endpoint, attached in (network.attrs.get("Containers") or {}).items():
            try:
                self.client.containers.get(endpoint)
            except docker.errors.NotFound:
                with contextlib.suppress(docker.errors.APIError):
                    network.disconnect(attached.get("Name") or endpoint, force=True)

    def remove_run_network(self, run_id: str) -> bool:
        """The run's network removed, and its firewall chain, unless a sandbox of the run is
        still on it (or exists: one cut off for its verifier, say). Whether it is gone."""
        name = run_network(run_id)
        with (
            self._lock_of(f"connect {name}"),
            self._lock_of(f"network {name}"),
        ):
            network = self.find(name)
            if network is None:
                return True
            if network.attrs.get("Containers") or self.run_has_containers(run_id):
                return False
            bridge = bridge_of(network)
            try:
                network.remove()
            except docker.errors.APIError as error:
                if error.status_code not in (403, 404, 409):  # still in use, or already gone
                    raise
                return bool(error.status_code == 404)
            firewall.unguard(bridge)
            self._guarded.discard(bridge)
            self._admitted = {rule for rule in self._admitted if rule[0] != bridge}
            self._networks.pop(name, None)
            return True

    def guard_services(self, network: Any, gateway_port: int | None) -> str | None:
        """A trial's services network behind the host firewall, as HEMRA's own networks are: no
        host address but the gateway's port (main may route to it through this bridge too).
        Its bridge, or None on an engine without HEMRA's networks (nothing to guard)."""
        if not self.own:
            return None
        bridge = bridge_of(network)
        firewall.guard(bridge)
        host = gateway_of(self.network(GATEWAY_NETWORK, internal=True, labels={}))
        if gateway_port is not None and host:
            firewall.admit(bridge, host, gateway_port)
        return bridge

    def join_egress(self, container: Any, request: SandboxRequest) -> None:
        """A service of a task with internet joins the run's own network (HEMRA's: firewalled,
        no inter-container traffic), else (an engine without HEMRA's networks) Docker's bridge."""
        run_id = request.labels.get(RUN_LABEL)
        if not (self.own and run_id):
            self.client.networks.get("bridge").connect(container)
            return
        name = run_network(run_id)
        with self.run_lock(run_id):
            network = self.network(name, internal=False, labels={RUN_LABEL: run_id})
            network.connect(container)

    def remove_services_networks(self, filters: list[str]) -> None:
        """The services networks carrying every label of `filters` (a cancelled trial's, a
        run's), removed once their containers are gone, their firewall rules with them."""
        found = self.client.networks.list(filters={"label": [*filters, SERVICES_LABEL]})
        for network in found:
            try:
                network.reload()
            except docker.errors.NotFound:
                continue  # removed since it was listed (its trial's own teardown)
            bridge = bridge_of(network)
            with contextlib.suppress(docker.errors.NotFound):
                network.remove()
            if self.own:
                firewall.unguard(bridge)


def run_network(run_id: str) -> str:
    """The network of a run's sandboxes with internet: `hemra-<run id>`."""
    return f"hemra-{run_id}"


def bridge_of(network: Any) -> str:
    options = network.attrs.get("Options") or {}
    return str(options.get("com.docker.network.bridge.name") or f"br-{network.id[:12]}")


def gateway_of(network: Any) -> str | None:
    for config in network.attrs["IPAM"]["Config"] or []:
        if config.get("Gateway"):
            return str(config["Gateway"]).split("/")[0]
        if config.get("Subnet") and ":" not in config["Subnet"]:
            subnet = ipaddress.ip_network(config["Subnet"], strict=False)
            return str(next(subnet.hosts()))
    return None


def listening(host: str, port: int) -> bool:
    """Whether something on this machine still accepts connections at host:port."""
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def why_stuck(network: Any) -> str:
    """Why the engine keeps a run's network no sandbox of the run is on, and what to do."""
    names = sorted(
        attached.get("Name") or endpoint
        for endpoint, attached in (network.attrs.get("Containers") or {}).items()
    )
    if names:
        return (
            f"containers not HEMRA's sit on it ({', '.join(names)}); disconnect them"
            f" (`docker network disconnect {network.name} CONTAINER`), then `hemra clean`"
        )
    return STUCK_NETWORK
