"""A pool of Docker engines (`[[sandbox.engines]]`): each trial placed on one with a free slot.

Slots are claimed in the store, in one transaction (`Store.claim_engine`), so xdist workers and
`hemra serve` sessions sharing a store never fill an engine past its capacity; workers are not
pinned to engines. Each process keeps its own view of which engines answer: an engine is pinged
before a trial is placed on it and again when a trial on it fails; one that does not answer is
marked down and skipped, and pinged again after `DOWN_RECHECK_SECS`, so it is used again once
it is back (leftover sandboxes of trials that are over are removed from it then). Task images
are built at resolve on the runner's own engine (`prepare`); a trial's engine copies the one it
lacks from there (`docker save | docker load`), or builds it (any base image it lacks copied
over) when the runner's engine does not hold it, and caches it by content digest.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
import docker.tls

from pytest_hemra.core.errors import EngineOutage, InfraError, SpecError
from pytest_hemra.core.records import EngineSlot
from pytest_hemra.execute.sandbox import (
    Placement,
    Sandbox,
    SandboxPool,
    SandboxProvider,
    SandboxRequest,
)
from pytest_hemra.execute.sandbox.client import DOCKER_ERRORS
from pytest_hemra.execute.sandbox.docker_engine import BASE_CAPABILITIES, DockerEngine
from pytest_hemra.execute.sandbox.health import fixed_environment, one_line, ping
from pytest_hemra.resolve.datasets import Task
from pytest_hemra.resolve.spec import EngineSettings, EngineTLS
from pytest_hemra.store import Store
from pytest_hemra.store.owner import is_alive

PING_TIMEOUT_SECS = 3.0
CLIENT_TIMEOUT_SECS = 120.0
UP_FOR_SECS = 2.0  # a ping this recent says an engine answers
FRESH_SECS = 0.5  # ... and this recent, just before a trial is placed on it
DOWN_RECHECK_SECS = 5.0  # an engine marked down is pinged again after this long
SLOT_POLL_SECS = 0.2
NO_ENGINE_SECS = 60.0  # no engine answering for this long: the trial is an infra_error
SLOT_WAIT_SECS = 24 * 3600.0  # the longest a trial waits for a free slot
PROBE_API_VERSION = "1.24"  # the oldest API engines still serve: a ping needs nothing newer


@dataclass(frozen=True)
class Engine:
    """One engine of the pool, as the run file names it."""

    name: str
    address: str
    capacity: int
    gateway_host: str | None = None
    tls: EngineTLS | None = None

    @classmethod
    def from_settings(cls, settings: EngineSettings) -> Engine:
        return cls(
            settings.label,
            settings.address,
            settings.capacity,
            settings.gateway_host,
            settings.tls,
        )

    @property
    def host(self) -> str | None:
        """The host of a tcp:// or ssh:// address; None for a local socket."""
        scheme, rest = self.address.split("://", 1)
        if scheme == "unix":
            return None
        return rest.rsplit("@", 1)[-1].rsplit(":", 1)[0]

    @property
    def is_local(self) -> bool:
        """Whether the engine runs on the runner's machine (its sandboxes can bind-mount the
        runner's files and reach the runner on the engine's bridge address)."""
        return self.host is None or is_local_host(self.host)


def is_local_host(host: str) -> bool:
    """Whether `host` names this machine: a loopback address, or one it can bind."""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None, socket.AF_INET)}
    except OSError:
        return False
    for address in addresses:
        if ipaddress.ip_address(address).is_loopback:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((address, 0))
            except OSError:
                return False
    return bool(addresses)


def client_options(engine: Engine, timeout: float) -> dict[str, Any]:
    """Keyword arguments of docker.DockerClient / APIClient for the engine."""
    options: dict[str, Any] = {"base_url": engine.address, "timeout": timeout}
    if engine.address.startswith("ssh://"):
        options["use_ssh_client"] = True  # the ssh binary, its config and agent; no paramiko
    if engine.tls is not None:
        tls = engine.tls
        options["tls"] = docker.tls.TLSConfig(
            client_cert=(tls.cert, tls.key) if tls.cert and tls.key else None,
            ca_cert=tls.ca,
            verify=tls.verify,
        )
    return options


def with_engine_ca(api: Any, engine: Engine) -> Any:
    """Verify the engine against its own `tls.ca`, whatever REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE
    say: requests lets those override a session's CA on every request."""
    ca = engine.tls.ca if engine.tls is not None and engine.tls.verify else None
    if ca is None:
        return api
    merge = api.merge_environment_settings

    def merged(*args: Any, **kwargs: Any) -> dict[str, Any]:
        settings: dict[str, Any] = merge(*args, **kwargs)
        settings["verify"] = ca
        return settings

    api.merge_environment_settings = merged
    return api


@dataclass
class _Health:
    answers: bool
    checked: float
    error: str | None = None


class EnginePool(SandboxProvider):
    """The docker provider spread over several engines; a `SandboxPool` (its `placement`) and,
    for what concerns every engine at once (checks, removing sandboxes), a `SandboxProvider`."""

    name = "docker"
    capabilities = BASE_CAPABILITIES  # a pool's engines: no disk limit is promised

    def __init__(
        self,
        engines: Sequence[EngineSettings],
        store: Store | None = None,
        owner: str = "",
        source: str = "run file",
    ) -> None:
        self.engines = tuple(Engine.from_settings(settings) for settings in engines)
        self.store = store
        self.owner = owner
        self.source = source  # the run file, named in errors
        self._by_name = {engine.name: engine for engine in self.engines}
        self._providers: dict[str, DockerEngine] = {}
        self._probes: dict[str, docker.APIClient] = {}
        self._health: dict[str, _Health] = {}
        self._holding: set[tuple[str, str]] = set()
        self._bridge_hosts: dict[str, str | None] = {}
        self._runner: list[docker.DockerClient | None] = []
        self._build_on: DockerEngine | None = None  # where images are built at resolve
        self._lock = threading.Lock()  # heartbeat threads remove sandboxes too

    # -- health ---------------------------------------------------------------------------

    def ping(self, engine: Engine) -> str | None:
        """Ping the engine now: None when it answers, else why not (and it is marked down)."""
        error = ping(self._probe(engine))
        was = self._health.get(engine.name)
        self._health[engine.name] = _Health(error is None, time.monotonic(), error)
        if error is None and (was is None or not was.answers):
            self._reap(engine)  # first seen, or back: what trials that are over left there
        return error

    def _probe(self, engine: Engine) -> Any:
        """A client with a short timeout, for pings (made without asking the engine anything)."""
        probe = self._probes.get(engine.name)
        if probe is None:
            options = client_options(engine, PING_TIMEOUT_SECS)
            probe = with_engine_ca(docker.APIClient(version=PROBE_API_VERSION, **options), engine)
            self._probes[engine.name] = probe
        return probe

    def answers(self, engine: Engine, within: float = UP_FOR_SECS) -> bool:
        """Whether the engine answers, by a ping at most `within` seconds old (an engine marked
        down is pinged again only after DOWN_RECHECK_SECS)."""
        health = self._health.get(engine.name)
        now = time.monotonic()
        if health is not None:
            if health.answers and now - health.checked <= within:
                return True
            if not health.answers and now - health.checked < DOWN_RECHECK_SECS:
                return False
        return self.ping(engine) is None

    def error(self, engine: Engine) -> str | None:
        health = self._health.get(engine.name)
        return None if health is None else health.error

    def provider(self, engine: Engine) -> DockerEngine:
        """This process's docker provider for one engine (created once it answered)."""
        found = self._providers.get(engine.name)
        if found is None:
            try:
                served = self._probe(engine).version(api_version=False)["ApiVersion"]
                options = client_options(engine, CLIENT_TIMEOUT_SECS)
                client = docker.DockerClient(version=str(served), **options)
                with_engine_ca(fixed_environment(client.api), engine)
            except DOCKER_ERRORS as error:
                raise InfraError(f"engine {engine.name}: no answer ({one_line(error)})") from error
            found = DockerEngine(
                client,
                engine=engine.address,
                image_source=self._runner_engine,
                probe=self._probe(engine),
            )
            self._providers[engine.name] = found
        return found

    def _runner_engine(self) -> docker.DockerClient | None:
        """The runner's own engine (DOCKER_HOST, else the local socket), where images missing
        on a pool's engine are copied from; None when there is none."""
        if not self._runner:
            try:
                client = docker.from_env(timeout=CLIENT_TIMEOUT_SECS)
                fixed_environment(client.api)
                client.ping()
                self._runner.append(client)
            except DOCKER_ERRORS:
                self._runner.append(None)
        return self._runner[0]

    def _reap(self, engine: Engine) -> None:
        """Remove the engine's sandboxes whose trial, in this store, is over (an engine that
        died mid-trial comes back with them); sandboxes of other stores are left alone."""
        store = self.store
        if store is None:
            return
        with contextlib.suppress(*DOCKER_ERRORS, InfraError):
            self.provider(engine).remove_leftovers(lambda t: store.is_trial_over(t, is_alive))

    # -- the SandboxProvider face ---------------------------------------------------------

    def check(self) -> None:
        """At resolve: the settings each engine needs, and at least one engine answering."""
        for index, engine in enumerate(self.engines):
            key = f"{self.source}: key 'sandbox.engines[{index}]"
            for field in ("ca", "cert", "key"):
                path = getattr(engine.tls, field, None)
                if path is not None and not Path(path).is_file():
                    raise SpecError(f"{key}.tls.{field}': no file {path}")
            if engine.gateway_host is None and not engine.is_local:
                raise SpecError(
                    f"{key}.gateway_host' is required: engine {engine.name} is on another"
                    " machine, and its sandboxes reach the runner's gateway at that address"
                )
        errors = {engine.name: self.ping(engine) for engine in self.engines}
        if all(errors.values()):
            raise InfraError(
                "no engine of [[sandbox.engines]] answers: "
                + "; ".join(f"{name}: {error}" for name, error in errors.items())
            )

    def prepare(self, task: Task, default_image: str) -> str:
        """At resolve: the task's image built (or found) on the runner's own engine, which every
        engine of the pool copies it from at its first trial there (the same image everywhere,
        built once); a runner with no engine of its own builds on the first engine answering.
        A trial prepares it again on the engine it is placed on."""
        return self._builder().prepare(task, default_image)

    def missing_images(self, task: Task, default_image: str) -> list[str]:
        """What `prepare` would build for the task, building nothing."""
        return self._builder().missing_images(task, default_image)

    def _builder(self) -> DockerEngine:
        with self._lock:
            if self._build_on is None:
                runner = self._runner_engine()
                if runner is not None:
                    self._build_on = DockerEngine(runner)
                else:
                    up = [engine for engine in self.engines if self.answers(engine)]
                    if not up:
                        raise InfraError("no engine of [[sandbox.engines]] answers to build on")
                    self._build_on = self.provider(up[0])
            return self._build_on

    def open(self, request: SandboxRequest) -> contextlib.AbstractContextManager[Sandbox]:
        raise InfraError("an engine pool opens sandboxes once a trial is placed")

    def engine_error(self, engine: str | None = None) -> str | None:
        """None when an engine of the pool answers (a trial can be placed), else why none;
        with `engine`, whether that one answers now."""
        if engine in self._by_name:
            return self.ping(self._by_name[engine])
        if any(self.answers(engine) for engine in self.engines):
            return None
        return "; ".join(f"{engine.name}: {self.error(engine)}" for engine in self.engines)

    def remove_leftovers(self, is_over: Callable[[str], bool]) -> int:
        """What trials that are over left on the engines that answer, removed."""
        removed = 0
        for engine in self.engines:
            if self.answers(engine):
                with contextlib.suppress(*DOCKER_ERRORS, InfraError):
                    removed += self.provider(engine).remove_leftovers(is_over)
        return removed

    def gateway_host(self) -> str | None:
        """The first answering local engine's bridge address (as a single engine has it)."""
        for engine in self.engines:
            if engine.is_local and self.answers(engine):
                host = self.gateway_host_of(engine)
                if host != "127.0.0.1":
                    return host
        return None

    def gateway_hosts(self) -> list[str]:
        """Every address the gateway must listen on for the pool's sandboxes: each engine's
        `gateway_host`, else (an engine on this machine) its bridge network's gateway."""
        hosts = [
            self.gateway_host_of(engine)
            for engine in self.engines
            if engine.gateway_host is not None or self.answers(engine)
        ]
        return list(dict.fromkeys(host for host in hosts if host != "127.0.0.1"))

    def gateway_host_of(self, engine: Engine) -> str:
        """Where the engine's sandboxes reach the runner: its `gateway_host`, else its bridge
        network's gateway, else loopback (an engine with no bridge gives sandboxes no network)."""
        if engine.gateway_host is not None:
            return engine.gateway_host
        if engine.name not in self._bridge_hosts:
            try:
                host = self.provider(engine).gateway_host()
            except InfraError:
                host = None  # no bridge network (dockerd --bridge=none): sandboxes get none
            self._bridge_hosts[engine.name] = host
        return self._bridge_hosts[engine.name] or "127.0.0.1"

    def remove_sandboxes(self, labels: Mapping[str, str]) -> int:
        """Remove them from every engine that answers; an engine that does not has its own
        removed when it is back (see `_reap`)."""
        removed, errors = 0, []
        with self._lock:
            for engine in self.engines:
                if not self.answers(engine):
                    continue
                try:
                    removed += self.provider(engine).remove_sandboxes(labels)
                except InfraError as error:
                    errors.append(f"{engine.name}: {error}")
        if errors:
            raise InfraError("; ".join(errors))
        return removed

    # -- placement ------------------------------------------------------------------------

    def placement(self) -> SandboxPool:
        """The pool itself: every trial is placed on one of its engines first."""
        return self

    @contextmanager
    def place(self, trial: str, task: Task, default_image: str) -> Iterator[Placement]:
        """Hold a slot for the trial on an engine that answers, until the context exits; a
        failure under it pings the engine, and one that stopped answering is marked down."""
        store = self.store
        if store is None:
            raise InfraError("engine pool: no store to place trials through")
        engine = self._claim(store, trial, task, default_image)
        try:
            yield Placement(engine.name, self.provider(engine), self.gateway_host_of(engine))
        except Exception as failure:
            if self.ping(engine) is not None:
                raise EngineOutage(
                    f"engine {engine.name} stopped answering ({one_line(failure)})"
                ) from failure
            raise
        finally:
            store.release_engine(trial)

    def _claim(self, store: Store, trial: str, task: Task, default_image: str) -> Engine:
        started = last_answer = time.monotonic()
        while True:
            now = time.monotonic()
            with self._lock:
                up = [engine for engine in self.engines if self.answers(engine)]
            if up:
                last_answer = now
                slots = [
                    EngineSlot(e.name, e.address, e.capacity, self._holds(e, task, default_image))
                    for e in up
                ]
                chosen = store.claim_engine(trial, self.owner, slots, is_alive)
                if chosen is not None:
                    engine = self._by_name[chosen.name]
                    if self.answers(engine, within=FRESH_SECS):
                        return engine
                    store.release_engine(trial)
                    continue
            elif now - last_answer > NO_ENGINE_SECS:
                raise EngineOutage(
                    f"no engine of [[sandbox.engines]] answered for {NO_ENGINE_SECS:g}s: "
                    + "; ".join(f"{e.name}: {self.error(e)}" for e in self.engines)
                )
            if now - started > SLOT_WAIT_SECS:
                raise InfraError(f"no engine slot came free in {SLOT_WAIT_SECS:g}s")
            time.sleep(SLOT_POLL_SECS)

    def _holds(self, engine: Engine, task: Task, default_image: str) -> bool:
        """Whether the engine already holds the task's image (remembered once seen)."""
        try:
            provider = self.provider(engine)
        except InfraError:
            return False
        image = provider.task_image(task, default_image)
        if (engine.name, image) in self._holding:
            return True
        if provider.has_image(image):
            self._holding.add((engine.name, image))
            return True
        return False
