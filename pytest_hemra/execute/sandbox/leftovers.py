"""What HEMRA left on an engine that went away: containers (the sandboxes and services of trials
whose teardown could not reach the engine) and their trials' services networks, found by label
and removed once the engine answers again, for trials that are over.

Only trials the caller says are over are touched (`is_over`, by trial id: its store knows the
trial and nobody runs it any more), so sandboxes of live trials, of other stores and of other
tools on the same engine are left alone. Anything removed meanwhile by someone else (a trial's
own teardown, `hemra cancel`) is not an error.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import docker.errors

from pytest_hemra.execute.sandbox.networks import SERVICES_LABEL, Networks
from pytest_hemra.execute.sandbox.removal import remove_container

TRIAL_LABEL = "hemra.trial"


def remove(networks: Networks, is_over: Callable[[str], bool]) -> int:
    """Remove the containers labelled `hemra=1` of trials that are over, then those trials'
    services networks; return how many containers there were."""
    found = over_trials(networks, is_over, dry_run=False)
    return sum(1 for kind, _, _ in found if kind == "container")


def over_trials(
    networks: Networks, is_over: Callable[[str], bool], *, dry_run: bool
) -> list[tuple[str, str, str]]:
    """What trials that are over left: (kind, name, trial) for each container labelled
    `hemra=1` and each services network, removed unless `dry_run`."""
    client = networks.client
    # the list's own answer (labels, names), not a read of each container: one request
    found = client.containers.list(all=True, filters={"label": "hemra=1"}, sparse=True)
    over: dict[str, bool] = {}
    left: list[tuple[str, str, str]] = []
    for container in found:
        trial = (container.attrs.get("Labels") or {}).get(TRIAL_LABEL)
        if trial and over.setdefault(trial, is_over(trial)):
            name = str((container.attrs.get("Names") or [container.id])[0]).lstrip("/")
            left.append(("container", name, trial))
            if not dry_run:
                remove_container(container)
    for network in client.networks.list(filters={"label": [TRIAL_LABEL, SERVICES_LABEL]}):
        trial = (network.attrs.get("Labels") or {}).get(TRIAL_LABEL)
        if trial and over.setdefault(trial, is_over(trial)):
            left.append(("network", network.name, trial))
            if not dry_run:
                with contextlib.suppress(docker.errors.NotFound):
                    networks.remove_services_networks([f"{TRIAL_LABEL}={trial}"])
    return left
