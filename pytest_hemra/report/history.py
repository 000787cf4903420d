"""A trial's history as `hemra show` prints it: the rows that ran it before (retries, reruns,
resumes), each with why it ended, and the events of them all, so an engine outage or a store
that could not be written tells itself apart from the trial's own infrastructure fault."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pytest_hemra.core import events
from pytest_hemra.core.events import EventRecord
from pytest_hemra.core.outcome import Cause
from pytest_hemra.core.records import TrialRecord
from pytest_hemra.core.words import plural
from pytest_hemra.store import Store


def trial_history(store: Store, trial: TrialRecord) -> list[str]:
    """Lines (indented two spaces) for the trial's earlier rows and its and their events;
    none for a trial that ran once and met no outage."""
    rows = [trial]
    while rows[0].replaces is not None:
        rows.insert(0, store.trial(rows[0].replaces))
    told = [e for e in store.events([r.id for r in rows]) if e.kind in DESCRIBED]
    lines: list[str] = []
    if len(rows) > 1:
        lines.append("  attempts: " + " -> ".join(_attempt(row) for row in rows))
    if told:
        lines.append("  events:")
        lines += [f"    {_event(event)}" for event in told]
    return lines


def _attempt(row: TrialRecord) -> str:
    short = row.id.rsplit(".", 1)[-1]
    ended = str(row.outcome or row.status)
    if row.cause in Cause.WAITED_OUT:
        return f"{short} {ended} ({row.cause}: waited out, no retry used)"
    if row.cause == Cause.ENGINE_GONE:
        return f"{short} {ended} ({row.cause}: given up, not run again here)"
    if row.outcome == "infra_error":
        return f"{short} {ended} (its own fault: a retry used)"
    return f"{short} {ended}"


def _event(event: EventRecord) -> str:
    at = time.strftime("%H:%M:%S", time.localtime(event.at)) + f".{int(event.at * 10) % 10}"
    short = (event.trial_id or "").rsplit(".", 1)[-1]
    return f"{at} {short} {event.kind}: {DESCRIBED[event.kind](event.data)}"


def _secs(data: dict[str, Any]) -> float:
    return float(data.get("waited") or 0)


DESCRIBED: dict[str, Callable[[dict[str, Any]], str]] = {
    events.ENGINE_DOWN: lambda d: f"engine {d.get('engine')} does not answer ({d.get('error')})",
    events.ENGINE_BACK: lambda d: (
        f"engine {d.get('engine')} answers again after {_secs(d):.1f}s;"
        f" {plural(d.get('removed', 0), 'sandbox', 'sandboxes')} it left removed"
    ),
    events.ENGINE_GONE: lambda d: (
        f"engine {d.get('engine')} did not answer for {_secs(d):.0f}s: given up ({d.get('error')})"
    ),
    events.STORE_WAIT: lambda d: f"a store write waited {_secs(d):.1f}s ({d.get('error')})",
    events.RERUN: lambda d: (
        f"runs again after {d.get('cause')} (replaces {d.get('replaces')}), no retry used"
    ),
    events.RETRY: lambda d: f"retried after its own infra_error (replaces {d.get('replaces')})",
}
