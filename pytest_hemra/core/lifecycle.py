"""Where a trial, its job and its run stand: `TrialStatus`, `JobState`, `RunStatus`, and the
groups code reads them through.

`StrEnum`s, so a stored state is its plain string (`"running"`) and compares equal to it: the
store's columns, JSON and printed tables hold the same words as before the types. Groups are
tuples, in the enum's order, so SQL built from them (`sql_list`) reads the same every time.

| type          | column          | values                                                        |
|---------------|-----------------|---------------------------------------------------------------|
| `TrialStatus` | `trials.status` | planned, running, finished, cancelled, deselected, replaced   |
| `JobState`    | `jobs.state`    | queued, leased, cancelling, cancelled, done, deselected,      |
|               |                 | replaced                                                      |
| `RunStatus`   | `runs.status`   | recorded, queued, running, cancelled, interrupted, finished   |

A trial's outcome (`Outcome`) is another thing: a cancelled trial has status `cancelled` and
outcome `cancelled`, one word in two types.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import ClassVar, Final


class TrialStatus(StrEnum):
    PLANNED = "planned"  # recorded, its job not claimed yet
    RUNNING = "running"  # its job leased to a runner
    FINISHED = "finished"  # a result stored (any outcome but cancelled)
    CANCELLED = "cancelled"  # stopped or never started: outcome cancelled, never failed
    DESELECTED = "deselected"  # left out by pytest's -k or -m: never run, never scored
    REPLACED = "replaced"  # run again under a new row (a retry, a resume): not current

    UNFINISHED: ClassVar[tuple[TrialStatus, ...]]
    WITHOUT_OUTCOME: ClassVar[tuple[TrialStatus, ...]]
    OVER: ClassVar[tuple[TrialStatus, ...]]


# a run is over when none of its current trials is in `UNFINISHED`
TrialStatus.UNFINISHED = (TrialStatus.PLANNED, TrialStatus.RUNNING)
# what a trial shows while it has no outcome (a filter on outcome names these statuses too)
TrialStatus.WITHOUT_OUTCOME = (TrialStatus.PLANNED, TrialStatus.RUNNING, TrialStatus.DESELECTED)
# it has an outcome: a result, or cancelled
TrialStatus.OVER = (TrialStatus.FINISHED, TrialStatus.CANCELLED)


class JobState(StrEnum):
    QUEUED = "queued"  # waiting for a runner to claim it
    LEASED = "leased"  # a runner holds it, renewing its lease by heartbeat
    CANCELLING = "cancelling"  # still held, its runner asked to stop (`hemra cancel`)
    CANCELLED = "cancelled"
    DONE = "done"  # its trial's result stored
    DESELECTED = "deselected"
    REPLACED = "replaced"

    LIVE: ClassVar[tuple[JobState, ...]]
    OPEN: ClassVar[tuple[JobState, ...]]


# held by a runner: what a heartbeat renews and a stale runner's trials are found by
JobState.LIVE = (JobState.LEASED, JobState.CANCELLING)
# not ended: what cancelling a trial may still cancel
JobState.OPEN = (JobState.QUEUED, *JobState.LIVE)

# what `claim` returns for a job leased by another runner: a claim's answer, never stored
TAKEN: Final = "taken"


class RunStatus(StrEnum):
    RECORDED = "recorded"  # planned by the session that will run it
    QUEUED = "queued"  # planned detached, for `hemra serve` to work
    RUNNING = "running"  # a trial of it claimed
    CANCELLED = "cancelled"  # `hemra cancel`; reopened by `--hemra-resume-cancelled`
    # its session stopped (Ctrl-C) with trials left, which it recorded cancelled; reopened by
    # `--hemra-resume`, which runs them: cancelled by the interrupt, not by anyone's choice
    INTERRUPTED = "interrupted"
    FINISHED = "finished"  # no current trial left unfinished

    OPEN: ClassVar[tuple[RunStatus, ...]]
    CLOSED: ClassVar[tuple[RunStatus, ...]]
    STOPPED: ClassVar[tuple[RunStatus, ...]]


RunStatus.OPEN = (RunStatus.RECORDED, RunStatus.QUEUED, RunStatus.RUNNING)
RunStatus.CLOSED = (RunStatus.CANCELLED, RunStatus.INTERRUPTED, RunStatus.FINISHED)
# stopped before its end: a trial's row is not leased, and the run not finished, in one of these
RunStatus.STOPPED = (RunStatus.CANCELLED, RunStatus.INTERRUPTED)

# what a running run shows while trials of it wait for their engine: shown, never stored
RUN_WAITING: Final = "waiting"


def sql_list(states: Iterable[StrEnum]) -> str:
    """States as an SQL list of literals, `('planned', 'running')`, for `IN` in query text."""
    return "(" + ", ".join(f"'{state}'" for state in states) + ")"
