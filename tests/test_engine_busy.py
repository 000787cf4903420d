"""An overloaded engine is backpressure, not an outage (run/admission.py): an engine that answers
pings at once but a sandbox's start after the client's timeout has its starts in flight lowered,
and the trial runs again without using up a retry; no `engine_outage`, no `engine_down`."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import pytest
import requests

from conftest import TaskMaker
from pytest_hemra.core.backoff import START_SLOW_SECS
from pytest_hemra.run.admission import INITIAL, Admission
from pytest_hemra.store import Store
from tests.slow_engine import SlowEngine

TASKS = ("one", "two", "three", "four")
TIMEOUT_SECS = 8  # the engine client's read timeout in the run
DELAY_SECS = 14  # how late the slow engine answers each trial's first start


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
def test_starts_answered_late_by_an_engine_that_answers_pings_rerun_the_trials_free(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in TASKS:
        make_task(name)
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        'harnesses = ["oracle"]\ndatasets = ["ds"]\nmax_infra_retries = 0\n'
        f"concurrency = {len(TASKS)}\n"
    )
    with SlowEngine(tmp_path / "engine.sock", DELAY_SECS, slow_starts=len(TASKS)) as engine:
        monkeypatch.setenv("DOCKER_HOST", engine.address)
        monkeypatch.setenv("HEMRA_ENGINE_TIMEOUT_SECS", str(TIMEOUT_SECS))
        result = pytester.runpytest("--hemra-run", str(run_file))
        held = engine.held

    result.assert_outcomes(passed=len(TASKS))
    assert held == len(TASKS)  # every trial's first start was answered late
    store = Store(pytester.path / ".hemra" / "hemra.db")
    (run,) = store.runs()
    current = store.trials(run.id)
    assert sorted(t.task for t in current) == sorted(TASKS)  # each trial finished once
    assert {t.outcome for t in current} == {"pass"}
    assert [t.retries for t in current] == [0] * len(TASKS)  # no retry used (none allowed)
    history = store.trials(run.id, history=True)
    assert "engine_outage" not in {t.cause for t in history}
    replaced = [t for t in history if t.status == "replaced"]
    assert len(replaced) == len(TASKS)
    assert {(t.outcome, t.cause) for t in replaced} == {("infra_error", "engine_busy")}
    events = store.events([t.id for t in history])
    kinds = [event.kind for event in events]
    assert kinds.count("engine_busy") == len(TASKS)
    assert "engine_down" not in kinds
    busy = [event.data for event in events if event.kind == "engine_busy"]
    assert {data["engine"] for data in busy} == {engine.address}
    assert min(data["starts"] for data in busy) < INITIAL  # the starts in flight there lowered
    store.close()


def test_the_starts_in_flight_halve_once_a_round_when_slow_and_grow_when_quick() -> None:
    admission = Admission(slow=START_SLOW_SECS[1], initial=8.0)
    with pytest.raises(requests.ReadTimeout), ExitStack() as starts:
        for _ in range(3):  # three starts in flight, none answered in time: one round
            starts.enter_context(admission.start())
        raise requests.ReadTimeout("read timed out")
    assert (admission.limit, admission.in_flight) == (4.0, 0)  # halved once, not thrice
    with admission.start():  # answered at once
        pass
    assert admission.limit == 4.25
    with pytest.raises(requests.ReadTimeout), admission.start():  # a new round
        raise requests.ReadTimeout("read timed out")
    assert admission.limit == 4.25 / 2
    with pytest.raises(ValueError), admission.start():  # the start's own failure: not slow
        raise ValueError("no such image")
    assert admission.limit == 4.25 / 2 + 1 / (4.25 / 2)
