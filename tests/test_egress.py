"""Harbor's host allowlist (`network_mode = "allowlist"`, `allowed_hosts`): the agent reaches
exactly its hosts, through HEMRA's egress proxy, and nothing else.

Every destination is on this machine: a test server on loopback (and every host address), the
`hemra-gateway` host address, and 169.254.169.254, which the proxy refuses before connecting.
"""

from __future__ import annotations

import base64
import http.client
import ipaddress
import json
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import TaskMaker
from pytest_hemra.core.errors import HemraError
from pytest_hemra.execute.gateway.server import Gateway
from pytest_hemra.execute.sandbox.docker import DockerProvider
from pytest_hemra.resolve.allowlist import HostAllowlist, normalize_host, normalize_hosts
from pytest_hemra.resolve.datasets import load_task
from tests.test_gateway_sandbox import PYTHON_IMAGE


@contextmanager
def host_server(bind: str = "0.0.0.0") -> Iterator[tuple[int, list[str]]]:
    """An HTTP server of the runner's machine: answers `ok <path>`; yields its port and the
    paths it served."""
    served: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            served.append(self.path)
            body = f"ok {self.path}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((bind, 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], served
    finally:
        server.shutdown()
        server.server_close()


def fetch(url: str, proxy: str | None) -> int | str:
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({"http": proxy} if proxy else {})
    )
    try:
        with opener.open(url, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code
    except OSError as error:
        return type(error).__name__


def tunnel(proxy: str, host: str, port: int, credential: str) -> int:
    """GET / through a CONNECT tunnel (what an HTTPS client does)."""
    split = urllib.parse.urlsplit(proxy)
    connection = http.client.HTTPConnection(split.hostname or "", split.port, timeout=10)
    auth = base64.b64encode(f"hemra:{credential}".encode()).decode()
    connection.set_tunnel(host, port, headers={"Proxy-Authorization": f"Basic {auth}"})
    try:
        connection.request("GET", "/tunnel")
        return connection.getresponse().status
    except OSError as error:
        found = re.search(r"Tunnel connection failed: (\d+)", str(error))
        return int(found.group(1)) if found else -1
    finally:
        connection.close()


# -- the allowlist, as resolve reads it and the proxy checks it ---------------------------


def test_allowed_hosts_are_normalized_as_harbor_does() -> None:
    assert normalize_hosts(["PyPI.org.", "*.GitHub.com", "10.1.2.3/8", "::1", "pypi.org"]) == [
        "pypi.org",
        "*.github.com",
        "10.0.0.0/8",
        "::1",
    ]


@pytest.mark.parametrize(
    "entry", ["https://pypi.org", "pypi.org:443", "pypi.org/simple", "*", "*.com", "a b", ""]
)
def test_a_malformed_allowed_hosts_entry_is_refused(entry: str) -> None:
    with pytest.raises(ValueError):
        normalize_host(entry)


def test_a_malformed_allowed_hosts_entry_refuses_the_task_naming_the_key(
    make_task: TaskMaker,
) -> None:
    task = make_task(task_toml='[environment]\nallowed_hosts = ["https://pypi.org/simple"]\n')
    with pytest.raises(HemraError, match=r"task\.toml.*environment\.allowed_hosts"):
        load_task(task)
    bare = make_task("bare", task_toml='[agent]\nnetwork_mode = "allowlist"\n')
    with pytest.raises(HemraError, match="needs allowed_hosts"):
        load_task(bare)


def test_allowed_hosts_alone_means_an_allowlist_with_no_route_out(make_task: TaskMaker) -> None:
    task = load_task(make_task(task_toml='[environment]\nallowed_hosts = ["PyPI.org"]\n'))
    assert task.config.environment.network_mode == "allowlist"
    assert not task.config.environment.has_internet
    assert task.config.agent_hosts == ("pypi.org",)


def test_metadata_loopback_and_runner_addresses_are_refused_unless_listed_literally() -> None:
    metadata = ipaddress.ip_address("169.254.169.254")
    wildcard = HostAllowlist(("*.example.com", "169.254.0.0/16"))
    assert wildcard.names("meta.example.com")
    assert wildcard.refusal(metadata) is not None  # even named, even listed
    assert wildcard.refusal(ipaddress.ip_address("::ffff:169.254.169.254")) is not None
    by_name = HostAllowlist(("localhost",))
    assert by_name.refusal(ipaddress.ip_address("127.0.0.1")) is not None
    assert HostAllowlist(("127.0.0.1",)).refusal(ipaddress.ip_address("127.0.0.1")) is None
    assert HostAllowlist(("127.0.0.0/8",)).refusal(ipaddress.ip_address("127.0.0.2")) is None
    assert not HostAllowlist(("example.com",)).names("sub.example.com")
    assert not HostAllowlist(("*.example.com",)).names("example.com")
    assert not HostAllowlist(("*.example.com",)).names("evilexample.com")


# -- the proxy, on the gateway's loop ------------------------------------------------------


def test_the_proxy_lets_a_trial_reach_its_hosts_only_and_needs_its_live_credential() -> None:
    with host_server("127.0.0.1") as (port, served), Gateway({}, lambda row: None) as gateway:
        grant = gateway.egress.open("run.1", ("127.0.0.1",))
        named = gateway.egress.open("run.2", ("localhost",))
        proxy = gateway.egress.proxy_url(grant, "127.0.0.1")
        assert fetch(f"http://127.0.0.1:{port}/plain", proxy) == 200
        assert tunnel(proxy, "127.0.0.1", port, grant.credential) == 200
        assert fetch(f"http://localhost:{port}/name", proxy) == 403  # not listed
        assert fetch(f"http://169.254.169.254:{port}/", proxy) == 403
        # a listed name resolving to loopback: refused, only the literal address reaches it
        assert (
            fetch(f"http://localhost:{port}/", gateway.egress.proxy_url(named, "127.0.0.1")) == 403
        )
        bare = gateway.egress.urls["127.0.0.1"]
        assert fetch(f"http://127.0.0.1:{port}/", bare) == 407
        assert fetch(f"http://127.0.0.1:{port}/", proxy.replace(grant.credential, "x")) == 407
        assert tunnel(proxy, "127.0.0.1", port, "hemra-egress-wrong") == 407
        gateway.egress.close(grant)
        assert fetch(f"http://127.0.0.1:{port}/", proxy) == 407  # ended with its phase
        assert served == ["/plain", "/tunnel"]
        summary = grant.summary()
        assert summary["allowed"] == {"127.0.0.1": 2}
        assert set(summary["refused"]) == {"localhost", "169.254.169.254"}  # type: ignore[arg-type]
        assert grant.credential not in json.dumps(summary)
        assert "loopback" in json.dumps(named.summary())


# -- a real trial in a real sandbox ---------------------------------------------------------

PROBE = r"""
import base64, http.client, json, os, sys, urllib.parse, urllib.request, urllib.error
port, gateway_host = int(sys.argv[1]), sys.argv[2]
proxy = os.environ.get("http_proxy", "")
no_proxy = os.environ.pop("no_proxy", None), os.environ.pop("NO_PROXY", None)
def get(host, path, proxy=proxy):
    handler = urllib.request.ProxyHandler({"http": proxy} if proxy else {})
    url = "http://%s:%d%s" % (host, port, path)
    try:
        with urllib.request.build_opener(handler).open(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError as error:
        return type(error).__name__
split = urllib.parse.urlsplit(proxy)
def tunnel(credential):
    connection = http.client.HTTPConnection(split.hostname, split.port, timeout=5)
    auth = base64.b64encode(("hemra:" + credential).encode()).decode()
    connection.set_tunnel("127.0.0.1", port, headers={"Proxy-Authorization": "Basic " + auth})
    try:
        connection.request("GET", "/tunnel")
        return connection.getresponse().status
    except OSError as error:
        return str(error)
bare = "http://%s:%d" % (split.hostname, split.port)
print(json.dumps({
    "proxy_set": bool(proxy) and os.environ.get("HTTPS_PROXY") == proxy,
    "no_proxy": list(no_proxy),
    "allowed": get("127.0.0.1", "/allowed"),
    "tunnel": tunnel(split.password),
    "gateway host": get(gateway_host, "/gateway-host"),
    "localhost": get("localhost", "/localhost"),
    "metadata": get("169.254.169.254", "/latest/meta-data/"),
    "direct": get(gateway_host, "/direct", proxy=""),
    "no credential": get("127.0.0.1", "/none", bare),
    "wrong credential": get("127.0.0.1", "/wrong", proxy.replace(split.password, "x")),
}))
"""


@pytest.mark.usefixtures("docker_test")
def test_an_allowlist_task_reaches_its_hosts_through_the_proxy_and_nothing_else(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[..., Path],
) -> None:
    gateway_host = DockerProvider().gateway_host()
    assert gateway_host is not None
    make_task(
        "allowlisted",
        dockerfile=PYTHON_IMAGE,
        task_toml='[agent]\ntimeout_sec = 120\n[environment]\nallowed_hosts = ["127.0.0.1"]\n',
        test="cp /app/probe.json /logs/verifier/probe.json; echo 1 > /logs/verifier/reward.txt",
    )
    with host_server() as (port, served):
        shell = f'python3 -c "$0" {port} {gateway_host} > /app/probe.json'
        write_harness(
            "prober", f'kind = "program"\ncommand = {json.dumps(["bash", "-c", shell, PROBE])}\n'
        )
        run_file = tmp_path / "run.toml"
        run_file.write_text('harnesses = ["prober"]\ndatasets = ["ds"]\nmodel = "hemra/scripted"\n')
        result = pytester.runpytest("--hemra-run", str(run_file))
        result.assert_outcomes(passed=1)
    probes = json.loads(next(pytester.path.rglob("verifier/probe.json")).read_text())
    assert probes["proxy_set"], probes
    assert probes["no_proxy"] == [gateway_host, gateway_host]  # the model calls go direct
    assert probes["allowed"] == 200 and probes["tunnel"] == 200, probes
    assert probes["gateway host"] == 403 and probes["localhost"] == 403, probes
    assert probes["metadata"] == 403, probes
    assert probes["direct"] not in (200, 403, 407), probes  # no route but the proxy
    assert probes["no credential"] == 407 and probes["wrong credential"] == 407, probes
    assert sorted(served) == ["/allowed", "/tunnel"]
    egress = json.loads(next(pytester.path.rglob("agent/egress.json")).read_text())
    assert egress["allowed_hosts"] == ["127.0.0.1"]
    assert egress["allowed"] == {"127.0.0.1": 2}
    assert set(egress["refused"]) == {gateway_host, "localhost", "169.254.169.254"}
    assert all(entry["count"] == 1 for entry in egress["refused"].values())
    text = "".join(
        p.read_text(errors="replace")
        for p in pytester.path.rglob("*")
        if p.is_file() and p.suffix in (".json", ".txt", ".patch")
    )
    assert "hemra-egress-" not in text  # the credential is in no trial file


@pytest.mark.usefixtures("docker_test")
@pytest.mark.parametrize("agent_internet", ["true", "false"])
def test_a_verifiers_own_allowlist_reaches_its_hosts_through_the_proxy_and_nothing_else(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    monkeypatch: pytest.MonkeyPatch,
    agent_internet: str,
) -> None:
    """`[verifier] allowed_hosts`: whether the agent had the internet (the sandbox leaves its
    run's network for `hemra-gateway`) or not, the verifier reaches its host through the proxy
    under a pass of its own, and nothing else."""
    gateway_host = DockerProvider().gateway_host()
    assert gateway_host is not None
    task = make_task(
        "verifier-allowlist",
        dockerfile=PYTHON_IMAGE,
        task_toml=f"[environment]\nallow_internet = {agent_internet}\n"
        '[verifier]\ntimeout_sec = 60\nallowed_hosts = ["127.0.0.1"]\n'
        '[verifier.env]\nPROBE_PORT = "${HEMRA_PROBE_PORT}"\n'
        'PROBE_GATEWAY = "${HEMRA_PROBE_GATEWAY}"\n',
        test='python3 /tests/probe.py "$PROBE_PORT" "$PROBE_GATEWAY" > /logs/verifier/probe.json'
        "; echo 1 > /logs/verifier/reward.txt",
    )
    (task / "tests" / "probe.py").write_text(PROBE)
    with host_server() as (port, served):
        monkeypatch.setenv("HEMRA_PROBE_PORT", str(port))
        monkeypatch.setenv("HEMRA_PROBE_GATEWAY", gateway_host)
        run_file = tmp_path / "run.toml"
        run_file.write_text(
            'harnesses = ["oracle"]\ndatasets = ["ds"]\n'
            '[sandbox]\npass_env = ["HEMRA_PROBE_PORT", "HEMRA_PROBE_GATEWAY"]\n'
        )
        pytester.runpytest("--hemra-run", str(run_file)).assert_outcomes(passed=1)
    probes = json.loads(next(pytester.path.rglob("verifier/probe.json")).read_text())
    assert probes["proxy_set"], probes
    assert probes["allowed"] == 200 and probes["tunnel"] == 200, probes
    assert probes["gateway host"] == 403 and probes["localhost"] == 403, probes
    assert probes["direct"] not in (200, 403, 407), probes  # no route but the proxy
    assert probes["no credential"] == 407 and probes["wrong credential"] == 407, probes
    assert sorted(served) == ["/allowed", "/tunnel"]
    egress = json.loads(next(pytester.path.rglob("verifier/egress.json")).read_text())
    assert egress["allowed_hosts"] == ["127.0.0.1"] and egress["allowed"] == {"127.0.0.1": 2}
    assert not list(pytester.path.rglob("agent/egress.json"))  # the agent had no pass: no network
