"""The store's database: opening it (creating or migrating the schema), transactions, events.

A store is a SQLite file or a PostgreSQL database, reached through one SQLAlchemy engine
(`store/dialect.py` holds what differs). A write that finds the store's disk full, its lock
held by another process for longer than the timeout (`HEMRA_STORE_TIMEOUT_SECS`, 30 s), or its
server gone, raises `StoreUnavailable`: the runner waits it out (`run/outage.py`) rather than
losing the write.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from sqlalchemy import Connection, Engine, and_, exists, func, insert, inspect, select, update

from pytest_hemra.core.backoff import seconds
from pytest_hemra.core.errors import StoreError
from pytest_hemra.core.lifecycle import RunStatus, TrialStatus
from pytest_hemra.core.store_location import is_server_address, redacted, store_address
from pytest_hemra.store import dialect
from pytest_hemra.store.advisory import advisory_lock
from pytest_hemra.store.schema import (
    CURRENT,
    OLDEST_MIGRATED,
    SCHEMA_VERSION,
    events,
    meta,
    metadata,
    runs,
    trials,
)

TIMEOUT_SECS = ("HEMRA_STORE_TIMEOUT_SECS", 30.0)  # how long a write waits for another's lock
SCHEMA_LOCK = "hemra schema"  # other processes creating or migrating the tables at once


class StoreBase:
    """A handle on one store; cheap to open, and a context manager: `close` (or the `with`
    block's end) closes every connection it opened. Threads of one process share a handle:
    each read or write takes a connection of the engine's pool for its length.

    `address` is what opens the same store again, in this process or another: a SQLite file's
    absolute path, or a `postgresql://` URL (with its password, if it has one: never print it;
    `name` is the store as messages show it). `path` is the SQLite file, None on a server."""

    def __init__(self, address: str | Path) -> None:
        text = str(address)
        timeout = seconds(*TIMEOUT_SECS, os.environ)
        self.engine: Engine
        if is_server_address(text):
            self.address = store_address(text)
            self.path: Path | None = None
            self.name = redacted(self.address)
            self.engine = dialect.postgres_engine(self.address, timeout)
        else:
            self.address = str(Path(text).absolute())
            self.path = Path(self.address)
            self.name = self.address
            self.engine = dialect.sqlite_engine(self.path, timeout)
        self.is_server = self.path is None
        self._reader = dialect.reader(self.engine)
        self._writer = dialect.writer(self.engine)
        try:
            self._create_schema()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def lock(
        self, name: str, timeout: float, waited: str, *, shared: bool = False
    ) -> contextlib.AbstractContextManager[None]:
        """A lock held in the store for as long as the block runs (a PostgreSQL store: shared by
        runners on several machines); not had within `timeout`, InfraError with `waited`."""
        if not self.is_server:
            raise StoreError(f"{self.name}: locks are held in a PostgreSQL store only")
        return advisory_lock(self.engine, name, timeout, waited, shared=shared)

    def close(self) -> None:
        """Close every connection this handle opened (a connection in use by another thread
        is closed as that thread gives it back)."""
        self.engine.dispose()

    def _create_schema(self) -> None:
        """Create the tables once, in a write transaction taken up front. A schema from a
        newer HEMRA is refused before anything is written; an older one is brought forward a
        version at a time (`store/migrations.py`)."""
        found = self._schema_version()
        if found is None:
            with self._transaction() as tx:
                dialect.lock(tx, SCHEMA_LOCK)
                metadata.create_all(tx)
                dialect.upsert(
                    tx,
                    meta,
                    {"key": "schema_version", "value": str(SCHEMA_VERSION)},
                    ["key"],
                    update=False,
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

    def _migrate(self, found: int) -> None:
        """Bring an older store forward in place, one version per transaction; old runs stay
        readable and resumable. Another process migrating at once waits for each step and
        finds it done."""
        from pytest_hemra.store.migrations import migrate

        for version in range(found + 1, SCHEMA_VERSION + 1):
            with self._transaction() as tx:
                dialect.lock(tx, SCHEMA_LOCK)
                now = tx.execute(select(meta.c.value).where(meta.c.key == "schema_version"))
                if int(now.scalar_one()) >= version:
                    continue
                migrate(tx, version)
                tx.execute(
                    update(meta).where(meta.c.key == "schema_version").values(value=str(version))
                )
                if version == SCHEMA_VERSION:
                    self._event_any(tx, "migrated", {"from": found, "to": SCHEMA_VERSION})

    def _schema_version(self) -> str | None:
        with self._reading() as db:
            if not inspect(db).has_table("meta"):
                return None
            found = db.execute(select(meta.c.value).where(meta.c.key == "schema_version"))
            value = found.scalar()
        return None if value is None else str(value)

    def _reading(self) -> contextlib.AbstractContextManager[Connection]:
        """A connection for reads, outside any transaction, given back when the block ends."""
        return dialect.reading(self._reader, self.name)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Connection]:
        """A write transaction, all or nothing; `StoreUnavailable` when it cannot be made for
        now (nothing of it is written then)."""
        with dialect.transaction(self._writer, self.name) as tx:
            yield tx

    def _event(
        self,
        tx: Connection,
        run_id: str | None,
        trial: str | None,
        kind: str,
        data: dict[str, Any],
    ) -> None:
        tx.execute(
            insert(events).values(
                run_id=run_id, trial_id=trial, at=time.time(), kind=kind, data=json.dumps(data)
            )
        )

    def record_event(
        self, run_id: str | None, trial: str | None, kind: str, data: dict[str, Any]
    ) -> None:
        """An event of a run (and of one of its trials), in a transaction of its own."""
        with self._transaction() as tx:
            self._event(tx, run_id, trial, kind, data)

    def _event_any(self, tx: Connection, kind: str, data: dict[str, Any]) -> None:
        """An event of the store itself, not of a run."""
        self._event(tx, None, None, kind, data)

    def _close_run(self, tx: Connection, run_id: str) -> None:
        """A run with no unfinished trial left is `finished` (or stays `cancelled` or
        `interrupted`: what it left is for a resume). Its row is locked first on a server: two
        trials finishing at once would each see the other unfinished, and neither close the
        run."""
        dialect.lock_row(tx, runs, run_id)
        unfinished = exists().where(
            trials.c.run_id == run_id, CURRENT, trials.c.status.in_(TrialStatus.UNFINISHED)
        )
        tx.execute(
            update(runs)
            .where(and_(runs.c.id == run_id, runs.c.status.not_in(RunStatus.STOPPED), ~unfinished))
            .values(status=RunStatus.FINISHED)
        )

    def count(self, table: str) -> int:
        if table not in metadata.tables:
            raise StoreError(f"{self.name}: no table {table!r}")
        with self._reading() as db:
            found = db.execute(select(func.count()).select_from(metadata.tables[table]))
            return int(found.scalar_one())
