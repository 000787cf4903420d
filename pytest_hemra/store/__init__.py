"""The SQLite store (WAL): runs, trials, jobs, calls and events. The only module that speaks SQL.

Every process talks through it: the pytest controller, xdist workers, the CLI. A run, its
resolved spec and every planned trial and job are written in one transaction.
"""

from __future__ import annotations

from pytest_hemra.store.events import EventStore
from pytest_hemra.store.queue import QueueStore
from pytest_hemra.store.schema import OLDEST_MIGRATED, SCHEMA, SCHEMA_VERSION, trial_id
from pytest_hemra.store.shared import SharedBoard, SharedJobStore


class Store(QueueStore, SharedJobStore, EventStore):
    """A handle on one store file; cheap to open, one per process. Only this package speaks
    SQL: `schema` (tables, versions, rows to records), `base` (opening, migrating,
    transactions), `results` (runs, trials, results, calls), `queue` (jobs, leases, engines),
    `shared` (jobs a harness kind runs for several trials, and their claims), `events` (a
    trial's story, runs waiting for an engine)."""


__all__ = ["OLDEST_MIGRATED", "SCHEMA", "SCHEMA_VERSION", "SharedBoard", "Store", "trial_id"]
