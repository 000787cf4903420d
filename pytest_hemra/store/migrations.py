"""How a store written by an older HEMRA is brought forward: one step per schema version, from
the oldest migrated (2) to today's, each run in a transaction of its own that ends by writing
the version it reached, so a store stopped part way is a store of that version.

A step is what that version added, said with Alembic's operations (`add_column`) over the
store's connection, no migration scripts: tables and indexes a version added are created from
today's definitions in `schema.py` (no later version has changed them yet; a version that does
will add its columns in its own step). `tests/stores/schema-N.sql` holds a store each version's
own code wrote, and `tests/test_store_migrations.py` opens every one with today's code.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy
from alembic.migration import MigrationContext
from alembic.operations import Operations
from sqlalchemy import BigInteger, Column, Connection, Table, Text, and_, update

from pytest_hemra.core.outcome import Cause, Outcome
from pytest_hemra.store import schema

# the trials table as steps write it: without today's revision, which a store before 13 has no
# column for (`schema.trials` draws one at every update)
trials = sqlalchemy.table(
    "trials", *(sqlalchemy.column(c.name) for c in schema.trials.c if c.name != "revision")
)
Step = Callable[[Operations, Connection], None]


def _tables(tx: Connection, *tables: Table) -> None:
    for table in tables:
        table.create(tx, checkfirst=True)


def _indexes(tx: Connection, *names: str) -> None:
    for index in schema.INDEXES:
        if index.name in names:
            index.create(tx, checkfirst=True)


def _columns(ops: Operations, table: str, *columns: Column[object]) -> None:
    for column in columns:
        ops.add_column(table, column)


def to_3(ops: Operations, tx: Connection) -> None:
    """Retries as linked rows: a retry takes its trial's place in plan order."""
    _columns(ops, "trials", Column("plan_seq", BigInteger), Column("retries", BigInteger))
    tx.execute(update(trials).where(trials.c.plan_seq.is_(None)).values(plan_seq=trials.c.seq))
    _indexes(tx, "idx_trials_run_id_plan_seq_seq")


def to_4(ops: Operations, tx: Connection) -> None:
    """Judges, multi-step tasks, calibrations; the SWE track's class; a call's role."""
    _tables(tx, schema.calibrations, schema.judgments, schema.steps)
    _columns(ops, "calls", Column("role", Text))
    _columns(ops, "trials", Column("judges", Text), Column("error_class", Text))
    _indexes(tx, "idx_trials_run_id_status_outcome")


def to_5(ops: Operations, tx: Connection) -> None:
    """Nothing added: schema 5 named the tables 4 had made (a store of 4 reads as one of 5)."""


def to_6(ops: Operations, tx: Connection) -> None:
    """A pool of engines: a trial's placement on one."""
    _tables(tx, schema.placements)
    _columns(ops, "trials", Column("engine", Text))


def to_7(ops: Operations, tx: Connection) -> None:
    """Jobs a harness kind shares between trials (Harbor's), their claims and board locks."""
    _tables(tx, schema.shared_jobs, schema.shared_claims, schema.shared_locks)
    _indexes(tx, "idx_shared_jobs_run_id_kind_seq", "idx_shared_claims_run_id_kind")


def to_8(ops: Operations, tx: Connection) -> None:
    """Whose user the agent ran as."""
    _columns(ops, "trials", Column("agent_user", Text))


def to_9(ops: Operations, tx: Connection) -> None:
    """Calls whose usage could not be read."""
    _columns(ops, "trials", Column("usage_unknown", BigInteger))


def to_10(ops: Operations, tx: Connection) -> None:
    """The harness x model matrix: a trial's cell model; engine waits read by kind."""
    _columns(ops, "trials", Column("model", Text))
    _indexes(tx, "idx_events_kind_trial_id")


def to_11(ops: Operations, tx: Connection) -> None:
    """Verified with the agent's processes kept running."""
    _columns(ops, "trials", Column("kept_processes", BigInteger))


def to_12(ops: Operations, tx: Connection) -> None:
    """The cause beside an outcome gets a column of its own: causes kept in `error_class`,
    beside the SWE track's classes, move there (a SWE trial's `tampered` stays its class; a
    reward cheat's is its cause)."""
    _columns(ops, "trials", Column("cause", Text))
    causes = [str(cause) for cause in Cause if cause != Cause.TAMPERED]
    tx.execute(
        update(trials)
        .where(trials.c.error_class.in_(causes))
        .values(cause=trials.c.error_class, error_class=None)
    )
    tampered = and_(trials.c.error_class == Cause.TAMPERED, trials.c.outcome == Outcome.TAMPERED)
    tx.execute(update(trials).where(tampered).values(cause=trials.c.error_class))


def to_13(ops: Operations, tx: Connection) -> None:
    """A trial's revision, and a run's report kept as it was built (`report/snapshot.py`). Rows
    written before have none (NULL), which a sum of revisions passes over."""
    _columns(ops, "trials", Column("revision", BigInteger))
    _tables(tx, schema.reports)


# the step that brings a store of the version before to each version
STEPS: dict[int, Step] = {
    3: to_3,
    4: to_4,
    5: to_5,
    6: to_6,
    7: to_7,
    8: to_8,
    9: to_9,
    10: to_10,
    11: to_11,
    12: to_12,
    13: to_13,
}


def migrate(tx: Connection, version: int) -> None:
    """Run the step to `version` on a store of the version before, in the transaction `tx`."""
    STEPS[version](Operations(MigrationContext.configure(tx)), tx)
