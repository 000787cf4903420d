"""The events table read back: a trial's story (`hemra show`), the runs waiting for an engine
now and what an engine kept that HEMRA could not remove (`hemra runs`, the viewer)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence

from sqlalchemy import and_, exists, select

from pytest_hemra.core.events import (
    ENGINE_DOWN,
    ENGINE_KEPT,
    ENGINE_WAIT_ENDS,
    EngineWait,
    EventRecord,
)
from pytest_hemra.core.lifecycle import JobState
from pytest_hemra.store.base import StoreBase
from pytest_hemra.store.owner import is_alive
from pytest_hemra.store.schema import events, jobs


class EventStore(StoreBase):
    def events(self, trials: Sequence[str]) -> list[EventRecord]:
        """Every event of these trials, oldest first."""
        e = events.c
        query = select(e.id, e.run_id, e.trial_id, e.at, e.kind, e.data)
        query = query.where(e.trial_id.in_(list(trials))).order_by(e.id)
        with self._reading() as db:
            rows = db.execute(query).all()
        return [
            EventRecord(
                id=row.id,
                run_id=row.run_id,
                trial_id=row.trial_id,
                at=row.at,
                kind=row.kind,
                data=json.loads(row.data),
            )
            for row in rows
        ]

    def engine_kept(self) -> dict[str, str]:
        """What an engine kept that HEMRA could not remove, as the last runner to start found
        it (each name with what to do); empty when it found nothing, or none said."""
        e = events.c
        query = select(e.data).where(e.kind == ENGINE_KEPT).order_by(e.id.desc()).limit(1)
        with self._reading() as db:
            data = db.execute(query).scalar_one_or_none()
        return dict(json.loads(data).get("stuck") or {}) if data else {}

    def engine_waits(
        self, run_id: str | None = None, alive: Callable[[str | None], bool] = is_alive
    ) -> dict[str, list[EngineWait]]:
        """Runs (all, or `run_id`) with trials waiting for their engine now, by run: a trial
        whose last engine event is `engine_down` and whose runner still holds its job."""
        now = time.time()
        down, later, j = events.alias("e"), events.alias("later"), jobs.c
        ended = exists().where(
            later.c.trial_id == down.c.trial_id,
            later.c.kind.in_(list(ENGINE_WAIT_ENDS)),
            later.c.id > down.c.id,
        )
        again = events.alias("again")
        down_again = exists().where(
            again.c.trial_id == down.c.trial_id,
            again.c.kind == down.c.kind,
            again.c.id > down.c.id,
        )
        query = (
            select(down.c.run_id, down.c.at, down.c.data, j.lease_owner, j.lease_expires)
            .select_from(down.join(jobs, j.id == down.c.trial_id))
            .where(and_(down.c.kind == ENGINE_DOWN, j.state.in_(JobState.LIVE)))
            .where(~ended, ~down_again)
            .order_by(down.c.id)
        )
        if run_id is not None:
            query = query.where(down.c.run_id == run_id)
        with self._reading() as db:
            rows = db.execute(query).all()
        found: dict[str, dict[str, EngineWait]] = {}
        for row in rows:
            if (row.lease_expires or 0) < now or not alive(row.lease_owner):
                continue  # its runner is gone: the trial is not waiting, it is stale
            detail = json.loads(row.data or "{}")
            engine = str(detail.get("engine") or "docker")
            waits = found.setdefault(row.run_id, {})
            seen = waits.get(engine)
            waits[engine] = EngineWait(
                engine,
                row.at if seen is None else min(seen.since, row.at),
                1 if seen is None else seen.trials + 1,
                detail.get("error"),
            )
        return {run: list(waits.values()) for run, waits in found.items()}
