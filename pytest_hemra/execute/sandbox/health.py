"""Whether a Docker engine answers, and whether an error raised under a trial says it did not.

An engine that stops answering (its daemon stopped, killed or restarting) shows in a trial as a
connection that failed or was cut: that is the engine's outage, not the trial's own
infrastructure fault (an image that would not build, a container Docker refused to create), and
the runner waits it out instead of spending one of the trial's retries on it.
"""

from __future__ import annotations

from typing import Any

import docker
import docker.errors
import docker.tls
import requests
import urllib3.exceptions

from pytest_hemra.core.errors import EngineOutage, causes

PING_TIMEOUT_SECS = 3.0
PROBE_API_VERSION = "1.24"  # the oldest API engines still serve: a ping needs nothing newer
# what the engine's client meets when the engine is not there (its socket gone, its port
# closed, the connection cut mid-answer) or does not answer in time. Not a bare socket error:
# an interactive process's stream breaks that way when the process ends.
UNREACHABLE = (
    EngineOutage,
    requests.ConnectionError,
    requests.Timeout,
    urllib3.exceptions.ProtocolError,
)


def is_engine_fault(error: BaseException) -> bool:
    """Whether `error`, or any error it was raised from or while handling, says the engine
    could not be reached."""
    return _raised_from(error, UNREACHABLE)


def is_slow_answer(error: BaseException) -> bool:
    """Whether `error` (or one it came from) is an engine's answer that did not come in time
    (the client's read timeout), rather than a connection refused or cut: an engine that
    answers pings meanwhile was slow for what the trial asked of it, not gone."""
    return _raised_from(error, (requests.ReadTimeout, urllib3.exceptions.ReadTimeoutError))


def is_engine_answer(error: BaseException) -> bool:
    """Whether `error` came from the engine's API at all (it refused, failed, or could not be
    reached), rather than from HEMRA's own checks: only such an error can be an engine going
    away (a daemon told to stop stops the trial's container and, until it exits, answers the
    trial's requests on connections already open: the container is not running)."""
    return _raised_from(error, (docker.errors.DockerException, requests.RequestException))


def _raised_from(error: BaseException, kinds: tuple[type[BaseException], ...]) -> bool:
    return any(isinstance(found, kinds) for found in causes(error))


def ping(probe: Any) -> str | None:
    """Ping an engine through a short-timeout client of the pings' own, on a new connection
    each time: None when it answers, else why not. A daemon told to stop (SIGTERM) closes its
    socket at once but goes on answering on connections already open until it exits, which
    is once its containers have stopped (10 s for a `sleep infinity` that ignores SIGTERM): a
    ping on a kept connection would find a daemon going away answering all that while."""
    try:
        probe.ping()
    except (docker.errors.DockerException, requests.RequestException) as error:
        return one_line(error)
    finally:
        probe.close()  # its connections: the next ping opens a new one
    return None


def fixed_environment(api: Any) -> Any:
    """The docker client `api` (an APIClient: a requests session) reads the runner's
    environment once, now, not at every request: requests looks proxies up by going through
    every environment variable at each call, which fails while another thread changes one (pytest
    sets and unsets PYTEST_CURRENT_TEST around each item as trials run on lanes:
    `run/lanes.py`). The proxies of a tcp:// engine are kept; a socket's need none. Without
    the environment, REQUESTS_CA_BUNDLE no longer overrides an engine's own CA either."""
    base = str(api.base_url)
    if base.startswith(("http://", "https://")):
        while True:
            try:
                api.proxies = requests.utils.get_environ_proxies(base)
                break
            except (KeyError, RuntimeError):  # changed mid-read: read again
                continue
    api.trust_env = False
    return api


def probe_client(**options: Any) -> docker.APIClient:
    """A client for pings alone (`options`: base_url, tls...; the environment's engine without),
    made without asking the engine anything."""
    if "base_url" not in options:
        options = {**docker.utils.kwargs_from_env(), **options}
    client = docker.APIClient(version=PROBE_API_VERSION, timeout=PING_TIMEOUT_SECS, **options)
    return fixed_environment(client)


def probe_for(api: Any, address: str) -> docker.APIClient:
    """A client for pings alone to the engine at `address`, which the client `api` (an
    APIClient) talks to, with its TLS settings."""
    tls = None
    if str(api.base_url).startswith("https://"):
        tls = docker.tls.TLSConfig(client_cert=api.cert, verify=api.verify)
    return probe_client(base_url=address, tls=tls)


def one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text[:300] or type(error).__name__
