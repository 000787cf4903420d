"""A Docker engine's client: what its errors look like, and a client connected on first use."""

from __future__ import annotations

import os

import docker
import docker.errors
import requests

from pytest_hemra.core.backoff import engine_timeout_secs
from pytest_hemra.core.errors import InfraError
from pytest_hemra.execute.sandbox.health import fixed_environment

DOCKER_ERRORS = (docker.errors.DockerException, requests.RequestException)
POOL_CONNECTIONS = 256  # kept open to the engine: one a trial at once (`run/lanes.py`)
LOCAL_ENGINE = "unix:///var/run/docker.sock"


def connect() -> docker.DockerClient:
    """A client of the runner's own engine (DOCKER_HOST, else the local socket), seen to answer."""
    try:
        client = docker.from_env(timeout=engine_timeout_secs(), max_pool_size=POOL_CONNECTIONS)
        fixed_environment(client.api)
        client.ping()
    except DOCKER_ERRORS as error:
        raise InfraError(f"docker: the engine does not answer ({error})") from error
    return client


def on_this_machine(address: str) -> bool:
    """Whether an engine's address is a Unix socket: this machine's engine, which only this
    machine's processes reach (HEMRA's networks and firewall go there; its locks stay in this
    machine's lock files)."""
    return address.startswith("unix://")


class EngineClient:
    """One engine by its address (`address`: named in locks and errors), and its client: the
    one given, else the runner's own engine's (`connect`), made on first use."""

    def __init__(self, client: docker.DockerClient | None = None, address: str | None = None):
        self.address = address or os.environ.get("DOCKER_HOST") or LOCAL_ENGINE
        self._client = client
        self._lock_key: str | None = None

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            self._client = connect()
        return self._client

    @property
    def lock_key(self) -> str:
        """What names this engine in its locks: on a Unix socket (this machine's engine, which
        other processes may reach at another path: a symlink, a proxy), the engine's own ID,
        asked once; else its address."""
        if self._lock_key is None:
            if not on_this_machine(self.address):
                return self.address
            try:
                self._lock_key = f"docker {self.client.info()['ID']}"
            except (*DOCKER_ERRORS, KeyError):
                return self.address  # asked again at the next lock: the engine is down
        return self._lock_key

    @property
    def connected(self) -> docker.DockerClient | None:
        """The client if one was given or made already, else None (nothing is asked)."""
        return self._client
