"""The store's database: opening it (creating or migrating the schema), transactions, events.

A store is a SQLite file or a PostgreSQL database (`store/dialect.py` holds what differs). A
write that finds the store's disk full, its lock held by another process for longer than the
timeout (`HEMRA_STORE_TIMEOUT_SECS`, 30 s), or its server gone, raises `StoreUnavailable`: the
runner waits it out (`run/outage.py`) rather than losing the write.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from pytest_hemra.core.backoff import seconds
from pytest_hemra.core.errors import StoreError, StoreUnavailable
from pytest_hemra.core.lifecycle import RunStatus, TrialStatus, sql_list
from pytest_hemra.core.outcome import Cause, Outcome
from pytest_hemra.core.store_location import is_server_address, store_address
from pytest_hemra.store.dialect import (
    Connection,
    Dialect,
    Postgres,
    Reader,
    SQLite,
    index_name,
)
from pytest_hemra.store.schema import (
    CURRENT,
    INDEXES,
    OLDEST_MIGRATED,
    SCHEMA,
    SCHEMA_VERSION,
)

TIMEOUT_SECS = ("HEMRA_STORE_TIMEOUT_SECS", 30.0)  # how long a write waits for another's lock


class StoreBase:
    """A handle on one store; cheap to open. Each thread that uses it gets a connection of its
    own (opened on first use), so threads of one process share a handle.

    `address` is what opens the same store again, in this process or another: a SQLite file's
    absolute path, or a `postgresql://` URL (with its password, if it has one: never print it;
    `name` is the store as messages show it). `path` is the SQLite file, None on a server."""

    def __init__(self, address: str | Path) -> None:
        text = str(address)
        timeout = seconds(*TIMEOUT_SECS, os.environ)
        self.dialect: Dialect
        if is_server_address(text):
            self.address = store_address(text)
            self.path: Path | None = None
            self.dialect = Postgres(self.address, timeout)
        else:
            self.address = str(Path(text).absolute())
            self.path = Path(self.address)
            self.dialect = SQLite(self.path, timeout)
        self.name = self.dialect.name
        self.is_server = self.dialect.is_server
        try:
            self._create_schema()
        except BaseException:
            self.close()
            raise

    def _create_schema(self) -> None:
        """Create the tables once, in a write transaction taken up front: a reader that
        upgraded to a writer while runners write would fail at once with 'database is locked'.
        A schema from a newer HEMRA is refused before anything is written."""
        found = self._schema_version()
        if found is None:
            with self._transaction() as tx:
                self.dialect.lock(tx, "hemra schema")  # other processes creating it at once
                for name, (columns, pk) in SCHEMA.items():
                    self.dialect.create_table(tx, name, columns, pk)
                for table, indexed in INDEXES:
                    self.dialect.create_index(tx, table, indexed)
                tx.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', ?)"
                    " ON CONFLICT (key) DO NOTHING",
                    [str(SCHEMA_VERSION)],
                )
            found = self._schema_version()
        if found is not None and found.isdigit() and int(found) > SCHEMA_VERSION:
            raise StoreError(
                f"{self.name}: store schema {found} was written by a newer HEMRA (this one reads"
                f" schema {SCHEMA_VERSION}); upgrade pytest-hemra to use this store"
            )
        if found is not None and found.isdigit() and OLDEST_MIGRATED <= int(found) < SCHEMA_VERSION:
            self._migrate(int(found))
            found = self._schema_version()
        if found != str(SCHEMA_VERSION):
            raise StoreError(f"{self.name}: store schema {found}, expected {SCHEMA_VERSION}")
        self._add_missing_indexes()

    def _migrate(self, found: int) -> None:
        """Bring an older store forward in place: every change since schema 2 adds tables and
        columns (nothing is dropped or renamed), so old runs stay readable and resumable."""
        with self._transaction() as tx:
            self.dialect.lock(tx, "hemra schema")
            present = self.dialect.tables()
            for name, (columns, pk) in SCHEMA.items():
                if name not in present:
                    self.dialect.create_table(tx, name, columns, pk)
                    continue
                for column, kind in columns.items():
                    if column not in present[name]:
                        self.dialect.add_column(tx, name, column, kind)
            tx.execute("UPDATE trials SET plan_seq = seq WHERE plan_seq IS NULL")
            if found < 12:  # causes were kept in error_class, beside the SWE classes
                causes = [str(cause) for cause in Cause if cause != Cause.TAMPERED]
                tx.execute(
                    "UPDATE trials SET cause = error_class, error_class = NULL"
                    " WHERE error_class IN (SELECT value FROM json_each(?))",
                    [json.dumps(causes)],
                )
                tx.execute(  # a reward cheat's class (a SWE trial's tampered stays its class)
                    "UPDATE trials SET cause = error_class WHERE error_class = ?"
                    " AND outcome = ?",
                    [str(Cause.TAMPERED), str(Outcome.TAMPERED)],
                )
            tx.execute(
                "UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION)]
            )
            self._event_any(tx, "migrated", {"from": found, "to": SCHEMA_VERSION})

    def _add_missing_indexes(self) -> None:
        """Indexes added to INDEXES after a store was made are created once, on its next open;
        a store that has them all is only read."""
        names = self.dialect.index_names()
        missing = [(t, c) for t, c in INDEXES if index_name(t, c) not in names]
        if missing:
            with contextlib.suppress(StoreUnavailable), self._transaction() as tx:
                for table, indexed in missing:  # else on the next open: an index is no data
                    self.dialect.create_index(tx, table, indexed)

    def _schema_version(self) -> str | None:
        try:
            row = self.db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        except self.dialect.missing_table:  # no meta table yet
            return None
        return None if row is None else str(row[0])

    @property
    def db(self) -> Reader:
        """This thread's connection to the store, for reads (sqlite_utils' `Database` on
        SQLite)."""
        return self.dialect.db

    def close(self) -> None:
        """Close every thread's connection."""
        self.dialect.close()

    def _transaction(self) -> contextlib.AbstractContextManager[Connection]:
        """A write transaction, all or nothing; `StoreUnavailable` when it cannot be made for
        now (nothing of it is written then)."""
        return self.dialect.transaction()

    def _event(
        self,
        tx: Connection,
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

    def _event_any(self, tx: Connection, kind: str, data: dict[str, Any]) -> None:
        """An event of the store itself, not of a run."""
        tx.execute(
            "INSERT INTO events (run_id, trial_id, at, kind, data) VALUES (NULL, NULL, ?, ?, ?)",
            [time.time(), kind, json.dumps(data)],
        )

    def _close_run(self, tx: Connection, run_id: str) -> None:
        """A run with no unfinished trial left is `finished` (or stays `cancelled`). Its row
        is locked first on a server: two trials finishing at once would each see the other
        unfinished, and neither close the run."""
        self.dialect.lock_row(tx, "runs", run_id)
        tx.execute(
            f"UPDATE runs SET status = '{RunStatus.FINISHED}' WHERE id = ?"
            f" AND status != '{RunStatus.CANCELLED}'"
            f" AND NOT EXISTS (SELECT 1 FROM trials WHERE run_id = ? AND {CURRENT}"
            f" AND status IN {sql_list(TrialStatus.UNFINISHED)})",
            [run_id, run_id],
        )

    def count(self, table: str) -> int:
        if table not in SCHEMA:
            raise StoreError(f"{self.name}: no table {table!r}")
        return int(self.db.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0])
