"""Reports kept as they were built: a run's report (JSON) with the key of what it was built from,
so that reading it again costs one row, not every trial (`report/snapshot.py` decides when)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import func, select

from pytest_hemra.store import dialect
from pytest_hemra.store.base import StoreBase
from pytest_hemra.store.schema import reports, trials


@dataclass(frozen=True)
class StoredReport:
    key: str
    body: str  # the report as JSON
    made_at: float


class SnapshotStore(StoreBase):
    def trials_key(self, run_id: str) -> str:
        """What a run's trial rows are now, in a few characters: their count and the sum of their
        revisions (drawn afresh at every write of a row, `schema.fresh_revision`), so it changes
        with any insert or update of the run's trials, whoever makes it."""
        t = trials.c
        query = select(func.count(), func.coalesce(func.sum(t.revision), 0)).where(
            t.run_id == run_id
        )
        with self._reading() as db:
            count, total = db.execute(query).one()
        return f"{count}:{total}"

    def stored_report(self, run_id: str) -> StoredReport | None:
        r = reports.c
        with self._reading() as db:
            row = db.execute(select(r.key, r.body, r.made_at).where(r.run_id == run_id)).first()
        return None if row is None else StoredReport(row.key, row.body, row.made_at)

    def store_report(self, run_id: str, key: str, body: str) -> None:
        """Keep a run's report (the one kept before replaced)."""
        values = {"run_id": run_id, "key": key, "body": body, "made_at": time.time()}
        with self._transaction() as tx:
            dialect.upsert(tx, reports, values, ["run_id"], update=True)
