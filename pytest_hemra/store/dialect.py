"""What differs between the store's two databases, in one place: SQLite (a file, one machine, the
default) and PostgreSQL (a server several machines share).

Statements are written once, as SQLAlchemy Core constructs, and compiled for each database by
SQLAlchemy; what is left here is what a construct does not say: how an engine is opened (SQLite
in WAL mode with a busy timeout; PostgreSQL through psycopg with a connect and a lock timeout),
how a write transaction is taken (SQLite's `BEGIN IMMEDIATE` holds the whole file from the
start; PostgreSQL writes at READ COMMITTED with row locks, and `lock` takes an advisory lock
for a write that reads first), and which errors mean "not now" (`StoreUnavailable`, waited out
by runners) rather than a fault. Reads run outside any transaction (SQLite's autocommit,
PostgreSQL's AUTOCOMMIT), so a reader never holds a lock or a snapshot open.

Constructs that compile differently but mean the same on both are used as they are:
`.ilike()` (SQLite's LIKE ignores ASCII case already), `.in_([...])` for a list,
`.with_for_update(skip_locked=True)` (nothing on SQLite, whose write transaction holds the
store), `Identity()` (SQLite's rowid), `insert(...).on_conflict_do_update` (`upsert`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import URL, Connection, Engine, Insert, Table, create_engine, event, func, select
from sqlalchemy.exc import DBAPIError, NoSuchModuleError
from sqlalchemy.pool import ConnectionPoolEntry

from pytest_hemra.core.errors import StoreError, StoreUnavailable
from pytest_hemra.core.store_location import redacted

# what SQLite says when a write cannot be made for now (not a fault of the store itself)
SQLITE_UNAVAILABLE = ("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_FULL")
CONNECT_TIMEOUT_SECS = 5  # a PostgreSQL server that does not answer is refused after this
WRITE = "hemra_write"  # the execution option of a write transaction's connection
POOL_SIZE = 4  # connections kept open for the threads of a process; more are opened as needed


def sqlite_engine(path: Path, timeout: float) -> Engine:
    """A store file's engine: pysqlite's own transaction handling off, so that a read is in
    no transaction and a write's is `BEGIN IMMEDIATE`, taken as it starts (a reader that
    upgraded to a writer while runners write would fail at once with 'database is locked')."""
    path.parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        URL.create("sqlite", database=str(path)),
        connect_args={"timeout": timeout, "check_same_thread": False},
        pool_size=POOL_SIZE,
        max_overflow=-1,
    )

    @event.listens_for(engine, "connect")
    def no_implicit_transactions(dbapi: sqlite3.Connection, record: ConnectionPoolEntry) -> None:
        dbapi.isolation_level = None

    @event.listens_for(engine, "begin")
    def begin(connection: Connection) -> None:
        if connection.get_execution_options().get(WRITE):
            connection.exec_driver_sql("BEGIN IMMEDIATE")

    try:
        with engine.connect() as connection:
            if connection.exec_driver_sql("PRAGMA journal_mode").scalar() != "wal":
                connection.exec_driver_sql("PRAGMA journal_mode=WAL")
    except BaseException:
        engine.dispose()
        raise
    return engine


def postgres_engine(url: str, timeout: float) -> Engine:
    """A PostgreSQL database's engine, through psycopg 3. A connection lost (the server
    restarted, the network cut) fails the statement that finds it, as `StoreUnavailable`
    (waited out); SQLAlchemy then drops the pool's connections and the next use opens anew."""
    name = redacted(url)
    try:
        engine = create_engine(
            "postgresql+psycopg://" + url.split("://", 1)[1],
            connect_args={
                "connect_timeout": CONNECT_TIMEOUT_SECS,
                "options": f"-c lock_timeout={int(timeout * 1000)}",
            },
            pool_size=POOL_SIZE,
            max_overflow=-1,
        )
    except (ImportError, NoSuchModuleError):
        raise StoreError(
            f"{name}: a PostgreSQL store needs psycopg: pip install 'pytest-hemra[postgres]'"
        ) from None
    try:
        with engine.connect():  # an unreachable server is refused when the store is opened
            pass
    except DBAPIError as error:
        engine.dispose()
        if is_unavailable(error):
            raise StoreUnavailable(
                f"{name}: cannot connect to the PostgreSQL store: {one_line(error.orig)}"
            ) from None
        raise StoreError(f"{name}: {one_line(error.orig)}") from None  # the URL itself
    return engine


def reader(engine: Engine) -> Engine:
    """The engine for reads: each statement on its own, holding no transaction open."""
    if engine.dialect.name == "postgresql":
        return engine.execution_options(isolation_level="AUTOCOMMIT")
    return engine  # the `begin` event takes no transaction but a writer's


def writer(engine: Engine) -> Engine:
    """The engine for write transactions (`transaction`)."""
    return engine.execution_options(**{WRITE: True})


@contextmanager
def transaction(engine: Engine, name: str) -> Iterator[Connection]:
    """A write transaction on `writer(engine)`, all or nothing; `StoreUnavailable` when it
    cannot be made for now: the disk full, the lock held by another past the timeout, the
    server gone, a deadlock (nothing of it is written then)."""
    try:
        with engine.begin() as connection:
            yield connection
    except DBAPIError as error:
        if not is_unavailable(error):
            raise
        raise StoreUnavailable(f"{name}: {one_line(error.orig)}") from error


@contextmanager
def reading(engine: Engine, name: str) -> Iterator[Connection]:
    """A connection for reads; `StoreUnavailable` when a server cannot be reached now."""
    try:
        with engine.connect() as connection:
            yield connection
    except DBAPIError as error:
        if engine.dialect.name != "postgresql" or not is_unavailable(error):
            raise
        raise StoreUnavailable(f"{name}: {one_line(error.orig)}") from error


def is_unavailable(error: DBAPIError) -> bool:
    """Whether the database refused for now: SQLite's disk full or its lock held too long; a
    PostgreSQL server gone, a lock waited on too long, a deadlock (psycopg's operational
    errors, which take in its transaction rollbacks)."""
    found = error.orig
    if isinstance(found, sqlite3.Error):
        name = str(getattr(found, "sqlite_errorname", ""))
        text = str(found)
        return name.startswith(SQLITE_UNAVAILABLE) or any(
            words in text for words in ("database is locked", "database or disk is full")
        )
    try:
        import psycopg
    except ImportError:
        return False
    return isinstance(found, psycopg.OperationalError) or error.connection_invalidated


def lock(tx: Connection, key: str) -> None:
    """Hold `key` until the transaction ends, on a server: for a write that reads first (a
    count of slots, a lock row) and must not interleave with another of its kind. Nothing to
    take on SQLite: `BEGIN IMMEDIATE` already holds the whole store."""
    if tx.dialect.name == "postgresql":
        tx.execute(select(func.pg_advisory_xact_lock(func.hashtext(key))))


def lock_row(tx: Connection, table: Table, key: str) -> None:
    """Lock one row (by `id`) until the transaction ends, on a server (on SQLite, the write
    transaction holds the store)."""
    if tx.dialect.name == "postgresql":
        tx.execute(select(table.c.id).where(table.c.id == key).with_for_update())


def upsert(
    tx: Connection, table: Table, values: dict[str, Any], keys: Sequence[str], *, update: bool
) -> None:
    """Insert a row, or on a conflict over `keys` update it with `values` (or leave it, when
    not `update`): `INSERT ... ON CONFLICT`, which both databases spell alike but SQLAlchemy
    builds per dialect."""
    # the dialect's module imported here, not at the top: a process of a SQLite store (an
    # xdist worker, say) never loads PostgreSQL's (benchmarks/import_cost.py)
    if tx.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert  # type: ignore[assignment]
    statement = insert(table).values(values)
    done: Insert
    if update:
        changed = {name: statement.excluded[name] for name in values if name not in keys}
        done = statement.on_conflict_do_update(index_elements=list(keys), set_=changed)
    else:
        done = statement.on_conflict_do_nothing(index_elements=list(keys))
    tx.execute(done)


def one_line(error: BaseException | None) -> str:
    return " ".join(str(error).split()) or type(error).__name__
