"""The store's `events`: what happened to a run and its trials besides their results, as the
store keeps it, `hemra show` prints it and `hemra runs` and the viewer read it.

Kinds a runner writes while it waits out an outage (docs/runs.md, "Faults"):

| kind          | data                                   | when                                    |
|---------------|----------------------------------------|-----------------------------------------|
| `engine_down` | engine, error                          | a trial's engine stopped answering      |
| `engine_back` | engine, waited, removed                | ... answered again (leftovers removed)  |
| `engine_gone` | engine, waited, error                  | ... not within HEMRA_ENGINE_GIVE_UP_SECS|
| `engine_busy` | engine, starts, error                  | answering pings, it did not answer a    |
|               |                                        | start in time: `starts` in flight now   |
| `store_wait`  | waited, error                          | a store write waited for space or lock  |
| `engine_kept` | stuck: {object: what to do}            | a runner's start: what its engine (and  |
|               |                                        | the host's firewall) kept that HEMRA    |
|               |                                        | could not remove (or none)              |
| `rerun`       | replaces, cause                        | run again without using up a retry      |
| `retry`       | replaces                               | run again for its own infra_error       |

Also `recorded`, `finished`, `cancel`, `resume` and `migrated`, written by the store itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ENGINE_DOWN = "engine_down"
ENGINE_BACK = "engine_back"
ENGINE_GONE = "engine_gone"
ENGINE_BUSY = "engine_busy"
STORE_WAIT = "store_wait"
ENGINE_KEPT = "engine_kept"  # the last one says what the engine holds that HEMRA cannot remove
RERUN = "rerun"
RETRY = "retry"
# written by the store itself
RECORDED = "recorded"  # a run's plan recorded
FINISHED = "finished"  # a trial's result stored
CANCEL = "cancel"  # `hemra cancel` asked a run to stop
RESUME = "resume"  # a trial run again under a new row, resumed
ENGINE_WAIT_ENDS = (ENGINE_BACK, ENGINE_GONE)


@dataclass(frozen=True)
class EventRecord:
    id: int
    run_id: str | None
    trial_id: str | None
    at: float
    kind: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineWait:
    """A run's trials waiting for an engine now: which engine, since when, and how many."""

    engine: str
    since: float
    trials: int
    error: str | None = None
