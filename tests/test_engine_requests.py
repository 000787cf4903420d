"""What a trial asks of its engine, counted at the engine's socket (tests/slow_engine.py, slowing
nothing): a session of three trials against one of a single trial, the difference halved, so the
run's own requests (its network, the first look at an image, the sweep) and the engine watch's
pings are left out. docs/runs.md lists the requests phase by phase; the test fails above them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import TaskMaker
from tests.slow_engine import SlowEngine

# docs/runs.md, "What a trial asks of its engine": the requests one trial by a root agent makes,
# at most, on a local engine, online and offline, by its sandbox's PID 1 (HEMRA's keeper where the
# image has perl, else docker-init); the run's own upkeep (finding and reaping its networks
# between trials, listing what is left) is the run's, not counted here
TRIAL_REQUESTS = {"keeper": 10, "docker-init": 13}
IMAGES = {  # a root agent's, as Harbor's
    "keeper": "FROM debian:bookworm-slim\nWORKDIR /app\n",
    "docker-init": "FROM debian:bookworm-slim\nRUN rm /usr/bin/perl\nWORKDIR /app\n",
}
NETWORK_MADE = "POST networks/create"  # a session's run network, where its trials are online
UPKEEP = {"GET networks", "GET networks/ID", "DELETE networks/ID", "GET containers/json"}
VERSIONED = re.compile(r"/v[\d.]+/([^?]*)")
ID = re.compile(r"^[0-9a-f]{64}$|^hemra-")


def kind(request: str) -> str:
    """`POST /v1.41/containers/ID/start?x` as `POST containers/ID/start`."""
    method, path = request.split(" ", 1)
    found = VERSIONED.match(path)
    if found is None:  # `GET /version`, unversioned
        return request
    parts = ["ID" if ID.match(part) else part for part in found.group(1).split("/")]
    return f"{method} {'/'.join(parts)}"


def asked(
    root: Path, pytester: pytest.Pytester, attempts: int, engine: SlowEngine, more: str = ""
) -> list[str]:
    engine.requests.clear()
    run_file = root / "run.toml"
    run_file.write_text(f'harnesses = ["oracle"]\ndatasets = ["ds"]\nattempts = {attempts}\n{more}')
    result = pytester.runpytest_subprocess("--hemra-run", str(run_file), "-p", "no:cacheprovider")
    result.assert_outcomes(passed=attempts)
    return [kind(r) for r in engine.requests if not r.endswith("/_ping")]


def per_trial(
    tmp_path: Path, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, more: str = ""
) -> dict[str, float]:
    """What one trial of the task `one` asks, by kind: three trials' requests less one's, halved
    (`more`: added to the run file).

    Measured again (up to twice) when a session had to make its run's network again: another
    session's start (or `hemra clean`) on the same engine, as the suite's other tests run beside
    this one, removes a run network no sandbox sits on, between two trials of a live run, and
    the next trial then makes it again (`Containers._on_networks`): a start refused, a container
    removed, a network made, none of them a trial's own."""
    with SlowEngine(tmp_path / "engine.sock", delay=0, slow_starts=0) as engine:
        monkeypatch.setenv("DOCKER_HOST", engine.address)
        asked(tmp_path, pytester, 1, engine, more)  # the task's image built, not counted
        for _ in range(3):
            one = asked(tmp_path, pytester, 1, engine, more)
            three = asked(tmp_path, pytester, 3, engine, more)
            if one.count(NETWORK_MADE) == three.count(NETWORK_MADE):
                break
    kinds = (set(one) | set(three)) - UPKEEP
    found = {k: (three.count(k) - one.count(k)) / 2 for k in kinds}
    return {k: n for k, n in sorted(found.items()) if n}


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
@pytest.mark.parametrize(
    ("pid1", "online", "user"),
    [
        ("keeper", True, "root"),
        ("keeper", False, "root"),
        ("keeper", True, "non-root"),
        ("docker-init", True, "root"),
    ],
    ids=["keeper-online", "keeper-offline", "keeper-non-root", "docker-init-online"],
)
def test_a_trial_asks_its_engine_no_more_than_docs_runs_md_lists(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    monkeypatch: pytest.MonkeyPatch,
    pid1: str,
    online: bool,
    user: str,
) -> None:
    network = "" if online else "allow_internet = false\n"
    make_task(
        "one",
        dockerfile=IMAGES[pid1],
        task_toml="[agent]\ntimeout_sec = 30\n[verifier]\ntimeout_sec = 30\n"
        f"[environment]\n{network}",
    )
    more = '[sandbox]\nagent_user = "non-root"\n' if user == "non-root" else ""
    asked_of_it = per_trial(tmp_path, pytester, monkeypatch, more)
    assert sum(asked_of_it.values()) <= TRIAL_REQUESTS[pid1], f"over docs/runs.md: {asked_of_it}"
    started = asked_of_it.get("POST containers/ID/start")
    assert started == (1 if pid1 == "keeper" else 2), asked_of_it  # which clean room it had
    # with the keeper the tests go in through the container's root on this host, no request,
    # and whoever the agent ran as, what it left is killed from there (no listing, no kill)
    if pid1 == "keeper":
        assert not {"PUT containers/ID/archive", "GET containers/ID/top"} & set(asked_of_it)


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
def test_tests_go_in_through_the_engine_where_the_agents_processes_still_run(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A task that keeps the agent's processes into its verifier's turn has what the agent left
    running while the tests go in: they are never written from this host through the
    container's root then (a process inside could swap a folder of theirs for a link as they
    are written), but put by the engine, as an archive."""
    make_task(
        "one",
        dockerfile=IMAGES["keeper"],
        task_toml="[agent]\ntimeout_sec = 30\n[verifier]\ntimeout_sec = 30\n"
        "[hemra]\nkeep_agent_processes = true\n",
    )
    asked_of_it = per_trial(tmp_path, pytester, monkeypatch)
    assert asked_of_it.get("PUT containers/ID/archive") == 1, asked_of_it
