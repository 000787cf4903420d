"""A store written by every schema version HEMRA has shipped (2 to the one before today's) opens
with today's code and reads the same: its run, and its trials with their fields. Each store was
written by that version's own code (`tests/stores/make_dumps.py` ran `write_store.py` in a
worktree of its last commit) and kept as SQL text; PostgreSQL stores exist from schema 10, the
first version that could write one."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import inspect

from pytest_hemra.core.outcome import Outcome
from pytest_hemra.store import SCHEMA_VERSION, Store
from pytest_hemra.store.migrations import STEPS
from tests.records import (
    OLD_PLAN,
    OLD_RUN,
    load_postgres_dump,
    load_sqlite_dump,
    sql,
    trial_result,
)

SQLITE_VERSIONS = range(2, SCHEMA_VERSION)
POSTGRES_VERSIONS = range(10, SCHEMA_VERSION)  # schema 10 brought the PostgreSQL store
FIRST_ERROR_CLASS = 4  # the SWE track's class (and, until 12, a cause) was stored from 4
FIRST_AGENT_USER = 8


def assert_reads_the_same(store: Store, version: int) -> None:
    run = store.run(OLD_RUN)
    assert (run.name, run.status, run.trials_dir) == ("old-run", "running", Path("/srv/trials"))
    assert run.spec == {"name": "old-run", "attempts": 1, "harnesses": {"oracle": {}, "nop": {}}}
    passed, outage, failed, planned = store.trials(OLD_RUN)
    assert [t.item_id for t in (passed, outage, failed, planned)] == [p.item_id for p in OLD_PLAN]
    assert [t.status for t in (passed, outage, failed, planned)] == [
        "finished",
        "finished",
        "finished",
        "planned",
    ]
    assert (passed.outcome, outage.outcome, failed.outcome, planned.outcome) == (
        Outcome.PASS,
        Outcome.INFRA_ERROR,
        Outcome.FAIL,
        None,
    )
    assert (passed.reward, passed.rewards, failed.reward, failed.rewards) == (
        1.0,
        {"reward": 1.0},
        0.0,
        {"reward": 0.0},
    )
    assert (outage.reward, outage.rewards, outage.error) == (None, {}, "engine down")
    assert (failed.exit_code, planned.exit_code) == (1, None)
    for trial in (passed, outage, failed):
        assert (trial.tokens, trial.calls, trial.cost, trial.models) == (150, 2, 0.5, ("model-a",))
        own = trial.own_report or {}  # from schema 12, every field of a typed SelfReport
        assert {key: value for key, value in own.items() if value} == {
            "input_tokens": 100,
            "output_tokens": 20,
            "turns": 3,
        }
        assert trial.is_priced and trial.usage_unknown == 0 and trial.stopped_by is None
        agent_user = "0:0 (root, image)" if version >= FIRST_AGENT_USER else None
        assert trial.agent_user == agent_user and not trial.kept_processes
    assert (planned.tokens, planned.calls, planned.cost, planned.models) == (0, 0, 0.0, ())
    if version >= FIRST_ERROR_CLASS:  # the cause moved out of error_class (schema 12)
        assert (outage.swe_class, outage.cause) == (None, "engine_outage")
        assert (failed.swe_class, failed.cause) == ("partial", None)
    else:
        assert {t.swe_class for t in (passed, outage, failed)} == {None}
    assert store.trial(outage.id) == outage
    assert [row[0] for row in sql(store, "SELECT value FROM meta")] == [str(SCHEMA_VERSION)]
    assert store.count("events") >= 5  # recorded, three finished, migrated


def assert_works_on(store: Store) -> None:
    """Old runs go on: the planned trial is claimed and finished, a new run recorded."""
    planned = store.trials(OLD_RUN)[-1]
    assert store.claim(planned.id, "main@new-host:1", 30).is_leased
    done = trial_result(
        {"outcome": "pass", "reward": 1.0, "rewards": {"reward": 1.0}, "exit_code": 0}
        | {"error": None, "finished_at": 2.0, "duration": 1.0, "phases": {}, "trial_dir": "x"}
    )
    store.finish_trial(planned.id, done)
    assert store.run(OLD_RUN).status == "finished"
    store.record_plan("new", "new", {}, Path("/srv/trials"), OLD_PLAN[:1])
    assert [t.item_id for t in store.trials("new")] == [OLD_PLAN[0].item_id]


@pytest.mark.parametrize("version", SQLITE_VERSIONS)
def test_a_sqlite_store_of_every_older_schema_opens_and_reads_the_same(
    tmp_path: Path, version: int
) -> None:
    path = tmp_path / "hemra.db"
    load_sqlite_dump(path, version)
    with Store(path) as store:
        assert_reads_the_same(store, version)
        migrated = sql(store, "SELECT data FROM events WHERE kind = 'migrated'")
        assert [row[0] for row in migrated] == [f'{{"from": {version}, "to": {SCHEMA_VERSION}}}']
    with Store(path) as again:  # opened again: nothing left to bring forward
        assert_reads_the_same(again, version)
        assert again.count("events") == store.count("events")
        assert_works_on(again)


@pytest.mark.parametrize("version", POSTGRES_VERSIONS)
def test_a_postgres_store_of_every_older_schema_opens_and_reads_the_same(
    postgres_url: str, version: int
) -> None:
    load_postgres_dump(postgres_url, version)
    with Store(postgres_url) as store:
        assert_reads_the_same(store, version)
        assert_works_on(store)


def test_every_schema_version_has_its_step_and_its_stores() -> None:
    """A new schema version comes with its migration step and a store its code wrote."""
    assert sorted(STEPS) == list(range(3, SCHEMA_VERSION + 1))
    stores = Path(__file__).parent / "stores"
    for version in SQLITE_VERSIONS:
        assert (stores / f"schema-{version}.sql").is_file(), version
    for version in POSTGRES_VERSIONS:
        assert (stores / f"schema-{version}.postgres.sql").is_file(), version


def test_a_migrated_store_has_the_tables_and_indexes_of_a_new_one(tmp_path: Path) -> None:
    load_sqlite_dump(tmp_path / "old.db", 2)
    with Store(tmp_path / "old.db") as old, Store(tmp_path / "new.db") as new:
        for store in (old, new):
            assert inspect(store.engine).get_table_names()  # loaded
        shape = [
            {
                table: (
                    {c["name"] for c in inspect(store.engine).get_columns(table)},
                    {i["name"] for i in inspect(store.engine).get_indexes(table)},
                )
                for table in inspect(store.engine).get_table_names()
            }
            for store in (old, new)
        ]
    old_shape, new_shape = shape
    assert set(old_shape) == set(new_shape)
    for table, (columns, indexes) in new_shape.items():
        assert old_shape[table][0] == columns, table
        assert indexes <= old_shape[table][1], table  # schema 2 kept an index since dropped
