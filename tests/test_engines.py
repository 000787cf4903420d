"""A run spread over a pool of Docker engines, for real: the machine's engine and two more
dockerd processes started here (tests/dockerd.py), each reached at its own loopback address and
starting with no image; one of them killed by PID in the middle of a run."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import ssl
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import docker.tls
import pytest

from conftest import REPO, TaskMaker, wait_for
from pytest_hemra.cli import main as hemra
from pytest_hemra.core.errors import SpecError
from pytest_hemra.core.records import EngineSlot, PlannedTrial
from pytest_hemra.execute.sandbox.docker import DockerProvider
from pytest_hemra.execute.sandbox.pool import EnginePool
from pytest_hemra.resolve.overrides import Overrides
from pytest_hemra.resolve.spec import load_run_spec
from pytest_hemra.store import Store
from tests.dockerd import (
    ExtraEngine,
    UnixForwarder,
    free_loopback_hosts,
    running_engines,
)

MAIN = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
OFFLINE_TASK = "[agent]\ntimeout_sec = 60\n[verifier]\ntimeout_sec = 30\n" + (
    "[environment]\nallow_internet = false\n"  # the extra engines have no bridge network
)


@pytest.fixture(scope="module")
def extra_engines(docker_client: Any) -> Iterator[list[ExtraEngine]]:
    """Two more engines on this machine, removed (processes, mounts, folders) on every path."""
    with running_engines(2, "more engines") as found:
        yield found


@pytest.fixture
def pool_run(
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[[str, str], Path],
    extra_engines: list[ExtraEngine],
) -> Callable[..., Path]:
    """A run file: `tasks` offline tasks x `attempts` of a harness that sleeps, over the pool
    main (this machine's engine), b and c (the extra ones), one slot each."""

    def write(tasks: int, attempts: int, sleep: float, name: str = "run.toml") -> Path:
        for n in range(tasks):
            if not (tmp_path / "datasets" / "ds" / f"task-{n}").exists():
                make_task(f"task-{n}", task_toml=OFFLINE_TASK)
        write_harness(
            "sleeper",
            f"""\
            kind = "program"
            command = ["bash", "-c", "sleep {sleep}; echo hi > /app/out.txt"]
            """,
        )
        b, c = extra_engines
        run_file = tmp_path / name
        run_file.write_text(
            textwrap.dedent(
                f"""\
                harnesses = ["sleeper"]
                datasets = ["ds"]
                attempts = {attempts}
                max_infra_retries = 2

                [[sandbox.engines]]
                name = "main"
                address = "{MAIN}"
                capacity = 1

                [[sandbox.engines]]
                name = "b"
                address = "{b.address}"
                capacity = 1

                [[sandbox.engines]]
                name = "c"
                address = "{c.address}"
                capacity = 1
                """
            )
        )
        return run_file

    return write


def containers(address: str, run_id: str) -> list[Any]:
    """The run's containers on the engine; one removed while they are listed (a trial that
    ends as the test polls) is not among them."""
    client = docker.DockerClient(base_url=address, timeout=30)
    try:
        found = client.containers.list(
            all=True, filters={"label": f"hemra.run={run_id}"}, ignore_removed=True
        )
        return list(found)
    finally:
        client.close()


@pytest.mark.parametrize(
    ("engine", "expected"),
    [
        (
            'address = "http://box:2375"\ncapacity = 2',
            "key 'sandbox.engines[0].address': expected unix:///path/docker.sock,"
            " tcp://host:port or ssh://[user@]host[:port], got 'http://box:2375'",
        ),
        (
            'address = "tcp://box:2375"\ncapacity = 0',
            "key 'sandbox.engines[0].capacity': input should be greater than 0, got 0",
        ),
        ('address = "tcp://box:2375"', "key 'sandbox.engines[0].capacity' is required"),
        (
            'address = "unix:///run/docker.sock"\ncapacity = 1\ntls = { ca = "ca.pem" }',
            "key 'sandbox.engines[0].tls': expected no TLS settings: they are for tcp:// engines",
        ),
        (
            'address = "tcp://box:2376"\ncapacity = 1\ntls = { cert = "cert.pem" }',
            "key 'sandbox.engines[0].tls': expected both 'cert' and 'key', or neither",
        ),
        (
            'address = "tcp://box:2375"\ncapacity = 1\n[[sandbox.engines]]\n'
            'address = "tcp://box:2375"\ncapacity = 1',
            "key 'sandbox.engines': expected each engine address once, 'tcp://box:2375' is",
        ),
    ],
    ids=["address", "capacity", "no-capacity", "tls-unix", "cert-without-key", "twice"],
)
def test_bad_engine_settings_are_refused_in_one_line_naming_the_key(
    tmp_path: Path, engine: str, expected: str
) -> None:
    run_file = tmp_path / "run.toml"
    run_file.write_text(f'harnesses = ["oracle"]\ndatasets = ["ds"]\n[[sandbox.engines]]\n{engine}')
    with pytest.raises(SpecError) as refused:
        load_run_spec(run_file, Overrides())
    message = str(refused.value)
    assert message.startswith(f"{run_file}: {expected}") and "\n" not in message


def test_an_engine_on_another_machine_needs_a_gateway_host_and_nothing_is_recorded(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker
) -> None:
    make_task("one", task_toml=OFFLINE_TASK)
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        'harnesses = ["oracle"]\ndatasets = ["ds"]\n'
        '[[sandbox.engines]]\naddress = "tcp://192.0.2.250:2376"\ncapacity = 4\n'
        'tls = { ca = "certs/ca.pem" }\n'
    )
    result = pytester.runpytest("--hemra-run", str(run_file))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    shown = str(result.stderr)
    assert f"{run_file}: key 'sandbox.engines[0].tls.ca': no file {tmp_path}/certs/ca.pem" in shown
    (tmp_path / "certs").mkdir()
    (tmp_path / "certs" / "ca.pem").write_text("not checked before the engine is reached\n")
    result = pytester.runpytest("--hemra-run", str(run_file))
    assert (
        f"{run_file}: key 'sandbox.engines[0].gateway_host' is required: engine"
        " 192.0.2.250:2376 is on another machine"
    ) in str(result.stderr)
    assert not (pytester.path / ".hemra" / "hemra.db").exists()


SLOTS = (EngineSlot("a", "tcp://a:2375", 2), EngineSlot("b", "tcp://b:2375", 1, has_image=True))


def place_each(store_path: str, trials: list[str], worker: str) -> list[dict[str, int]]:
    """Claim each trial's job, wait for an engine slot, hold it a moment, give it back; what the
    store counted on each engine right after every placement."""
    store = Store(Path(store_path))
    owner = f"{worker}@{os.uname().nodename}:{os.getpid()}"
    seen = []
    for trial in trials:
        assert store.claim(trial, owner, 30).state == "leased"
        while store.claim_engine(trial, owner, SLOTS, lambda holder: True) is None:
            time.sleep(0.001)
        seen.append(store.engine_load())
        time.sleep(0.002)
        store.release_engine(trial)
    store.close()
    return seen


def test_runners_placing_at_once_never_fill_an_engine_past_its_capacity(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    plan = [PlannedTrial("ds", f"t{n}", "h", 1) for n in range(120)]
    store.record_plan("r1", "run", {}, tmp_path, plan)
    ids = [t.id for t in store.trials("r1")]
    with multiprocessing.get_context("fork").Pool(8) as workers:
        seen = workers.starmap(
            place_each, [(str(store.path), ids[n::8], f"gw{n}") for n in range(8)]
        )
    loads = [load for each in seen for load in each]
    assert len(loads) == 120
    assert max(load.get("tcp://a:2375", 0) for load in loads) <= 2
    assert max(load.get("tcp://b:2375", 0) for load in loads) <= 1
    assert {t.engine for t in store.trials("r1")} == {"a", "b"}  # b holds the image: first
    assert store.engine_load() == {}


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
def test_trials_are_spread_over_every_engine_of_the_pool(
    pytester: pytest.Pytester,
    tmp_path: Path,
    pool_run: Callable[..., Path],
    extra_engines: list[ExtraEngine],
    capsys: pytest.CaptureFixture[str],
) -> None:
    run_file = pool_run(tasks=3, attempts=7, sleep=1)
    junit = tmp_path / "junit.xml"

    result = pytester.runpytest("--hemra-run", str(run_file), "-n", "3", f"--junitxml={junit}")

    result.assert_outcomes(passed=21)
    store = Store(pytester.path / ".hemra" / "hemra.db")
    (run,) = store.runs()
    trials = store.trials(run.id, history=True)
    assert len(trials) == 21 and all(t.outcome == "pass" for t in trials)
    assert {t.engine for t in trials} == {"main", "b", "c"}
    for trial in trials:  # the trial folder says where it ran, as the store does
        result_json = json.loads((Path(trial.trial_dir or "") / "result.json").read_text())
        assert result_json["engine"] == trial.engine
        assert "place" in result_json["phases"]
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    engines = [{p.get("name"): p.get("value") for p in c.iter("property")}["engine"] for c in cases]
    assert sorted(engines) == sorted(t.engine for t in trials)
    # built once at resolve on the runner's engine; each engine (started empty) was given that
    # very image (the same ID), then HEMRA's layer built on it there
    main = docker.DockerClient(base_url=MAIN, timeout=30)
    built = {i.id for i in main.images.list(name="hemra-task")}
    main.close()
    for engine in extra_engines:
        client = docker.DockerClient(base_url=engine.address, timeout=30)
        assert {i.id for i in client.images.list(name="hemra-task")} <= built
        assert client.images.list(name="hemra-task") and client.images.list(name="hemra-sandbox")
        client.close()
    assert store.engine_load() == {}  # every slot given back
    for address in (MAIN, *(engine.address for engine in extra_engines)):
        assert containers(address, run.id) == []

    capsys.readouterr()
    assert hemra(["engines", str(run_file)]) == 0
    listing = capsys.readouterr().out
    for engine in ("main", "b", "c"):
        assert any(
            line.startswith(f"{engine} ") and " up (" in line for line in listing.splitlines()
        )
    assert "3/3 engines up, 3 trial slots" in listing


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
def test_an_engine_killed_mid_run_loses_no_trial_and_is_used_again_when_back(
    pytester: pytest.Pytester,
    tmp_path: Path,
    pool_run: Callable[..., Path],
    extra_engines: list[ExtraEngine],
) -> None:
    run_file = pool_run(tasks=3, attempts=7, sleep=2)
    store_path = tmp_path / ".hemra" / "hemra.db"
    b, c = extra_engines
    log = (tmp_path / "runner.log").open("wb")
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--hemra-run"]
    runner = subprocess.Popen(
        [*argv, str(run_file), "-n", "3"],
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        },
        start_new_session=True,
    )
    try:

        def running_on_c() -> bool:
            if not store_path.exists():
                return False
            store = Store(store_path)
            try:
                runs = store.runs()
                return (
                    bool(runs)
                    and any(
                        t.status == "running" and t.engine == "c" for t in store.trials(runs[0].id)
                    )
                    and bool(containers(c.address, runs[0].id))
                )
            finally:
                store.close()

        wait_for(running_on_c, 120, "a trial running on engine c")
        c.kill()  # SIGKILL by PID, with a trial in its sandbox there
        assert runner.wait(300) == 0, (tmp_path / "runner.log").read_text()[-3000:]
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
            runner.wait()
        log.close()

    store = Store(store_path)
    (run,) = store.runs()
    current = store.trials(run.id)
    assert len(current) == 21 and len({t.item_id for t in current}) == 21
    assert all(t.status == "finished" and t.outcome == "pass" for t in current)
    history = store.trials(run.id, history=True)
    lost = [t for t in history if t.status == "replaced"]
    assert lost and all(t.outcome == "infra_error" and t.engine == "c" for t in lost)
    assert all("engine c stopped answering" in (t.error or "") for t in lost)
    retried = {t.replaces: t for t in current if t.replaces}
    assert set(retried) == {t.id for t in lost}
    assert all(t.engine in ("main", "b") for t in retried.values())
    assert all(t.cause == "engine_outage" for t in lost)  # the engine's, not the trial's
    assert all(t.retries == 0 for t in current)  # so running them again used up no retry
    assert store.run(run.id).status == "finished" and store.engine_load() == {}
    for address in (MAIN, b.address):
        assert containers(address, run.id) == []

    c.start()  # back: what the lost trials left there is removed when the pool sees it
    assert containers(c.address, run.id)
    pool = EnginePool(load_run_spec(run_file, Overrides()).sandbox.engines, store)
    assert pool.ping(pool.engines[2]) is None
    assert containers(c.address, run.id) == []

    # 9 trials of 3 s on 3 one-slot engines from 3 workers: with c up, main and b alone would
    # keep a worker waiting for a slot at every turn. The same store as the run that lost c (a
    # run's store is the current folder's, and pytester's folder is not tmp_path): its lost
    # trials' placements and engine_down events do not keep c out of the pool
    again = pytester.runpytest(
        "--hemra-run",
        str(pool_run(3, 3, 3, name="again.toml")),
        "--hemra-store",
        str(store_path),
        "-n",
        "3",
    )
    again.assert_outcomes(passed=9)
    later = store.runs()[-1]
    assert later.id != run.id
    assert {t.engine for t in store.trials(later.id)} == {"main", "b", "c"}  # full width again
    assert store.engine_load() == {}


def make_certificates(folder: Path, host: str) -> ssl.SSLContext:
    """A CA, a server certificate for `host` and a client certificate (ca.pem, cert.pem,
    key.pem, as a run file names them); returns the server's TLS context, which asks every
    client for a certificate signed by that CA."""
    folder.mkdir()

    def openssl(*argv: str) -> None:
        subprocess.run(["openssl", *argv], cwd=folder, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca-key.pem",
            "-out", "ca.pem", "-days", "2", "-subj", "/CN=hemra-test-ca")  # fmt: skip
    for name, usage in (("server", f"subjectAltName=IP:{host}"), ("client", "")):
        (folder / f"{name}.ext").write_text(
            (usage + "\n" if usage else "")
            + f"extendedKeyUsage={'serverAuth' if name == 'server' else 'clientAuth'}\n"
        )
        key = "key.pem" if name == "client" else "server-key.pem"
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", f"{name}.csr",
                "-subj", f"/CN={name}")  # fmt: skip
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem",
                "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext",
                "-out", "cert.pem" if name == "client" else "server.pem")  # fmt: skip
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "server.pem", folder / "server-key.pem")
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(folder / "ca.pem")
    return context


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
def test_a_tcp_engine_behind_tls_is_reached_with_the_run_files_certificates(
    pytester: pytest.Pytester,
    tmp_path: Path,
    pool_run: Callable[..., Path],
    extra_engines: list[ExtraEngine],
    capsys: pytest.CaptureFixture[str],
) -> None:
    pool_run(tasks=2, attempts=1, sleep=0, name="unused.toml")  # the tasks and the harness
    (host,) = free_loopback_hosts(1, first=20)
    tls = UnixForwarder(
        host, 2375, extra_engines[0].socket_path, make_certificates(tmp_path / "certs", host)
    )
    try:
        run_file = tmp_path / "tls.toml"
        engine = (
            f'[[sandbox.engines]]\nname = "secure"\naddress = "tcp://{host}:2375"\ncapacity = 2\n'
        )
        run_file.write_text(
            'harnesses = ["sleeper"]\ndatasets = ["ds"]\n'
            + engine
            + 'tls = { ca = "certs/ca.pem", cert = "certs/cert.pem", key = "certs/key.pem" }\n'
        )
        result = pytester.runpytest("--hemra-run", str(run_file), "-n", "2")
        result.assert_outcomes(passed=2)
        capsys.readouterr()
        assert hemra(["engines", str(run_file)]) == 0
        assert " up (" in capsys.readouterr().out

        run_file.write_text(  # the engine asks for a client certificate: without one, down
            'harnesses = ["sleeper"]\ndatasets = ["ds"]\n'
            + engine
            + 'tls = { ca = "certs/ca.pem" }\n'
        )
        assert hemra(["engines", str(run_file)]) == 1
        assert "down: " in capsys.readouterr().out

        certs = tmp_path / "certs"  # a provider given a client pings with that client's TLS
        for cert in ((str(certs / "cert.pem"), str(certs / "key.pem")), None):
            config = docker.tls.TLSConfig(
                client_cert=cert, ca_cert=str(certs / "ca.pem"), verify=True
            )
            client = docker.DockerClient(base_url=f"tcp://{host}:2375", tls=config, version="1.41")
            provider = DockerProvider(client, engine=f"tcp://{host}:2375")
            assert (provider.engine_error() is None) == (cert is not None)
            client.close()
    finally:
        tls.close()


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
def test_a_compose_tasks_services_run_on_the_engine_its_trial_is_placed_on(
    pytester: pytest.Pytester, tmp_path: Path, extra_engines: list[ExtraEngine]
) -> None:
    """The bundled compose task over two engines that started empty and have no bridge: its
    service image (built at resolve here) copied to each, its services beside each sandbox on
    a network of the trial, nothing left on either engine."""
    shutil.copytree(
        REPO / "datasets" / "harbor-features" / "compose-service",
        tmp_path / "datasets" / "ds" / "compose-service",
    )
    b, c = extra_engines
    engines = "".join(
        f'[[sandbox.engines]]\nname = "{name}"\naddress = "{engine.address}"\ncapacity = 1\n'
        for name, engine in (("b", b), ("c", c))
    )
    run_file = tmp_path / "run.toml"
    run_file.write_text(f'harnesses = ["oracle"]\ndatasets = ["ds"]\nattempts = 2\n\n{engines}')
    result = pytester.runpytest("--hemra-run", str(run_file), "-n", "2")

    store = Store(pytester.path / ".hemra" / "hemra.db")
    (run,) = store.runs()
    trials = store.trials(run.id)
    assert [t.outcome for t in trials] == ["pass"] * 2, [t.error for t in trials]
    result.assert_outcomes(passed=2)
    for trial in trials:
        assert "GET /token" in (Path(trial.trial_dir or "") / "services" / "api.log").read_text()
    assert {t.engine for t in trials} <= {"b", "c"}
    for engine in (b, c):
        client = docker.DockerClient(base_url=engine.address, timeout=30)
        label = {"label": f"hemra.run={run.id}"}
        assert client.containers.list(all=True, ignore_removed=True, filters=label) == []
        assert client.networks.list(filters=label) == []
        client.close()


@pytest.mark.usefixtures("docker_test")
def test_a_pool_run_warns_by_name_of_the_allowlists_its_engines_cannot_serve(
    tmp_path: Path, make_task: TaskMaker
) -> None:
    from pytest_hemra.resolve.plan import resolve_plan

    make_task("open")
    make_task("agent-list", task_toml='[agent]\nallowed_hosts = ["pypi.org"]\n')
    make_task("verifier-list", task_toml='[verifier]\nallowed_hosts = ["pypi.org"]\n')
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["oracle"]\ndatasets = ["ds"]\n')
    assert not [w for w in resolve_plan(run_file, Overrides(), tmp_path).warnings if "pool" in w]
    run_file.write_text(
        run_file.read_text()
        + f'[[sandbox.engines]]\nname = "main"\naddress = "{MAIN}"\ncapacity = 1\n'
    )
    warnings = [w for w in resolve_plan(run_file, Overrides(), tmp_path).warnings if "pool" in w]
    unproxied, unguarded = warnings
    assert unproxied.startswith(f"{run_file}: [sandbox] engines: a pool's engines reach no egress")
    assert unproxied.endswith("of 2 tasks are reached by none of their phases (the network is"
                              " cut): agent-list, verifier-list")  # fmt: skip
    assert unguarded.startswith(
        f"{run_file}: [sandbox] engines: a pool's engines get neither HEMRA's isolated networks"
        " nor its host firewall: 2 tasks with internet run on Docker's default bridge there"
    )
