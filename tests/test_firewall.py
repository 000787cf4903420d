"""The host firewall's admissions belong to the process that made them.

Two runners given the same gateway port by the kernel one after another (the first stopped, the
second started) must not take each other's way in: the first taking its port back while the
second's sandboxes call through it cut the second run off mid-way ("connection refused", every
call of a worker a `harness_error`). Every probe targets this machine only.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import TaskMaker
from pytest_hemra.execute.sandbox import Limits, SandboxRequest, firewall
from pytest_hemra.execute.sandbox.docker import DockerProvider
from pytest_hemra.execute.sandbox.networks import GATEWAY_NETWORK
from tests.test_redteam_network import host_listener, probe, python_image

pytestmark = pytest.mark.usefixtures("docker_test")
LABELS = {"hemra.run": "firewall-owners", "hemra.trial": "firewall-owners.1"}  # on hemra-gateway


@pytest.fixture
def other_runner() -> Iterator[str]:
    """The owner token of another live process (a runner beside this one)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        yield f"{child.pid}.{_start_of(child.pid)}"
    finally:
        child.kill()
        child.wait(timeout=30)


def _start_of(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]


def _bridge(provider: DockerProvider) -> str:
    network = provider.client.networks.get(GATEWAY_NETWORK)
    return f"br-{network.id[:12]}"


def test_a_runner_taking_its_port_back_leaves_the_next_holder_of_that_port_admitted(
    make_task: TaskMaker, tmp_path: Path, other_runner: str
) -> None:
    provider = DockerProvider()
    image = python_image(provider, make_task)
    host = provider.gateway_host()
    assert host is not None
    bridge = _bridge(provider)
    with (
        host_listener() as (port, accepted),
        provider.open(
            SandboxRequest(image=image, limits=Limits(), network=False, labels=LABELS)
        ) as sandbox,
    ):
        target = {"gateway": (host, port)}
        assert probe(sandbox, target, tmp_path)["probes"]["gateway"]["result"] != "connected"
        firewall.admit(bridge, host, port, owner=other_runner)  # the port's earlier holder
        firewall.admit(bridge, host, port)  # this process, given the same port since
        assert {rule.owner for rule in firewall.admitted(bridge) if rule.port == port} == {
            other_runner,
            firewall.this_process(),
        }
        firewall.revoke(bridge, host, port, owner=other_runner)  # the earlier holder is done
        assert probe(sandbox, target, tmp_path)["probes"]["gateway"]["result"] == "connected"
        firewall.revoke(bridge, host, port)
        assert probe(sandbox, target, tmp_path)["probes"]["gateway"]["result"] != "connected"
        assert len(accepted) == 1
    assert all(rule.port != port for rule in firewall.admitted(bridge))


def test_only_admissions_of_runners_gone_whose_port_is_closed_are_reaped(
    other_runner: str,
) -> None:
    provider = DockerProvider()
    host = provider.gateway_host()
    assert host is not None
    bridge = _bridge(provider)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead = f"{gone.stdout.strip()}.1"  # a pid that has exited (or is another process now)
    closed, open_port = 9, 10  # no listener on 9; 10 is said to be listening below
    for owner, port in [(dead, closed), (other_runner, closed), (dead, open_port)]:
        firewall.admit(bridge, host, port, owner=owner)
    try:
        firewall.reap_admitted(bridge, lambda _host, port: port == open_port)
        left = {(rule.owner, rule.port) for rule in firewall.admitted(bridge)}
        assert (dead, closed) not in left
        assert {(other_runner, closed), (dead, open_port)} <= left
    finally:
        for owner, port in [(dead, closed), (other_runner, closed), (dead, open_port)]:
            firewall.revoke(bridge, host, port, owner=owner)


def test_a_run_network_another_runner_removed_and_made_again_still_lets_this_gateway_in(
    make_task: TaskMaker, tmp_path: Path
) -> None:
    """Runner A caches its run's network; another process reaps it while empty (between
    trials) and runner B makes it again under the same name, letting only B's port in. A's
    next sandbox must land on a network A let its own port into, not on B's by name."""
    image = python_image(DockerProvider(), make_task)
    a, b = DockerProvider(), DockerProvider()  # two runners of one run (two xdist workers)
    host = a.gateway_host()
    assert host is not None
    run_id = f"fw-{uuid.uuid4().hex[:8]}"
    labels = {"hemra.run": run_id, "hemra.trial": f"{run_id}.00000"}
    with host_listener() as (port_a, _), host_listener() as (port_b, _):
        request_a = SandboxRequest(
            image=image, limits=Limits(), network=True, labels=labels, gateway_port=port_a
        )
        request_b = replace(request_a, gateway_port=port_b)
        try:
            with a.open(request_a):
                pass  # A's run network made and cached; its sandbox gone (between trials)
            assert DockerProvider().gateway_host() is not None  # another runner reaps it
            # B makes it again, only B's port let in; then A's next sandbox
            with b.open(request_b), a.open(request_a) as sandbox:
                target = {"gateway": (host, port_a)}
                found = probe(sandbox, target, tmp_path)["probes"]["gateway"]
                assert found["result"] == "connected", found
        finally:
            a.release(run_id, [port_a])
            b.release(run_id, [port_b])
