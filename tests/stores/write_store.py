"""Writes a small store with whichever HEMRA is first on the path: run with PYTHONPATH at an
older version's worktree, it makes the store that version wrote (`make_dumps.py` runs it for each
schema version and dumps the result into `schema-N.sql`; `test_store_migrations.py` reads them).

    python tests/stores/write_store.py ADDRESS    # a SQLite file or a postgresql:// URL

A run of four trials: one passed, one an infrastructure error of an engine outage (the cause
kept in `error_class` before schema 12), one failed with a SWE class, one still planned.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Any

try:
    from pytest_hemra.core.records import PlannedTrial
except ImportError:  # before the core/ package (schema 5 and older)
    from pytest_hemra.records import PlannedTrial  # type: ignore[no-redef]
from pytest_hemra.store import Store

RUN_ID = "20260101-000000-0abc"
TRIALS = [
    PlannedTrial("ds", "alpha", "oracle", 1),
    PlannedTrial("ds", "alpha", "nop", 1),
    PlannedTrial("ds", "beta", "oracle", 1),
    PlannedTrial("ds", "beta", "nop", 1),
]
USAGE = {
    "calls": 2,
    "input_tokens": 100,
    "output_tokens": 20,
    "cache_read_tokens": 30,
    "cache_write_tokens": 0,
    "cost": 0.5,
    "usage_unknown": 0,
    "models": ["model-a"],
    "other_model_tokens": 0,
    "stopped_by": None,
}


def result(outcome: str, reward: float | None, **more: Any) -> dict[str, Any]:
    """A result as every version's `finish_trial` took it (each reads the keys it knows)."""
    return {
        "outcome": outcome,
        "reward": reward,
        "rewards": {} if reward is None else {"reward": reward},
        "exit_code": 0,
        "error": None,
        "started_at": 1767225600.0,
        "finished_at": 1767225660.0,
        "duration": 60.0,
        "phases": {"agent": 45.0, "verify": 15.0},
        "trial_dir": "ds/alpha/oracle-1",
        "usage": USAGE,
        "own_report": {"input_tokens": 100, "output_tokens": 20, "turns": 3},
        "judgments": [],
        "steps": [],
        "error_class": None,
        "agent_user": "0:0 (root, image)",
        "kept_processes": False,
        **more,
    }


def typed(store: Store, finished: dict[str, Any]) -> Any:
    """The result as this version's `finish_trial` takes it: a dict up to schema 11, a typed
    `TrialResult` from 12 (the cause apart from the SWE track's class)."""
    if "TrialResult" not in str(inspect.signature(store.finish_trial).parameters["result"]):
        return finished
    from pytest_hemra.core.outcome import Cause, SweClass
    from pytest_hemra.core.trial import SelfReport, TrialResult, TrialUsage

    fields = dict(finished)
    error_class = fields.pop("error_class")
    fields["usage"] = TrialUsage(**fields["usage"])
    fields["own_report"] = SelfReport(**fields["own_report"])
    if error_class in {str(cause) for cause in Cause}:
        fields["cause"] = Cause(error_class)
    elif error_class is not None:
        fields["swe_class"] = SweClass(error_class)
    return TrialResult(**fields)


def main() -> None:
    address = sys.argv[1]
    store = Store(address if address.startswith("postgresql:") else Path(address))
    spec = {"name": "old-run", "attempts": 1, "harnesses": {"oracle": {}, "nop": {}}}
    store.record_plan(RUN_ID, "old-run", spec, Path("/srv/trials"), TRIALS)
    passed, outage, failed, _planned = (t.id for t in store.trials(RUN_ID))
    for trial, finished in (
        (passed, result("pass", 1.0)),
        (outage, result("infra_error", None, error="engine down", error_class="engine_outage")),
        (failed, result("fail", 0.0, exit_code=1, error_class="partial")),
    ):
        if hasattr(store, "claim"):
            store.claim(trial, "main@old-host:1", 600.0)
        else:  # schema 2: no queue yet
            store.start_trial(trial, "main@old-host:1")
        store.finish_trial(trial, typed(store, finished))
    store.close()


if __name__ == "__main__":
    main()
