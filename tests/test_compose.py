"""Multi-container tasks: an `environment/docker-compose.yaml`'s services beside the sandbox.

The service image is the bundled `compose-service` task's `api` (python3 on the base image):
built once, then found cached by every test here."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, TaskMaker

BUNDLED = REPO / "datasets" / "harbor-features" / "compose-service"
UNHEALTHY = """\
services:
  main:
    depends_on:
      api: {condition: service_healthy}
  api:
    build: ./api
    command: ["python3", "-m", "http.server", "8000"]
    healthcheck:
      test: ["CMD-SHELL", "echo never ready; exit 1"]
      interval: 200ms
      timeout: 2s
      retries: 2
"""


def trials(store: Path) -> dict[str, tuple[str, float | None, str | None, str]]:
    connection = sqlite3.connect(store)
    found = {
        harness: (outcome, reward, error, trial_dir)
        for harness, outcome, reward, error, trial_dir in connection.execute(
            "SELECT harness, outcome, reward, error, trial_dir FROM trials"
        )
    }
    connection.close()
    return found


def left_of_run(docker_client: Any, store: Path) -> tuple[list[str], list[str]]:
    """The containers and networks a run left behind, found by label."""
    connection = sqlite3.connect(store)
    (run_id,) = connection.execute("SELECT id FROM runs").fetchone()
    connection.close()
    label = {"label": f"hemra.run={run_id}"}
    containers = [
        c.name for c in docker_client.containers.list(all=True, ignore_removed=True, filters=label)
    ]
    networks = [
        n.name
        for n in docker_client.networks.list(filters=label)
        if n.name != f"hemra-{run_id}"  # the run's own network, released with the run
    ]
    return containers, networks


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
def test_the_oracle_reads_an_answer_only_a_service_knows_and_nop_does_not(
    pytester: pytest.Pytester,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    docker_client: Any,
) -> None:
    shutil.copytree(BUNDLED, tmp_path / "datasets" / "ds" / "compose-service")
    monkeypatch.setenv("HEMRA_FEATURE_TOKEN", "only-the-api-knows-41")
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        'harnesses = ["oracle", "nop"]\ndatasets = ["ds"]\n'
        '[sandbox]\npass_env = ["HEMRA_FEATURE_TOKEN"]\n'
    )
    store = tmp_path / "hemra.db"
    result = pytester.runpytest("--hemra-run", str(run_file), "--hemra-store", str(store))

    found = trials(store)
    assert found["oracle"][:2] == ("pass", 1.0), found["oracle"][2]
    assert found["nop"][:2] == ("fail", 0.0), found["nop"][2]
    result.assert_outcomes(passed=1, failed=1)
    oracle = Path(found["oracle"][3])
    assert "+only-the-api-knows-41" in (oracle / "diff.patch").read_text()
    assert "GET /token" in (oracle / "services" / "api.log").read_text()  # the service's output
    assert left_of_run(docker_client, store) == ([], [])


@pytest.mark.usefixtures("docker_test")
def test_a_service_that_never_gets_healthy_is_an_infra_error_naming_it_and_nothing_is_left(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker, docker_client: Any
) -> None:
    folder = make_task("unhealthy", dockerfile=None)
    shutil.copytree(BUNDLED / "environment", folder / "environment")
    compose = folder / "environment" / "docker-compose.yaml"
    compose.write_text(UNHEALTHY)
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["oracle"]\ndatasets = ["ds"]\n')
    store = tmp_path / "hemra.db"
    result = pytester.runpytest("--hemra-run", str(run_file), "--hemra-store", str(store))

    outcome, _, error, _ = trials(store)["oracle"]
    assert outcome == "infra_error"
    assert error is not None
    assert error.startswith(f"{compose}: service 'api' (main depends on it, service_healthy)")
    assert "unhealthy (last check: exit 1: never ready)" in error
    result.assert_outcomes(errors=1)
    assert left_of_run(docker_client, store) == ([], [])


@pytest.mark.usefixtures("docker_test")
def test_a_dependency_not_required_that_never_gets_healthy_is_logged_and_the_trial_goes_on(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker, docker_client: Any
) -> None:
    folder = make_task("optional", dockerfile=None)
    shutil.copytree(BUNDLED / "environment", folder / "environment")
    optional = "{condition: service_healthy, required: false, restart: true}"
    (folder / "environment" / "docker-compose.yaml").write_text(
        UNHEALTHY.replace("{condition: service_healthy}", optional)
    )
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["oracle"]\ndatasets = ["ds"]\n')
    store = tmp_path / "hemra.db"
    pytester.runpytest("--hemra-run", str(run_file), "--hemra-store", str(store))

    outcome, reward, error, trial_dir = trials(store)["oracle"]
    assert (outcome, reward) == ("pass", 1.0), error
    logged = (Path(trial_dir) / "services" / "depends_on.log").read_text()
    assert logged.startswith("not required, went on: ") and "service 'api'" in logged
    assert left_of_run(docker_client, store) == ([], [])


@pytest.mark.parametrize(
    ("compose", "expected"),
    [
        (
            "services:\n  api:\n    image: debian:bookworm-slim\n    ports: ['8000:8000']\n",
            "service 'api': key 'ports' is not supported",
        ),
        (
            "services:\n  api:\n    image: debian:bookworm-slim\n    volumes: ['/:/host']\n",
            "service 'api': key 'volumes' is not supported",
        ),
        (
            "services:\n  main:\n    privileged: true\n",
            "service 'main': key 'privileged' is not supported for main",
        ),
        (
            "services:\n  api:\n    image: debian:bookworm-slim\nvolumes:\n  data: {}\n",
            "top-level key 'volumes' is not supported",
        ),
    ],
)
def test_unsupported_compose_keys_are_refused_at_resolve_by_name_and_nothing_recorded(
    pytester: pytest.Pytester, tmp_path: Path, make_task: TaskMaker, compose: str, expected: str
) -> None:
    folder = make_task("refused")
    path = folder / "environment" / "docker-compose.yaml"
    path.write_text(compose)
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["oracle"]\ndatasets = ["ds"]\n')
    result = pytester.runpytest("--hemra-run", str(run_file))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {path}: {expected}*"])
    errors = [line for line in result.stderr.lines if line.startswith("ERROR:")]
    assert len(errors) == 1
    assert not (pytester.path / ".hemra").exists()


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
def test_an_allowlist_tasks_services_are_reached_directly_not_through_the_proxy(
    pytester: pytest.Pytester, tmp_path: Path, docker_client: Any
) -> None:
    """The bundled compose task with a host allowlist: HTTP clients honour the proxy variables,
    and the services (on the trial's own network) are in NO_PROXY, as the gateway is."""
    task = tmp_path / "datasets" / "ds" / "compose-service"
    shutil.copytree(BUNDLED, task)
    toml = task / "task.toml"
    toml.write_text(
        toml.read_text().replace("allow_internet = false", 'allowed_hosts = ["127.0.0.1"]')
    )
    # main with python3 (the api's image, whose layers are cached) and an HTTP client that
    # honours HTTP_PROXY and NO_PROXY, as most do (bash's /dev/tcp would not)
    api = (task / "environment" / "api" / "Dockerfile").read_text()
    (task / "environment" / "Dockerfile").write_text(api.replace("/srv", "/app"))
    (task / "solution" / "solve.sh").write_text(
        "python3 -c \"import os, urllib.request; open('/app/token.txt', 'wb').write("
        "urllib.request.urlopen(os.environ['TOKEN_URL'], timeout=10).read())\"\n"
    )
    run_file = tmp_path / "run.toml"
    run_file.write_text('harnesses = ["oracle"]\ndatasets = ["ds"]\n')
    store = tmp_path / "hemra.db"
    pytester.runpytest("--hemra-run", str(run_file), "--hemra-store", str(store))

    outcome, reward, error, trial_dir = trials(store)["oracle"]
    assert (outcome, reward) == ("pass", 1.0), error
    egress = (Path(trial_dir) / "agent" / "egress.json").read_text()
    assert '"refused": {}' in egress  # the service was never asked of the proxy
    assert left_of_run(docker_client, store) == ([], [])
