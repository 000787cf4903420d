"""Retries after infrastructure errors run as many at once as first attempts (run/lanes.py): a
lane whose trial failed queues its retry on the lanes at once, where before each retry ran on
the thread of the item that reported it, one after another, which without pytest-xdist is
pytest's main loop."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import TaskMaker
from pytest_hemra.store import Store
from tests.test_runs import FLAKY_CONFTEST

TASKS = ("one", "two", "three", "four")
AGENT_SECS = 4  # each retry's agent sleeps this long: four retries one after another never overlap


@pytest.mark.slow
@pytest.mark.usefixtures("docker_test")
def test_the_retries_of_trials_whose_first_attempts_all_failed_run_at_once(
    pytester: pytest.Pytester,
    tmp_path: Path,
    make_task: TaskMaker,
    write_harness: Callable[[str, str], Path],
) -> None:
    # every trial's first row (seqs 0-3: a retry is a new row) refused its container
    first_rows = f'int(request.labels["hemra.trial"].rpartition(".")[2]) < {len(TASKS)}'
    pytester.makeconftest(FLAKY_CONFTEST.replace("FlakyProvider.starts % 2 == 1", first_rows))
    for name in TASKS:
        make_task(name)
    write_harness(
        "sleeper",
        'kind = "program"\n'
        f'command = ["bash", "-c", "sleep {AGENT_SECS}; echo hi > /app/out.txt"]\n',
    )
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        f'harnesses = ["sleeper"]\ndatasets = ["ds"]\nmax_infra_retries = 1\n'
        f"concurrency = {len(TASKS)}\n"
        '[sandbox]\nprovider = "flaky"\n'
    )

    result = pytester.runpytest("--hemra-run", str(run_file))

    result.assert_outcomes(passed=len(TASKS))
    assert result.parseoutcomes()["rerun"] == len(TASKS)  # each first attempt reported, once
    store = Store(pytester.path / ".hemra" / "hemra.db")
    (run,) = store.runs()
    retries = store.trials(run.id)
    assert sorted(t.task for t in retries) == sorted(TASKS)
    assert [t.retries for t in retries] == [1] * len(TASKS)
    replaced = [t for t in store.trials(run.id, history=True) if t.status == "replaced"]
    assert sorted(t.id for t in replaced) == sorted(t.replaces or "" for t in retries)
    assert all(t.outcome == "infra_error" for t in replaced)
    details = [store.trial_detail(t.id) for t in retries]
    starts = [d.started_at for d in details]
    finishes = [d.finished_at for d in details]
    assert None not in starts and None not in finishes
    # every retry started before any finished: they ran at once
    assert max(s for s in starts if s is not None) < min(f for f in finishes if f is not None)
    store.close()
