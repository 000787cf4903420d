"""The events table read back: a trial's story (`hemra show`) and the runs waiting for an engine
now (`hemra runs`, the viewer)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence

from pytest_hemra.core.events import (
    ENGINE_DOWN,
    ENGINE_WAIT_ENDS,
    EngineWait,
    EventRecord,
)
from pytest_hemra.core.lifecycle import JobState, sql_list
from pytest_hemra.store.base import StoreBase
from pytest_hemra.store.owner import is_alive


class EventStore(StoreBase):
    def events(self, trials: Sequence[str]) -> list[EventRecord]:
        """Every event of these trials, oldest first."""
        rows = self.db.execute(
            "SELECT id, run_id, trial_id, at, kind, data FROM events"
            " WHERE trial_id IN (SELECT value FROM json_each(?)) ORDER BY id",
            [json.dumps(list(trials))],
        )
        return [
            EventRecord(id=i, run_id=run, trial_id=trial, at=at, kind=kind, data=json.loads(data))
            for i, run, trial, at, kind, data in rows
        ]

    def engine_waits(
        self, run_id: str | None = None, alive: Callable[[str | None], bool] = is_alive
    ) -> dict[str, list[EngineWait]]:
        """Runs (all, or `run_id`) with trials waiting for their engine now, by run: a trial
        whose last engine event is `engine_down` and whose runner still holds its job."""
        now = time.time()
        rows = self.db.execute(
            "SELECT e.run_id, e.at, e.data, j.lease_owner, j.lease_expires FROM events e"
            " JOIN jobs j ON j.id = e.trial_id"
            f" WHERE e.kind = ? AND j.state IN {sql_list(JobState.LIVE)}"
            " AND (CAST(? AS TEXT) IS NULL OR e.run_id = ?)"
            " AND NOT EXISTS (SELECT 1 FROM events l WHERE l.trial_id = e.trial_id"
            "  AND l.kind IN (SELECT value FROM json_each(?)) AND l.id > e.id)"
            " AND NOT EXISTS (SELECT 1 FROM events d WHERE d.trial_id = e.trial_id"
            "  AND d.kind = e.kind AND d.id > e.id)"
            " ORDER BY e.id",
            [ENGINE_DOWN, run_id, run_id, json.dumps(ENGINE_WAIT_ENDS)],
        ).fetchall()
        found: dict[str, dict[str, EngineWait]] = {}
        for run, at, data, owner, expires in rows:
            if (expires or 0) < now or not alive(owner):
                continue  # its runner is gone: the trial is not waiting, it is stale
            detail = json.loads(data or "{}")
            engine = str(detail.get("engine") or "docker")
            waits = found.setdefault(run, {})
            seen = waits.get(engine)
            waits[engine] = EngineWait(
                engine,
                at if seen is None else min(seen.since, at),
                1 if seen is None else seen.trials + 1,
                detail.get("error"),
            )
        return {run: list(waits.values()) for run, waits in found.items()}
