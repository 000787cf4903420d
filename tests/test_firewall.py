"""The host firewall's admissions belong to the process that made them.

Two runners given the same gateway port by the kernel one after another (the first stopped, the
second started) must not take each other's way in: the first taking its port back while the
second's sandboxes call through it cut the second run off mid-way ("connection refused", every
call of a worker a `harness_error`). Every probe targets this machine only.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
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
