"""The store's file: opening (creating or migrating the schema), transactions, events.

A write that finds the store's disk full, or its lock held by another process for longer than
the timeout (`HEMRA_STORE_TIMEOUT_SECS`, 30 s), raises `StoreUnavailable`: the runner waits it
out (`run/outage.py`) rather than losing the write.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlite_utils

from pytest_hemra.core.backoff import seconds
from pytest_hemra.core.errors import StoreError, StoreUnavailable
from pytest_hemra.store.schema import (
    CURRENT,
    INDEXES,
    OLDEST_MIGRATED,
    SCHEMA,
    SCHEMA_VERSION,
)

TIMEOUT_SECS = ("HEMRA_STORE_TIMEOUT_SECS", 30.0)  # how long a write waits for another's lock
# what SQLite says when a write cannot be made for now (not a fault of the store itself)
UNAVAILABLE = ("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_FULL")


class StoreBase:
    """A handle on one store file; cheap to open. Each thread that uses it gets a connection
    of its own (opened on first use): a process running many trials at once on threads
    (`run/lanes.py`) shares one handle, and one thread's transaction never takes in another's
    writes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self.db.enable_wal()
        self._create_schema()

    @property
    def db(self) -> sqlite_utils.Database:
        """This thread's connection to the store."""
        db: sqlite_utils.Database | None = getattr(self._local, "db", None)
        if db is None:
            timeout = seconds(*TIMEOUT_SECS, os.environ)
            connection = sqlite3.connect(self.path, timeout=timeout, check_same_thread=False)
            with self._lock:
                self._connections.append(connection)
            db = self._local.db = sqlite_utils.Database(connection)
        return db

    def _create_schema(self) -> None:
        """Create the tables once, in a write transaction taken up front: a reader that
        upgraded to a writer while runners write would fail at once with 'database is locked'."""
        found = self._schema_version()
        if found is None:
            with self._transaction():
                for name, (columns, pk) in SCHEMA.items():
                    self.db.table(name).create(columns, pk=pk, if_not_exists=True)
                for table, indexed in INDEXES:
                    self.db.table(table).create_index(indexed, if_not_exists=True)
                self.db.execute(
                    "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)",
                    [str(SCHEMA_VERSION)],
                )
            found = self._schema_version()
        if found is not None and found.isdigit() and OLDEST_MIGRATED <= int(found) < SCHEMA_VERSION:
            self._migrate(int(found))
            found = self._schema_version()
        if found != str(SCHEMA_VERSION):
            raise StoreError(f"{self.path}: store schema {found}, expected {SCHEMA_VERSION}")
        self._add_missing_indexes()

    def _migrate(self, found: int) -> None:
        """Bring an older store forward in place: every change since schema 2 adds tables and
        columns (nothing is dropped or renamed), so old runs stay readable and resumable."""
        with self._transaction() as tx:
            for name, (columns, pk) in SCHEMA.items():
                table = self.db.table(name)
                if not table.exists():
                    table.create(columns, pk=pk)
                    continue
                present = {column.name for column in table.columns}
                for column, kind in columns.items():
                    if column not in present:
                        table.add_column(column, kind)
            tx.execute("UPDATE trials SET plan_seq = seq WHERE plan_seq IS NULL")
            tx.execute(
                "UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION)]
            )
            self._event_any(tx, "migrated", {"from": found, "to": SCHEMA_VERSION})

    def _add_missing_indexes(self) -> None:
        """Indexes added to INDEXES after a store was made are created once, on its next open;
        a store that has them all is only read."""
        names = {row[0] for row in self.db.execute("SELECT name FROM sqlite_master")}
        missing = [(t, c) for t, c in INDEXES if f"idx_{t}_{'_'.join(c)}" not in names]
        if missing:
            with contextlib.suppress(StoreUnavailable), self._transaction():
                for table, indexed in missing:  # else on the next open: an index is no data
                    self.db.table(table).create_index(indexed, if_not_exists=True)

    def _schema_version(self) -> str | None:
        try:
            row = self.db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        except sqlite3.OperationalError:  # no meta table yet
            return None
        return None if row is None else str(row[0])

    def close(self) -> None:
        """Close every thread's connection."""
        with self._lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            connection.close()
        self._local = threading.local()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction, all or nothing; `StoreUnavailable` when the disk is full or
        another process holds the lock past the timeout (nothing of it is written then)."""
        connection = self.db.conn
        try:
            connection.execute("BEGIN IMMEDIATE")
            try:
                yield connection
            except BaseException:
                connection.rollback()
                raise
            connection.commit()
        except sqlite3.OperationalError as error:
            if not is_unavailable(error):
                raise
            if connection.in_transaction:
                connection.rollback()
            raise StoreUnavailable(f"{self.path}: {error}") from error

    def _event(
        self,
        tx: sqlite3.Connection,
        run_id: str,
        trial: str | None,
        kind: str,
        data: dict[str, Any],
    ) -> None:
        tx.execute(
            "INSERT INTO events (run_id, trial_id, at, kind, data) VALUES (?, ?, ?, ?, ?)",
            [run_id, trial, time.time(), kind, json.dumps(data)],
        )

    def record_event(
        self, run_id: str | None, trial: str | None, kind: str, data: dict[str, Any]
    ) -> None:
        """An event of a run (and of one of its trials), in a transaction of its own."""
        with self._transaction() as tx:
            tx.execute(
                "INSERT INTO events (run_id, trial_id, at, kind, data) VALUES (?, ?, ?, ?, ?)",
                [run_id, trial, time.time(), kind, json.dumps(data)],
            )

    def _event_any(self, tx: sqlite3.Connection, kind: str, data: dict[str, Any]) -> None:
        """An event of the store itself, not of a run."""
        tx.execute(
            "INSERT INTO events (run_id, trial_id, at, kind, data) VALUES (NULL, NULL, ?, ?, ?)",
            [time.time(), kind, json.dumps(data)],
        )

    def _close_run(self, tx: sqlite3.Connection, run_id: str) -> None:
        """A run with no unfinished trial left is `finished` (or stays `cancelled`)."""
        tx.execute(
            "UPDATE runs SET status = 'finished' WHERE id = ? AND status != 'cancelled'"
            f" AND NOT EXISTS (SELECT 1 FROM trials WHERE run_id = ? AND {CURRENT}"
            " AND status IN ('planned', 'running'))",
            [run_id, run_id],
        )

    def count(self, table: str) -> int:
        if table not in SCHEMA:
            raise StoreError(f"{self.path}: no table {table!r}")
        return int(self.db.execute(f"SELECT count(*) FROM [{table}]").fetchone()[0])


def is_unavailable(error: sqlite3.Error) -> bool:
    """Whether SQLite refused a write for now: the disk full, or the lock held too long."""
    name = str(getattr(error, "sqlite_errorname", ""))
    text = str(error)
    return name.startswith(UNAVAILABLE) or any(
        words in text for words in ("database is locked", "database or disk is full")
    )
