"""A container removed with force, on every path: one already gone, or going, is fine; a slow
removal while its engine answers is waited for, never taken for the engine's outage."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import docker.errors
import requests

from pytest_hemra.core.backoff import removal_secs
from pytest_hemra.core.errors import InfraError

REMOVE_ATTEMPTS = 5  # a removal racing another of the same container, tried again
REMOVE_PAUSE_SECS = 0.2
REMOVE_POLL_SECS = 0.5  # a slow removal under way, asked about again


def remove_container(container: Any, answers: Callable[[], bool] | None = None) -> None:
    """Remove with force, with its anonymous volumes (an image's VOLUME); one already gone (or
    going: `hemra cancel` removed it) is fine. Two removals of one container at once (a cancel
    and the trial's own teardown) can make the daemon fail one with a 500 ("failed to remove
    root filesystem ... directory not empty"): that one is tried again, and ends once the
    container is gone.

    A removal whose answer does not come within HEMRA_REMOVE_TIMEOUT_SECS while the engine
    `answers` pings is slow for what is in the container (an agent that left 100k files): it
    is waited for, up to HEMRA_REMOVE_PATIENCE_SECS, and never raised as the engine's outage
    (an agent would buy itself free reruns); past that, an InfraError (a retry used). Without
    `answers`, or when the engine does not answer, the timeout is raised (an outage)."""
    timeout, patience = removal_secs()
    for attempt in range(REMOVE_ATTEMPTS):
        try:
            _remove_once(container, timeout)
            return
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as error:
            if error.status_code == 409:  # its removal is already in progress
                return
            if error.status_code != 500 or attempt == REMOVE_ATTEMPTS - 1:
                raise
            time.sleep(REMOVE_PAUSE_SECS)
        except requests.Timeout:
            if answers is None or not answers():
                raise
            break
    _finish_removal(container, patience)


def _remove_once(container: Any, timeout: float) -> None:
    """One request to remove `container` with force, its answer awaited `timeout` seconds."""
    api = container.client.api
    url = api._url("/containers/{0}", container.id)
    response = api._delete(url, params={"v": True, "force": True}, timeout=timeout)
    api._raise_for_status(response)


def _finish_removal(container: Any, patience: float) -> None:
    """Wait up to `patience` for a slow removal of `container` (the engine goes on with it after
    its client gave up: asked again, it says it is under way) to end with the container gone."""
    deadline = time.monotonic() + patience
    while (left := deadline - time.monotonic()) > 0:
        try:
            _remove_once(container, left)
            return
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as error:
            if error.status_code not in (409, 500):  # 409: under way
                raise
        except requests.Timeout:
            continue
        time.sleep(min(REMOVE_POLL_SECS, max(deadline - time.monotonic(), 0)))
    name = container.name or container.short_id  # a container read from a list: no name
    raise InfraError(
        f"docker: sandbox {name} still being removed after {patience:g} s while its"
        " engine answers (HEMRA_REMOVE_PATIENCE_SECS): slowed by what the trial left in it"
    )
