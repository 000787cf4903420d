"""The engine's locks (an image built or copied, a run's network made or removed) held in a
shared PostgreSQL store, for runners on several machines: a runner with another $TMPDIR (as on
another machine, whose lock files this one never sees) is still kept out. The machine's own
engine (a Unix socket) keeps its locks in the machine's lock files whatever the store: a runner
with a local store on the same machine is kept out too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_hemra.execute.sandbox.client import LOCAL_ENGINE, EngineClient
from pytest_hemra.execute.sandbox.images import engine_lock, hold_engine_locks_in
from pytest_hemra.execute.sandbox.networks import Networks
from pytest_hemra.store import Store
from tests.slow_engine import SlowEngine

ENGINE, WHAT = "tcp://10.0.0.7:2375", "hemra-task:0123"  # named, never reached
OTHER_RUNNER = """
import sys
from pytest_hemra.core.errors import InfraError
from pytest_hemra.execute.sandbox.images import engine_lock, hold_engine_locks_in
from pytest_hemra.store import Store

if sys.argv[1] != "no store":
    hold_engine_locks_in(Store(sys.argv[1]).lock)
try:
    with engine_lock(sys.argv[2], sys.argv[3], 1.0, shared=sys.argv[4] == "shared"):
        print("held")
except InfraError as error:
    print(error)
"""


def other_runner(url: str, tmp_path: Path | None, mode: str, engine: str = ENGINE) -> str:
    """What a runner of another machine (its own $TMPDIR) gets trying the same lock; with
    `tmp_path` None, a runner of this machine; with `url` "no store", one without a shared store."""
    env = dict(os.environ)
    if tmp_path is not None:
        folder = tmp_path / "other-machine"
        folder.mkdir(exist_ok=True)
        env["TMPDIR"] = str(folder)
    done = subprocess.run(
        [sys.executable, "-c", OTHER_RUNNER, url, engine, WHAT, mode],
        env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def test_runners_of_one_shared_store_exclude_each_other_whatever_their_machine(
    postgres_url: str, tmp_path: Path
) -> None:
    waited = f"engine {ENGINE}: waited 1s for another runner preparing {WHAT}"
    with Store(postgres_url) as store:
        hold_engine_locks_in(store.lock)
        try:
            with engine_lock(ENGINE, WHAT, 5.0):
                assert other_runner(postgres_url, tmp_path, "exclusive") == waited
                assert other_runner(postgres_url, tmp_path, "shared") == waited
            assert other_runner(postgres_url, tmp_path, "exclusive") == "held"  # released
            with engine_lock(ENGINE, WHAT, 5.0, shared=True):  # users of a network at once
                assert other_runner(postgres_url, tmp_path, "shared") == "held"
                assert other_runner(postgres_url, tmp_path, "exclusive") == waited
        finally:
            hold_engine_locks_in(None)


def test_the_machines_own_engine_is_locked_in_its_lock_files_whatever_the_store(
    postgres_url: str,
) -> None:
    """A run with a shared store and a run with a local one on the same machine's engine: the
    first never removes the run network the second's sandbox is about to join (the network
    was gone at the container's start when the first held its lock in the store)."""
    engine = "unix:///var/run/docker.sock"
    waited = f"engine {engine}: waited 1s for another runner preparing {WHAT}"
    with Store(postgres_url) as store:
        hold_engine_locks_in(store.lock)
        try:
            with engine_lock(engine, WHAT, 5.0):  # removing the network, say
                assert other_runner("no store", None, "shared", engine) == waited
            with engine_lock(engine, WHAT, 5.0, shared=True):  # joining it
                assert other_runner("no store", None, "exclusive", engine) == waited
                assert other_runner("no store", None, "shared", engine) == "held"
            assert other_runner("no store", None, "exclusive", engine) == "held"
        finally:
            hold_engine_locks_in(None)


ONE_ENGINE_RUNNER = """
import sys
from pytest_hemra.core.errors import InfraError
from pytest_hemra.execute.sandbox import networks
from pytest_hemra.execute.sandbox.client import EngineClient
from pytest_hemra.execute.sandbox.networks import Networks

networks.NETWORK_LOCK_SECS = 1.0  # waited that long, then refused
try:  # the engine as DOCKER_HOST names it: here, a proxy in front of the machine's own
    with Networks(EngineClient(), own=True).run_lock("one-engine"):
        print("held")
except InfraError as error:
    print(error)
"""


@pytest.mark.usefixtures("docker_test")
def test_one_engine_reached_at_two_paths_is_locked_as_one(tmp_path: Path) -> None:
    """Processes reaching the machine's engine at different paths (a symlinked socket, a proxy
    in front of it) lock its networks as one engine: by its ID, not the path. A runner through
    the proxy cannot remove the run network a runner on the socket is joining."""
    with SlowEngine(tmp_path / "engine.sock", delay=0, slow_starts=0) as proxy:
        direct = EngineClient(address=LOCAL_ENGINE)
        assert direct.lock_key.startswith("docker ")
        assert EngineClient(address=proxy.address).lock_key == direct.lock_key
        removal = Networks(direct, own=True)._lock_of("connect hemra-one-engine")
        with removal:  # what a reap holds while it removes the network
            done = subprocess.run(
                [sys.executable, "-c", ONE_ENGINE_RUNNER],
                env={**os.environ, "DOCKER_HOST": proxy.address},
                capture_output=True, text=True, timeout=300, check=True,
            )  # fmt: skip
        assert "waited" in done.stdout, done.stdout + done.stderr
