"""Shared fixtures: a real Docker engine, the offline base image, and task folders made to order.

Under CI=true a missing Docker engine fails the tests that need it; elsewhere they skip.
"""

from __future__ import annotations

import os
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# pytester's in-process runs drop the modules each run imported, and numpy cannot be imported
# twice in one process, nor SQLAlchemy (its compiled modules keep the first import's classes: a
# second run fails "'InternalTraversal' object is not callable"): numpy, scipy and statsmodels
# (with its pandas), which HEMRA imports only where a report needs them, and the pytest face
# with the controller's and the worker's parts (the store's SQLAlchemy among them), which the
# `pytest11` entry point loads only when a run is asked for, are imported once here, before any
# run.
import numpy  # noqa: F401
import pytest
import scipy.special  # noqa: F401
import statsmodels.api  # noqa: F401

import pytest_hemra.plugin
import pytest_hemra.plugin.controller
import pytest_hemra.plugin.worker  # noqa: F401

pytest_plugins = ["pytester"]

# HEMRA fits its tables to COLUMNS when it is set, and pytest-xdist's workers get it set (80):
# the tests see every column, as a pipe does, unless one sets a width itself
os.environ.pop("COLUMNS", None)

BASE_IMAGE = "debian:bookworm-slim"
REPO = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def docker_client() -> Any:
    import docker

    try:
        client = docker.from_env(timeout=60)
        client.ping()
        client.images.get(BASE_IMAGE)
    except Exception as error:
        message = f"needs a Docker engine with {BASE_IMAGE} (hemra image bootstrap): {error}"
        if os.environ.get("CI"):
            pytest.fail(message)  # under CI Docker tests fail, never skip
        pytest.skip(message)  # only outside CI
    return client


@pytest.fixture
def no_leftover_containers(
    docker_client: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[None]:
    """No sandbox outlives its test: none of the runs in this test's stores is left after it
    (tests run in parallel, so another test's live sandboxes do not count here). Under CI every
    HEMRA container still on the machine at the end fails the session too
    (`pytest_sessionfinish`): a sandbox outside any run is caught there."""
    folders = [tmp_path]
    if "pytester" in request.fixturenames:  # a session's store is in its own folder
        folders.append(request.getfixturevalue("pytester").path)  # (asked before the test)
    yield
    left = docker_client.containers.list(all=True, filters={"label": "hemra"}, ignore_removed=True)
    mine = {run for folder in folders for run in _run_ids(folder)}
    left = [c for c in left if c.labels.get("hemra.run") in mine]
    assert left == [], f"containers left behind: {[c.name for c in left]}"


def pytest_configure(config: pytest.Config) -> None:
    """The suite's own session is the first to load this file; sessions its tests start in
    subprocesses (which find it again from the repository's folder) inherit the mark."""
    os.environ.setdefault("HEMRA_SUITE_SESSION", str(os.getpid()))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under CI, after every test (the xdist controller, once its workers are done): any HEMRA
    container left on the machine's engine fails the session, naming it."""
    if not os.environ.get("CI") or hasattr(session.config, "workerinput"):
        return
    if os.environ.get("HEMRA_SUITE_SESSION") != str(os.getpid()):
        return  # a session a test started (in a subprocess): not the suite's
    try:
        import docker

        client = docker.from_env(timeout=60)
        found = client.containers.list(all=True, filters={"label": "hemra"}, ignore_removed=True)
        left = [c.name for c in found]
    except Exception:  # no engine: the Docker tests have failed already
        return
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"ERROR: containers left behind by the session: {left}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _run_ids(folder: Path) -> set[str]:
    import sqlite3

    found: set[str] = set()
    for store in folder.rglob("*.db"):
        connection = sqlite3.connect(store)
        try:
            found |= {row[0] for row in connection.execute("SELECT id FROM runs")}
        except sqlite3.Error:
            pass
        finally:
            connection.close()
    return found


@pytest.fixture
def docker_test(no_leftover_containers: None) -> None:
    """Marks a test as needing Docker, and checks it leaves no container behind."""


@pytest.fixture
def upstream() -> Iterator[Any]:
    """A loopback model upstream (tests/upstream.py) that reports known usage."""
    from tests.upstream import running_upstream

    with running_upstream() as state:
        yield state


@pytest.fixture
def store(tmp_path: Path) -> Any:
    from pytest_hemra.store import Store

    return Store(tmp_path / "calls.db")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Any]:
    """A throwaway PostgreSQL server (tests/postgres.py) for the session. Under CI=true missing
    PostgreSQL binaries fail the tests that need it; elsewhere they skip."""
    from tests.postgres import PostgresServer, binaries

    found = binaries()
    if found is None:
        message = "needs PostgreSQL's server programs (apt-get install postgresql)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    server = PostgresServer(found)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: Any) -> str:
    """A new, empty PostgreSQL database of the session's server: its URL."""
    return str(postgres_server.create_database())


@pytest.fixture(params=["sqlite", "postgresql"])
def store_address(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A new store's address, once for each kind of store: a SQLite file, a PostgreSQL
    database."""
    if request.param == "sqlite":
        return str(tmp_path / "s.db")
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def gateway(upstream: Any, store: Any) -> Iterator[Any]:
    """A real gateway on loopback forwarding `anthropic` and `openai` to the loopback upstream
    (keys from ANTHROPIC_API_KEY / OPENAI_API_KEY) and `dead` to a port nothing listens on."""
    from pytest_hemra.execute.gateway.server import Gateway
    from pytest_hemra.resolve.upstreams import BUILTIN_UPSTREAMS, ModelApi
    from tests.upstream import closed_port

    upstreams = {
        **BUILTIN_UPSTREAMS,
        "anthropic": ModelApi(
            name="anthropic", base_url=upstream.url, auth="x-api-key", key_env="ANTHROPIC_API_KEY"
        ),
        "openai": ModelApi(
            name="openai", base_url=upstream.url, auth="bearer", key_env="OPENAI_API_KEY"
        ),
        "dead": ModelApi(name="dead", base_url=f"http://127.0.0.1:{closed_port()}"),
    }
    with Gateway(upstreams, store.record_call) as running:
        yield running


TaskMaker = Callable[..., Path]


@pytest.fixture
def make_task(tmp_path: Path) -> TaskMaker:
    """Write a task folder `<tmp>/datasets/<dataset>/<name>` in the Harbor format."""

    def make(
        name: str = "task",
        *,
        dataset: str = "ds",
        instruction: str | None = "Write hi to /app/out.txt.",
        test: str | None = 'if [ "$(cat /app/out.txt 2>/dev/null)" = hi ]; then echo 1; '
        "else echo 0; fi > /logs/verifier/reward.txt",
        solve: str | None = "echo hi > /app/out.txt",
        # USER 1000: the agent runs as HEMRA's uid 1000, not root (the image's USER is the
        # agent's); tests of root agents give a Dockerfile without one
        dockerfile: str | None = f"FROM {BASE_IMAGE}\nWORKDIR /app\nUSER 1000\n",
        task_toml: str = "[agent]\ntimeout_sec = 30\n[verifier]\ntimeout_sec = 30\n",
    ) -> Path:
        folder = tmp_path / "datasets" / dataset / name
        folder.mkdir(parents=True)
        (folder / "task.toml").write_text(textwrap.dedent(task_toml))
        if instruction is not None:
            (folder / "instruction.md").write_text(instruction)
        if test is not None:
            (folder / "tests").mkdir()
            (folder / "tests" / "test.sh").write_text(test + "\n")
        if solve is not None:
            (folder / "solution").mkdir()
            (folder / "solution" / "solve.sh").write_text(solve + "\n")
        if dockerfile is not None:
            (folder / "environment").mkdir()
            (folder / "environment" / "Dockerfile").write_text(dockerfile)
        return folder

    return make


@pytest.fixture
def write_harness(tmp_path: Path) -> Callable[[str, str], Path]:
    """Write `<tmp>/harnesses/<name>.toml` (found beside a run file in tmp_path)."""

    def write(name: str, content: str) -> Path:
        folder = tmp_path / "harnesses"
        folder.mkdir(exist_ok=True)
        path = folder / f"{name}.toml"
        path.write_text(textwrap.dedent(content))
        return path

    return write


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll `condition` until it holds; an AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)
