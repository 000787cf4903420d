"""Red team: a sandbox reaches only what it should, and a task cannot lift its own limits.

An agent that must reach the gateway tries everything else the network offers: another running
sandbox, the runner's other ports (on the sandbox network's host address and on docker0), and the
link-local metadata address. Every probe targets this machine only: 169.254.169.254 must be
refused before it leaves (it is routed nowhere here anyway).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from conftest import TaskMaker
from pytest_hemra.execute.sandbox import AGENT_USER, Limits, SandboxRequest
from pytest_hemra.execute.sandbox.container import DockerSandbox
from pytest_hemra.execute.sandbox.docker import DockerProvider
from pytest_hemra.execute.sandbox.networks import GATEWAY_NETWORK, run_network
from pytest_hemra.resolve.datasets import load_task
from pytest_hemra.resolve.limits import check_limits, task_limits, with_run_defaults
from pytest_hemra.resolve.spec import RunSpec, SandboxSettings
from tests.test_gateway_sandbox import PYTHON_IMAGE
from tests.upstream import running_upstream

METADATA = "169.254.169.254"
DOCKER0 = "172.17.0.1"
PEER_PORT = 8000
QUICK_SECS = 2.0  # a refused connection fails at once; a dropped one would hang to the timeout

# Run in a sandbox as the agent: each probe's result, one JSON line on stdout.
PROBE = """
import json, os, socket, sys, time, urllib.request, urllib.error
def connect(host, port):
    started = time.monotonic()
    try:
        with socket.create_connection((host, int(port)), timeout=4):
            result = "connected"
    except OSError as error:
        result = type(error).__name__
    return {"result": result, "secs": round(time.monotonic() - started, 2)}
def gateway():
    base = os.environ.get("HEMRA_BASE_URL", "")
    if not base:
        return "no gateway"
    body = json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 5,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = urllib.request.Request(base + "/v1/messages", data=body, headers={
        "x-api-key": os.environ["HEMRA_API_KEY"], "content-type": "application/json",
        "anthropic-version": "2023-06-01"})
    try:
        return urllib.request.urlopen(request, timeout=10).status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError as error:
        return type(error).__name__
def read(*paths):
    for path in paths:
        try:
            return open(path).read().strip()
        except OSError:
            pass
    return None
targets = json.loads(sys.argv[1])
print(json.dumps({
    "gateway": gateway(),
    "probes": {name: connect(*target) for name, target in targets.items()},
    "memory": read("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"),
    "cpu": read("/sys/fs/cgroup/cpu.max", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
    "route": read("/proc/net/route"),
}))
"""


@contextmanager
def host_listener() -> Iterator[tuple[int, list[str]]]:
    """A service of the runner's machine on every address (a port other than the gateway's);
    yields its port and the peers it accepted."""
    accepted: list[str] = []
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", 0))
    server.listen(16)
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, peer = server.accept()
            except OSError:
                continue
            accepted.append(peer[0])
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], accepted
    finally:
        stop.set()
        thread.join(2)
        server.close()


def python_image(provider: DockerProvider, make_task: TaskMaker) -> str:
    task = make_task("py-image", dataset="images", dockerfile=PYTHON_IMAGE)
    return provider.prepare(load_task(task), "")


def run_request(image: str, run_id: str, trial: str, network: bool) -> SandboxRequest:
    """A sandbox of run `run_id` (on its network with `network`, else on hemra-gateway)."""
    return SandboxRequest(
        image=image,
        limits=Limits(),
        network=network,
        labels={"hemra.run": run_id, "hemra.trial": f"{run_id}.{trial}"},
    )


def probe(sandbox: DockerSandbox, targets: dict[str, tuple[str, int]], logs: Path) -> Any:
    out, err = logs / "probe.out", logs / "probe.err"
    sandbox.exec(
        ["python3", "-c", PROBE, json.dumps(targets)],
        user=AGENT_USER,
        env={"HOME": "/tmp"},
        timeout=60,
        stdout=out,
        stderr=err,
    )
    return json.loads(out.read_text().strip().splitlines()[-1])


def serve_peer(sandbox: DockerSandbox, logs: Path) -> str:
    """A listener in a running sandbox (as its agent would leave one); returns its address on
    its one network, once it answers inside its own sandbox."""
    sandbox.exec(
        ["bash", "-c", f"nohup python3 -m http.server {PEER_PORT} >/dev/null 2>&1 &"],
        user=AGENT_USER,
        env={"HOME": "/tmp"},
        timeout=30,
        stdout=logs / "peer.out",
        stderr=logs / "peer.err",
    )
    for _ in range(50):
        itself = probe(sandbox, {"self": ("127.0.0.1", PEER_PORT)}, logs)
        if itself["probes"]["self"]["result"] == "connected":
            break
        time.sleep(0.2)
    else:
        raise AssertionError("the peer's listener never answered inside its own sandbox")
    sandbox.container.reload()
    (network,) = sandbox.container.attrs["NetworkSettings"]["Networks"].values()
    return str(network["IPAddress"])


def route_gateways(route_table: str) -> dict[str, str]:
    """Interface -> default gateway (dotted) from /proc/net/route."""
    found = {}
    for line in route_table.splitlines()[1:]:
        fields = line.split()
        if fields[1] == "00000000":
            found[fields[0]] = socket.inet_ntoa(int(fields[2], 16).to_bytes(4, "little"))
    return found


@pytest.mark.usefixtures("docker_test")
@pytest.mark.parametrize("internet", [False, True], ids=["no-internet", "internet"])
def test_a_sandbox_reaches_the_gateway_and_no_peer_host_port_or_metadata(
    internet: bool,
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-redteam-network")
    provider = DockerProvider()
    image = python_image(provider, make_task)
    gateway_host = provider.gateway_host()
    assert gateway_host is not None
    make_task(
        "offline",
        dockerfile=PYTHON_IMAGE,
        task_toml="[agent]\ntimeout_sec = 120\n[environment]\n"
        + f"allow_internet = {str(internet).lower()}\n",
        test="cp /app/probe.json /logs/verifier/probe.json; echo 0 > /logs/verifier/reward.txt",
    )
    with ExitStack() as stack:
        port, accepted = stack.enter_context(host_listener())
        other = stack.enter_context(  # another run's sandbox, running meanwhile
            provider.open(
                SandboxRequest(
                    image=image,
                    limits=Limits(),
                    network=False,
                    labels={"hemra.run": "redteam-peer", "hemra.trial": "redteam-peer.1"},
                )
            )
        )
        peer = serve_peer(other, tmp_path)
        upstream = stack.enter_context(running_upstream())
        targets = {
            "peer sandbox": (peer, PEER_PORT),
            "host on the sandbox network": (gateway_host, port),
            "host on docker0": (DOCKER0, port),
            "metadata": (METADATA, 80),
        }
        shell = f"python3 -c \"$0\" '{json.dumps(targets)}' > /app/probe.json"
        argv = ["bash", "-c", shell, PROBE]
        write_harness(
            "prober", f'kind = "program"\nprovider = "anthropic"\ncommand = {json.dumps(argv)}\n'
        )
        run_file = tmp_path / "run.toml"
        run_file.write_text(
            'harnesses = ["prober"]\ndatasets = ["ds"]\ntasks = ["offline"]\n'
            f'[providers.anthropic]\nbase_url = "{upstream.url}"\n'
        )
        result = pytester.runpytest("--hemra-run", str(run_file))
        assert result.ret in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED), result.outlines
    found = json.loads(next(pytester.path.rglob("verifier/probe.json")).read_text())
    assert found["gateway"] == 200  # the model call went through the gateway
    probes = found["probes"]
    for name in targets:
        assert probes[name]["result"] != "connected", (name, probes)
    assert accepted == []
    assert probes["metadata"]["secs"] < QUICK_SECS, probes  # refused at once, not sent anywhere
    assert probes["host on the sandbox network"]["secs"] < QUICK_SECS, probes
    assert probes["peer sandbox"]["result"] in ("TimeoutError", "timeout", "OSError"), probes
    assert found["memory"] == str(2048 << 20)  # the run's default memory: the task set none
    assert found["cpu"] in ("100000", "100000 100000")  # one cpu (quota per 100 ms period)


@pytest.mark.usefixtures("docker_test")
def test_sandboxes_of_one_run_with_internet_never_reach_each_other_the_host_or_metadata(
    tmp_path: Path, make_task: TaskMaker
) -> None:
    provider = DockerProvider()
    image = python_image(provider, make_task)
    gateway_host = provider.gateway_host()
    assert gateway_host is not None
    run_id = f"redteam-net-{time.time_ns()}"

    with ExitStack() as stack:
        port, accepted = stack.enter_context(host_listener())
        first = stack.enter_context(provider.open(run_request(image, run_id, "1", True)))
        second = stack.enter_context(provider.open(run_request(image, run_id, "2", True)))
        peer = serve_peer(first, tmp_path)
        second.container.reload()
        networks = second.container.attrs["NetworkSettings"]["Networks"]
        assert list(networks) == [run_network(run_id)]  # the way out, and the gateway's way
        run_host = networks[run_network(run_id)]["Gateway"]
        gateway_network = provider.client.networks.get(GATEWAY_NETWORK)
        assert gateway_network.attrs["Internal"] and not gateway_network.attrs["Containers"].get(
            second.container.id
        )
        targets = {
            "peer on the run's network": (peer, PEER_PORT),
            "host on the run's network": (run_host, port),
            "host on hemra-gateway": (gateway_host, port),
            "host on docker0": (DOCKER0, port),
            "metadata": (METADATA, 80),
        }
        found = probe(second, targets, tmp_path)
    for name in targets:
        assert found["probes"][name]["result"] != "connected", (name, found)
    assert accepted == []
    assert found["probes"]["metadata"]["secs"] < QUICK_SECS, found
    # the way out is the run's network (the internet), never hemra-gateway (internal)
    assert list(route_gateways(found["route"]).values()) == [run_host]
    provider.release(run_id, None)
    assert run_network(run_id) not in {n.name for n in provider.client.networks.list()}


@pytest.mark.usefixtures("docker_test")
def test_a_sandbox_without_internet_is_refused_anywhere_off_its_network_at_once(
    tmp_path: Path, make_task: TaskMaker
) -> None:
    """From `hemra-gateway`, a connection to an address off it (here a listener in another
    run's sandbox, on that run's network) fails at once as an unreachable network, as with no
    network at all: Docker's `internal` alone drops it, and the agent's connection would hang
    until its timeout (the probe's 4 s)."""
    provider = DockerProvider()
    image = python_image(provider, make_task)
    run_id = f"redteam-off-{time.time_ns()}"

    with ExitStack() as stack:
        online = stack.enter_context(provider.open(run_request(image, run_id, "online", True)))
        offline = stack.enter_context(provider.open(run_request(image, run_id, "offline", False)))
        peer = serve_peer(online, tmp_path)
        found = probe(offline, {"peer off its network": (peer, PEER_PORT)}, tmp_path)
    provider.release(run_id, None)
    reached = found["probes"]["peer off its network"]
    assert reached["result"] == "OSError", found  # ENETUNREACH, not a timeout
    assert reached["secs"] < QUICK_SECS, found


@pytest.mark.parametrize(
    ("task_toml", "run_extra", "expected"),
    [
        ("[environment]\ncpus = 1e-12\n", "", "key 'environment.cpus': 1e-12 is below 0.01"),
        ("[agent]\ntimeout_sec = inf\n", "", "key 'agent.timeout_sec': expected a finite"),
        ("[verifier]\ntimeout_sec = inf\n", "", "key 'verifier.timeout_sec': expected a finite"),
        ("[environment]\nmemory_mb = 1000000\n", "", "key 'environment.memory_mb': 1000000 is "),
        ("[environment]\ncpus = 4\n", "[sandbox]\nmax_cpus = 2\n", "ceiling 2 (its [sandbox] max"),
        ("[environment]\npids_limit = 100000\n", "", "key 'environment.pids_limit': 100000"),
        ("[[steps]]\nname = 'a'\n[steps.agent]\ntimeout_sec = inf\n", "", "'steps[0].agent."),
        ("", "timeout_secs = inf\n", "key 'timeout_secs': input should be a finite number"),
        ("", "timeout_secs = 1e9\n", "key 'timeout_secs': 1e+09 is over the run's ceiling"),
        ("", "[sandbox]\ncpus = 0\n", "key 'sandbox.cpus': input should be greater than"),
    ],
    ids=[
        "tiny-cpus",
        "inf-agent-timeout",
        "inf-verifier-timeout",
        "memory-over-ceiling",
        "cpus-over-run-ceiling",
        "pids-over-ceiling",
        "inf-step-timeout",
        "inf-run-timeout",
        "run-timeout-over-ceiling",
        "zero-default-cpus",
    ],
)
def test_a_limit_outside_the_runs_ceilings_is_refused_by_name_and_nothing_recorded(
    task_toml: str,
    run_extra: str,
    expected: str,
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[..., Path],
) -> None:
    task = make_task("greedy", task_toml=task_toml)
    if "[[steps]]" in task_toml:
        (task / "steps" / "a").mkdir(parents=True)
        (task / "steps" / "a" / "instruction.md").write_text("Do a.")
    write_harness("nop", 'kind = "program"\ncommand = ["true"]\n')
    run_file = tmp_path / "run.toml"
    run_file.write_text(f'harnesses = ["nop"]\ndatasets = ["ds"]\n{run_extra}')
    result = pytester.runpytest("--hemra-run", str(run_file))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if line.startswith("ERROR:")]
    assert len(errors) == 1 and expected in errors[0], result.errlines
    if task_toml:
        assert str(task / "task.toml") in errors[0]
    assert not (pytester.path / ".hemra").exists()


def test_a_task_without_limits_gets_the_runs_defaults(make_task: TaskMaker) -> None:
    task = load_task(make_task("plain"))
    limits = task_limits(SandboxSettings(cpus=0.5, memory_mb=512), task)
    assert (limits.cpus, limits.memory_mb, limits.pids) == (0.5, 512, 1024)
    own = load_task(make_task("own", task_toml="[environment]\ncpus = 2\nmemory_mb = 4096\n"))
    assert task_limits(SandboxSettings(), own).cpus == 2
    assert task_limits(SandboxSettings(), own).memory_mb == 4096
    bare = load_task(make_task("bare", task_toml=""))  # sets no limit, no timeout
    settings = SandboxSettings(verifier_timeout_sec=30, max_verifier_timeout_sec=60, pids=256)
    check_limits(RunSpec(harnesses=["a"], datasets=["d"], sandbox=settings), [bare], "run.toml")
    assert task_limits(settings, bare).pids == 256
    ran = with_run_defaults(settings, bare).config
    assert ran.verifier.timeout_sec == 30
    timed = load_task(make_task("timed", task_toml="[verifier]\ntimeout_sec = 45\n"))
    assert with_run_defaults(settings, timed).config.verifier.timeout_sec == 45  # its own
    documented = SandboxSettings()  # as docs/run-files.md and docs/sandbox.md give them
    assert (documented.cpus, documented.memory_mb, documented.agent_timeout_sec) == (1, 2048, 900)
    assert (documented.verifier_timeout_sec, documented.pids) == (120, 1024)
    assert (documented.max_cpus, documented.max_memory_mb, documented.max_pids) == (8, 16384, 4096)
    assert documented.max_agent_timeout_sec == documented.max_verifier_timeout_sec == 21600
    assert documented.disk_mb is None
