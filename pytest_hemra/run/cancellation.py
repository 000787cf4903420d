"""Cancelling a run, as `hemra cancel` and the viewer's cancel action both do it.

Queued trials are cancelled at once; running ones are asked to stop (their runner's heartbeat
sees it within a second) and their sandboxes are removed; after `wait` seconds, trials whose
runner did not answer are cancelled outright. Cancelled is never failed. An engine that does
not answer keeps its sandboxes until it does: a runner that reaches it again removes them (so
does `hemra cancel` run again).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pytest_hemra.core.errors import InfraError
from pytest_hemra.core.lifecycle import JobState, TrialStatus
from pytest_hemra.execute.sandbox import SandboxProvider
from pytest_hemra.execute.sandbox.health import is_engine_fault
from pytest_hemra.store import Store
from pytest_hemra.store.owner import is_alive


@dataclass(frozen=True)
class Cancellation:
    run_id: str
    cancelled: int  # trials recorded cancelled, whether at once or after their runner answered
    removed: int  # sandboxes removed
    sandbox_error: str | None  # why the sandboxes could not be removed; the store is cancelled
    engine_down: bool = False  # ... because the engine did not answer: removed when it is back


def cancel_run(store: Store, run_id: str, provider: SandboxProvider, wait: float) -> Cancellation:
    """Cancel the run in the store, then remove its sandboxes. Trials finishing meanwhile, and
    sandboxes their own teardown removes first, are no error."""
    cancelled, asked = store.cancel_run(run_id, is_alive)
    removed, sandbox_error, engine_down = 0, None, False
    try:
        removed = provider.remove_sandboxes({"hemra.run": run_id})
    except InfraError as error:
        sandbox_error, engine_down = str(error), is_engine_fault(error)
    deadline = time.monotonic() + wait
    while store.job_counts(run_id).get(JobState.CANCELLING) and time.monotonic() < deadline:
        time.sleep(0.2)
    stuck = [
        t.id
        for t in store.trials(run_id)
        if t.status == TrialStatus.RUNNING and store.job_state(t.id) == JobState.CANCELLING
    ]
    cancelled += store.cancel_trials(stuck, "cancelled by hemra cancel (runner did not answer)")
    done = cancelled + asked - len(stuck)
    return Cancellation(run_id, done, removed, sandbox_error, engine_down)
