"""`hemra clean`: every HEMRA object on an engine that no live trial owns, found and (unless
only listed) removed.

What is found, each named with why it may go:
- containers labelled `hemra=1` of trials that are over (`is_over`, by trial id: the store
  knows the trial and nobody runs it any more); containers of trials the store does not know
  are another store's, and left alone;
- a trial's services networks, once its trial is over;
- run networks (`hemra-<run id>`) no container of their run sits on: an endpoint whose
  container is gone (Docker sometimes keeps one under load, and then refuses to remove the
  network) is disconnected with force first;
- firewall chains of bridges that are gone, and gateway admissions whose runner is gone and
  whose port nothing listens on.

Task images are a cache, not leftovers: they stay.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from pytest_hemra.execute.sandbox import firewall
from pytest_hemra.execute.sandbox.leftovers import over_trials
from pytest_hemra.execute.sandbox.networks import (
    GATEWAY_NETWORK,
    RUN_LABEL,
    Networks,
    bridge_of,
    listening,
    why_stuck,
)


@dataclass(frozen=True)
class Leftover:
    """One object `clean` found: what it is, its name, and why it may go."""

    kind: str  # "container", "network", "firewall chain", "firewall rule"
    name: str
    why: str
    stuck: str | None = None  # not removed: why, and what to do


def clean(networks: Networks, is_over: Callable[[str], bool], *, dry_run: bool) -> list[Leftover]:
    """Every leftover on the engine; removed unless `dry_run`."""
    client = networks.client
    found = [
        Leftover(kind, name, f"trial {trial} is over" if kind == "container"
                 else f"services of trial {trial}, over")
        for kind, name, trial in over_trials(networks, is_over, dry_run=dry_run)
    ]  # fmt: skip
    for network in client.networks.list(filters={"label": RUN_LABEL}):
        run_id = (network.attrs.get("Labels") or {}).get(RUN_LABEL)
        if run_id and not networks.run_has_containers(run_id):
            why = f"no sandbox of run {run_id} is on it"
            if not dry_run:
                networks.drop_stale_endpoints(network)
                networks.remove_run_network(run_id)
                left = networks.find(network.name)
                if left is not None:
                    found.append(Leftover("network", network.name, why, why_stuck(left)))
                    continue
            found.append(Leftover("network", network.name, why))
    found += _firewall(networks, dry_run)
    return found


def _firewall(networks: Networks, dry_run: bool) -> list[Leftover]:
    if not networks.own:
        return []  # a pool's engine: HEMRA keeps no firewall there
    found = [
        Leftover("firewall chain", firewall.chain_of(bridge), f"bridge {bridge} is gone")
        for bridge in firewall.stale_bridges()
    ]
    if not dry_run:
        firewall.reap()
        stuck = firewall.stuck_chains()
        found = [replace(leftover, stuck=stuck.get(leftover.name)) for leftover in found]
    gateway = networks.find(GATEWAY_NETWORK)
    if gateway is not None:
        bridge = bridge_of(gateway)
        for rule in firewall.stale_admissions(bridge, listening):
            owner = f"runner {rule.owner}" if rule.owner else "a runner"
            why = f"{owner} is gone and nothing listens on the port"
            found.append(Leftover("firewall rule", f"{rule.host}:{rule.port}", why))
            if not dry_run:
                firewall.remove_admission(bridge, rule)
    return found
