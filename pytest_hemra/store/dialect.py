"""What differs between the store's two databases, in one place: SQLite (a file, one machine, the
default) and PostgreSQL (a server several machines share).

The rest of the package writes each statement once, in SQLite's spelling (`?` placeholders,
`json_each(?)` over a JSON list), using only what both understand (`ON CONFLICT`, `CAST(? AS
TEXT) IS NULL`); `Postgres.translate` turns it into PostgreSQL's. The differences beyond the
text: column types (REAL vs double precision, INTEGER PRIMARY KEY vs an identity column), how a
write transaction is taken (SQLite's `BEGIN IMMEDIATE` holds the whole file; PostgreSQL takes
row locks, and `lock` serializes what reads before it writes), `FOR UPDATE SKIP LOCKED` for the
queue's claims, the schema's reflection, and which errors mean "not now" (`StoreUnavailable`,
waited out by runners) rather than a fault.
"""

from __future__ import annotations

import re
import sqlite3
import sys
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pytest_hemra.core.errors import StoreError, StoreUnavailable
from pytest_hemra.core.store_location import redacted

if TYPE_CHECKING:
    import psycopg


@contextmanager
def _hidden(*modules: str) -> Iterator[None]:
    """Imports of `modules` fail inside the block, unless they are already loaded."""
    hidden = [name for name in modules if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # what makes `import` fail
    try:
        yield
    finally:
        for name in hidden:
            del sys.modules[name]


# sqlite_utils imports pandas and numpy whenever they are installed, to map their types to
# columns. statsmodels installs pandas, which would then load (a third of a second) in every
# process that opens the store; the store never writes pandas' or numpy's types.
with _hidden("pandas", "numpy"):
    import sqlite_utils

Columns = dict[str, type]
# what SQLite says when a write cannot be made for now (not a fault of the store itself)
SQLITE_UNAVAILABLE = ("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_FULL")
CONNECT_TIMEOUT_SECS = 5  # a PostgreSQL server that does not answer is refused after this
JSON_EACH = re.compile(r"json_each\(\?\)")


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...


class Reader(Protocol):
    """What the store's modules call on a database outside a transaction."""

    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Cursor: ...


class Connection(Reader, Protocol):
    """What the store's modules call on a database in a write transaction."""

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]], /) -> Cursor: ...


class Dialect(ABC):
    """One database's side of the store: its connections, transactions and schema.

    Each thread that uses a handle gets a connection of its own (opened on first use): a
    process running many trials at once on threads (`run/lanes.py`) shares one handle, and one
    thread's transaction never takes in another's writes."""

    name: str  # the store as messages show it (no password)
    is_server: bool
    no_limit: int | None  # `LIMIT ?` that limits nothing
    skip_locked: str  # appended to a SELECT of queued jobs that the caller will claim
    missing_table: tuple[type[Exception], ...]  # what a read of a table not there raises

    def __init__(self) -> None:
        self._local = threading.local()
        self._connections: list[Any] = []
        self._lock = threading.Lock()

    def _connection(self) -> Any:
        """This thread's connection, opened on first use (and again if it was lost)."""
        found = getattr(self._local, "connection", None)
        if found is None or self._is_lost(found):
            found = self._open()
            with self._lock:
                self._connections.append(found)
            self._local.connection = found
        return found

    def close(self) -> None:
        """Close every thread's connection."""
        with self._lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            connection.close()
        self._local = threading.local()

    @abstractmethod
    def _open(self) -> Any: ...
    @abstractmethod
    def _is_lost(self, connection: Any) -> bool: ...
    @property
    @abstractmethod
    def db(self) -> Reader:
        """This thread's connection, for reads outside any transaction."""

    @abstractmethod
    def transaction(self) -> AbstractContextManager[Connection]: ...
    @abstractmethod
    def lock(self, tx: Connection, key: str) -> None: ...
    @abstractmethod
    def lock_row(self, tx: Connection, table: str, key: str) -> None: ...
    @abstractmethod
    def tables(self) -> dict[str, set[str]]: ...
    @abstractmethod
    def create_table(self, tx: Connection, name: str, columns: Columns, pk: str) -> None: ...
    @abstractmethod
    def add_column(self, tx: Connection, table: str, column: str, kind: type) -> None: ...
    @abstractmethod
    def index_names(self) -> set[str]: ...
    @abstractmethod
    def create_index(self, tx: Connection, table: str, columns: Sequence[str]) -> None: ...


def index_name(table: str, columns: Sequence[str]) -> str:
    return f"idx_{table}_{'_'.join(columns)}"  # sqlite_utils' names, kept on both


class SQLite(Dialect):
    """A store file in WAL mode; a write transaction holds the file (`BEGIN IMMEDIATE`)."""

    is_server = False
    no_limit = -1
    skip_locked = ""
    missing_table = (sqlite3.OperationalError,)

    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__()
        self.path = path
        self.name = str(path)
        self.timeout = timeout
        path.parent.mkdir(parents=True, exist_ok=True)
        self.database.enable_wal()

    def _open(self) -> sqlite_utils.Database:
        connection = sqlite3.connect(self.path, timeout=self.timeout, check_same_thread=False)
        return sqlite_utils.Database(connection)

    def _is_lost(self, connection: Any) -> bool:
        return False

    @property
    def database(self) -> sqlite_utils.Database:
        """This thread's connection, with sqlite_utils' view of the tables."""
        database: sqlite_utils.Database = self._connection()
        return database

    @property
    def db(self) -> sqlite_utils.Database:
        return self.database

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A write transaction, all or nothing; `StoreUnavailable` when the disk is full or
        another process holds the lock past the timeout (nothing of it is written then)."""
        connection = self.database.conn
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
            raise StoreUnavailable(f"{self.name}: {error}") from error

    def lock(self, tx: Connection, key: str) -> None:
        """Nothing to take: `BEGIN IMMEDIATE` already holds the whole store."""

    def lock_row(self, tx: Connection, table: str, key: str) -> None:
        """Nothing to take: `BEGIN IMMEDIATE` already holds the whole store."""

    def tables(self) -> dict[str, set[str]]:
        return {
            table.name: {column.name for column in table.columns} for table in self.database.tables
        }

    def create_table(self, tx: Connection, name: str, columns: Columns, pk: str) -> None:
        self.database.table(name).create(columns, pk=pk, if_not_exists=True)

    def add_column(self, tx: Connection, table: str, column: str, kind: type) -> None:
        self.database.table(table).add_column(column, kind)

    def index_names(self) -> set[str]:
        return {row[0] for row in self.database.execute("SELECT name FROM sqlite_master")}

    def create_index(self, tx: Connection, table: str, columns: Sequence[str]) -> None:
        self.database.table(table).create_index(columns, if_not_exists=True)


def is_unavailable(error: sqlite3.Error) -> bool:
    """Whether SQLite refused a write for now: the disk full, or the lock held too long."""
    name = str(getattr(error, "sqlite_errorname", ""))
    text = str(error)
    return name.startswith(SQLITE_UNAVAILABLE) or any(
        words in text for words in ("database is locked", "database or disk is full")
    )


PG_TYPES: dict[type, str] = {
    str: "text",
    int: "bigint",
    float: "double precision",
    bytes: "bytea",
}


class Postgres(Dialect):
    """A database on a PostgreSQL server, through psycopg 3: connections in autocommit (a read
    holds no transaction open), writes in explicit transactions at READ COMMITTED with row
    locks. A connection lost (the server restarted, the network cut) is opened again on the
    next use; the write it broke is `StoreUnavailable`, waited out."""

    is_server = True
    no_limit = None  # LIMIT NULL: no limit
    skip_locked = " FOR UPDATE OF jobs SKIP LOCKED"

    def __init__(self, url: str, timeout: float) -> None:
        try:
            import psycopg
        except ImportError:
            raise StoreError(
                f"{redacted(url)}: a PostgreSQL store needs psycopg:"
                " pip install 'pytest-hemra[postgres]'"
            ) from None
        super().__init__()
        self.missing_table = (psycopg.errors.UndefinedTable,)
        self.url = url
        self.name = redacted(url)
        self.timeout = timeout
        self._connection()  # an unreachable server is refused when the store is opened

    def _open(self) -> psycopg.Connection[Any]:
        import psycopg

        try:
            connection = psycopg.connect(
                self.url,
                autocommit=True,
                connect_timeout=CONNECT_TIMEOUT_SECS,
                options=f"-c lock_timeout={int(self.timeout * 1000)}",
            )
        except psycopg.ProgrammingError as error:  # the URL itself (an unknown parameter)
            raise StoreError(f"{self.name}: {one_line(error)}") from None
        except psycopg.OperationalError as error:
            raise StoreUnavailable(
                f"{self.name}: cannot connect to the PostgreSQL store: {one_line(error)}"
            ) from None
        return connection

    def _is_lost(self, connection: Any) -> bool:
        return bool(connection.closed or connection.broken)

    @property
    def db(self) -> Reader:
        return _PostgresConnection(self, None)

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        import psycopg

        connection = self._connection()
        try:
            with connection.transaction():
                yield _PostgresConnection(self, connection)
        except (psycopg.OperationalError, psycopg.errors.TransactionRollback) as error:
            # the server gone, a lock waited on past the timeout, a deadlock: nothing of the
            # transaction was written; the caller may try again
            raise StoreUnavailable(f"{self.name}: {one_line(error)}") from error

    def lock(self, tx: Connection, key: str) -> None:
        """Hold `key` until the transaction ends: for a write that reads first (a count of
        slots, a lock row) and must not interleave with another of its kind."""
        tx.execute("SELECT pg_advisory_xact_lock(hashtext(?))", [key])

    def lock_row(self, tx: Connection, table: str, key: str) -> None:
        tx.execute(f"SELECT 1 FROM {table} WHERE id = ? FOR UPDATE", [key])

    def tables(self) -> dict[str, set[str]]:
        found: dict[str, set[str]] = {}
        for table, column in self.db.execute(
            "SELECT table_name, column_name FROM information_schema.columns"
            " WHERE table_schema = current_schema()"
        ):
            found.setdefault(table, set()).add(column)
        return found

    def create_table(self, tx: Connection, name: str, columns: Columns, pk: str) -> None:
        defined = []
        for column, kind in columns.items():
            if column == pk and kind is int:
                defined.append(f"{column} bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY")
            else:
                key = " PRIMARY KEY" if column == pk else ""
                defined.append(f"{column} {pg_type(kind)}{key}")
        tx.execute(f"CREATE TABLE IF NOT EXISTS {name} ({', '.join(defined)})")

    def add_column(self, tx: Connection, table: str, column: str, kind: type) -> None:
        tx.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {pg_type(kind)}")

    def index_names(self) -> set[str]:
        rows = self.db.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()"
        )
        return {row[0] for row in rows}

    def create_index(self, tx: Connection, table: str, columns: Sequence[str]) -> None:
        name = index_name(table, columns)
        tx.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {table} ({', '.join(columns)})")


def pg_type(kind: type) -> str:
    return PG_TYPES[kind]


class _PostgresConnection:
    """A psycopg connection that takes the store's SQLite spelling: in a transaction's
    (`connection`), or else this thread's, in autocommit."""

    def __init__(self, dialect: Postgres, connection: psycopg.Connection[Any] | None) -> None:
        self.dialect = dialect
        self.connection = connection

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> Cursor:
        return self._run(translate(sql), lambda cursor, text: cursor.execute(text, parameters))

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]], /) -> Cursor:
        return self._run(translate(sql), lambda cursor, text: cursor.executemany(text, rows))

    def _run(self, text: str, act: Callable[[Any, str], object]) -> Cursor:
        import psycopg

        if self.connection is not None:
            held = self.connection.cursor()
            act(held, text)
            return held
        try:
            cursor: Cursor = self.dialect._connection().cursor()
            act(cursor, text)
        except psycopg.OperationalError as error:
            raise StoreUnavailable(f"{self.dialect.name}: {one_line(error)}") from error
        return cursor


def translate(sql: str) -> str:
    """A statement in the store's SQLite spelling, as PostgreSQL (psycopg) takes it."""
    text = JSON_EACH.sub("json_array_elements_text(CAST(? AS json))", sql)
    text = text.replace(" LIKE ", " ILIKE ")  # SQLite's LIKE ignores case (ASCII)
    return text.replace("%", "%%").replace("?", "%s")


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__
