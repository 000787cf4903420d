"""Engine slots: which trial is placed on which engine of a pool, counted across every run of the
store (`[[sandbox.engines]]`, docs/scaling.md)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from sqlalchemy import delete, func, select, update

from pytest_hemra.core.lifecycle import JobState
from pytest_hemra.core.records import EngineSlot
from pytest_hemra.store import dialect
from pytest_hemra.store.base import StoreBase
from pytest_hemra.store.schema import jobs, placements, trials

J, T = jobs.c, trials.c


class PlacementStore(StoreBase):
    """Trials placed on engines, a slot each, for as long as their sandboxes live."""

    def claim_engine(
        self,
        trial: str,
        owner: str,
        slots: Sequence[EngineSlot],
        is_alive: Callable[[str], bool],
    ) -> EngineSlot | None:
        """Place a running trial on one of `slots` with a free slot: one that holds the trial's
        image first, then the least loaded (by share of its capacity), then the first listed;
        None when every one is full.

        One write transaction, so runners placing at once never fill an engine past its
        capacity; slots are counted by address across every run of the store. A placement ends
        with `release_engine`, or when its trial's runner is gone (lease expired, process dead).
        """
        now = time.time()
        p = placements.c
        with self._transaction() as tx:
            dialect.lock(tx, "hemra placements")  # the count and the place, as one
            held = tx.execute(
                select(p.trial_id, p.owner, J.state, J.lease_expires).select_from(
                    placements.outerjoin(jobs, J.id == p.trial_id)
                )
            ).all()
            gone = [
                row.trial_id
                for row in held
                if row.state not in JobState.LIVE
                or (row.lease_expires or 0) < now
                or not is_alive(row.owner)
            ]
            if gone:
                tx.execute(delete(placements).where(p.trial_id.in_(gone)))
            counted = tx.execute(
                select(p.address, func.count().label("n"))
                .where(p.trial_id != trial)
                .group_by(p.address)
            ).all()
            load = {row.address: int(row.n) for row in counted}
            free = [slot for slot in slots if load.get(slot.address, 0) < slot.capacity]
            if not free:
                return None
            listed = {slot.address: index for index, slot in enumerate(slots)}
            chosen = min(
                free,
                key=lambda slot: (
                    not slot.has_image,
                    load.get(slot.address, 0) / slot.capacity,
                    listed[slot.address],
                ),
            )
            run_id = tx.execute(select(T.run_id).where(T.id == trial)).scalar()
            dialect.upsert(
                tx,
                placements,
                {
                    "trial_id": trial,
                    "run_id": run_id,
                    "engine": chosen.name,
                    "address": chosen.address,
                    "owner": owner,
                    "at": now,
                },
                ["trial_id"],
                update=True,
            )
            tx.execute(update(trials).where(T.id == trial).values(engine=chosen.name))
        return chosen

    def release_engine(self, trial: str) -> None:
        """A trial's engine slot is free again (its sandbox is gone)."""
        with self._transaction() as tx:
            tx.execute(delete(placements).where(placements.c.trial_id == trial))

    def engine_load(self) -> dict[str, int]:
        """Trials placed on each engine address right now (as the store counts slots)."""
        p = placements.c
        query = select(p.address, func.count().label("n")).group_by(p.address)
        with self._reading() as db:
            return {row.address: int(row.n) for row in db.execute(query)}
