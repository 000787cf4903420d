"""The store (a SQLite file in WAL mode, or a PostgreSQL database): runs, trials, jobs, calls and
events. The only package that speaks SQL, written once for both through SQLAlchemy Core.

Every process talks through it: the pytest controller, xdist workers, the CLI. A run, its
resolved spec and every planned trial and job are written in one transaction.
"""

from __future__ import annotations

from pytest_hemra.store.events import EventStore
from pytest_hemra.store.placements import PlacementStore
from pytest_hemra.store.queue import QueueStore
from pytest_hemra.store.schema import OLDEST_MIGRATED, SCHEMA_VERSION, metadata, trial_id
from pytest_hemra.store.shared import SharedBoard, SharedJobStore
from pytest_hemra.store.snapshots import SnapshotStore


class Store(QueueStore, PlacementStore, SharedJobStore, EventStore, SnapshotStore):
    """A handle on one store; cheap to open, one per process, closed by `close` or as a context
    manager (`with Store(path) as store:`). Only this package speaks SQL: `schema` (tables,
    versions, rows to records), `base` (opening, migrating, transactions), `migrations` (a
    step per schema version), `dialect` (what differs between SQLite and PostgreSQL),
    `results` (runs, trials, results, calls), `queue` (jobs, leases), `placements` (engine
    slots), `shared` (jobs a harness kind runs for several trials, and their claims),
    `events` (a trial's story, runs waiting for an engine), `snapshots` (reports kept as
    they were built)."""


__all__ = ["OLDEST_MIGRATED", "SCHEMA_VERSION", "SharedBoard", "Store", "metadata", "trial_id"]
