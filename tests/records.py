"""What the store's tests hand it and read from it beside its own API: a trial's result written
as a dict (as tests spell them), and raw SQL on the store's database."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import text

from pytest_hemra.core.records import PlannedTrial
from pytest_hemra.core.trial import TrialResult, TrialUsage
from pytest_hemra.store import Store


def trial_result(data: Mapping[str, Any]) -> TrialResult:
    """A `TrialResult` from a dict of its fields (`usage` a dict of `TrialUsage`'s; a result
    that does not say when it started started at 0)."""
    fields = dict(data)
    usage = fields.pop("usage", None)
    fields.setdefault("started_at", 0.0)
    return TrialResult(**fields, usage=TrialUsage(**usage) if usage else TrialUsage())


def sql(store: Store, statement: str, **params: Any) -> list[Any]:
    """Run one statement on the store's database in a transaction of its own; its rows."""
    with store.engine.begin() as connection:
        found = connection.execute(text(statement), params)
        return list(found.all()) if found.returns_rows else []


# the run `tests/stores/write_store.py` records with each older schema's own code
OLD_RUN = "20260101-000000-0abc"
OLD_PLAN = [
    PlannedTrial("ds", "alpha", "oracle", 1),
    PlannedTrial("ds", "alpha", "nop", 1),
    PlannedTrial("ds", "beta", "oracle", 1),
    PlannedTrial("ds", "beta", "nop", 1),
]
STORES = Path(__file__).parent / "stores"


def load_sqlite_dump(path: Path, version: int) -> None:
    """A SQLite file holding the store schema `version`'s code wrote (`stores/schema-N.sql`)."""
    connection = sqlite3.connect(path)
    try:
        connection.executescript((STORES / f"schema-{version}.sql").read_text())
    finally:
        connection.close()


def load_postgres_dump(url: str, version: int) -> None:
    """An empty PostgreSQL database given the store schema `version`'s code wrote there
    (`stores/schema-N.postgres.sql`, pg_dump's plain text; its psql commands left out)."""
    import psycopg

    dump = (STORES / f"schema-{version}.postgres.sql").read_text()
    statements = "\n".join(line for line in dump.splitlines() if not line.startswith("\\"))
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(statements.encode())
