"""A store several machines share (PostgreSQL) and the one each machine has (SQLite) behave
the same: calls, events, engine slots, pages of trials, claims by many workers at once. Store
addresses that cannot name a store, a server that does not answer and a schema from a newer
HEMRA are each refused in one line, changing nothing."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from pytest_hemra.cli import main
from pytest_hemra.core.errors import StoreError, StoreUnavailable
from pytest_hemra.core.events import ENGINE_DOWN
from pytest_hemra.core.records import CallRow, EngineSlot, PlannedTrial, TrialFilter
from pytest_hemra.core.store_location import redacted, store_location
from pytest_hemra.store import SCHEMA_VERSION, Store
from tests.records import sql
from tests.upstream import closed_port

PLAN = [PlannedTrial("ds", f"task-{n}", "h", 1) for n in range(3)]


def _call(run_id: str, trial: str, cost: float | None, *, known: bool = True) -> CallRow:
    return CallRow(
        run_id=run_id,
        trial_id=trial,
        at=time.time(),
        provider="anthropic",
        wire="anthropic",
        method="POST",
        path="/v1/messages",
        model_requested="m",
        model="m",
        status=200,
        input_tokens=10,
        output_tokens=5,
        cost=cost,
        latency=0.1,
        ttfb=None,
        request_bytes=100,
        response_bytes=200,
        error=None,
        refused=False,
        headers={"x-api-key": "[redacted]"},
        is_usage_known=known,
    )


def test_calls_events_and_pages_read_back_the_same_on_either_store(
    tmp_path: Path, store_address: str
) -> None:
    store = Store(store_address)
    store.record_plan("r1", "run", {}, tmp_path, PLAN)
    first, second, third = store.trials("r1")
    store.record_call(_call("r1", first.id, 0.25))
    store.record_call(_call("r1", first.id, None, known=False))
    store.record_call(_call("r1", second.id, 0.5))
    calls = store.calls(first.id)
    assert [c.cost for c in calls] == [0.25, None]
    assert [c.is_usage_known for c in calls] == [True, False]
    assert calls[0].headers == {"x-api-key": "[redacted]"} and calls[1].input_tokens == 0
    assert len(store.calls()) == 3 and len(store.calls(run_id="r1")) == 3
    assert store.run_cost("r1") == 0.75
    assert store.cell_cost("r1", "h", None) == 0.75 and store.cell_cost("r1", "h", "x") == 0

    store.claim(first.id, "w@elsewhere:1", 30)
    store.record_event("r1", first.id, ENGINE_DOWN, {"engine": "e1", "error": "gone"})
    assert [e.kind for e in store.events([first.id])] == [ENGINE_DOWN]
    waits = store.engine_waits("r1", alive=lambda owner: True)
    assert [(w.engine, w.trials) for w in waits["r1"]] == [("e1", 1)]
    assert store.engine_waits(None, alive=lambda owner: True).keys() == {"r1"}

    page = store.trial_page("r1", TrialFilter(text="TASK-1"), limit=None)
    assert [t.id for t in page] == [second.id]  # the text is matched ignoring case
    assert [t.id for t in store.trial_page("r1", TrialFilter(), limit=1, after=first.id)] == [
        second.id
    ]
    assert store.count_trials("r1", TrialFilter(outcome="planned")) == 2
    assert store.trial_counts("r1")["r1"].statuses == {"running": 1, "planned": 2}
    assert store.trial_detail(first.id).job_state == "leased"
    assert store.trial(third.id).status == "planned"


def test_engine_slots_are_counted_across_handles_on_either_store(
    tmp_path: Path, store_address: str
) -> None:
    store = Store(store_address)
    store.record_plan("r1", "run", {}, tmp_path, PLAN)
    trials = store.trials("r1")
    for trial in trials:
        store.claim(trial.id, "w@elsewhere:1", 30)
    slots = [EngineSlot("a", "tcp://a:1", 1), EngineSlot("b", "tcp://b:1", 1)]
    other = Store(store.address)
    placed = [
        handle.claim_engine(trial.id, "w@elsewhere:1", slots, lambda owner: True)
        for handle, trial in zip([store, other, store], trials, strict=True)
    ]
    assert [p.name if p else None for p in placed] == ["a", "b", None]  # both full
    assert store.engine_load() == {"tcp://a:1": 1, "tcp://b:1": 1}
    other.release_engine(trials[0].id)
    assert store.claim_engine(trials[2].id, "w", slots, lambda owner: True) == slots[0]


def test_workers_claiming_at_once_each_take_other_jobs_and_every_job_once(
    tmp_path: Path, store_address: str
) -> None:
    store = Store(store_address)
    many = [PlannedTrial("ds", f"t{n}", "h", 1) for n in range(40)]
    store.record_plan("r1", "run", {}, tmp_path, many)
    store.record_plan("r2", "later", {}, tmp_path, many[:2])
    taken: dict[str, list[str]] = {}

    def work(worker: str) -> None:
        handle = Store(store.address)  # a worker of its own, as on another machine
        mine = taken.setdefault(worker, [])
        while (trial := handle.claim_next(worker, 30, "r1")) is not None:
            mine.append(trial.trial_id)
        handle.close()

    workers = [threading.Thread(target=work, args=(f"w{n}@host{n}:1",)) for n in range(4)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join(60)
    claimed = [trial for mine in taken.values() for trial in mine]
    assert sorted(claimed) == sorted(t.id for t in store.trials("r1"))  # each exactly once
    assert store.job_counts("r1") == {"leased": 40}
    claim = store.claim_next("w", 30)  # then the next run's, oldest run first
    assert claim is not None and claim.trial_id == "r2.00000"
    store.cancel_run("r2", lambda owner: True)
    assert store.claim_next("w", 30) is None  # a cancelled run's jobs are not handed out


def test_a_schema_from_a_newer_hemra_is_refused_and_nothing_changes(
    tmp_path: Path, store_address: str
) -> None:
    store = Store(store_address)
    store.record_plan("r1", "run", {}, tmp_path, PLAN)
    newer = str(SCHEMA_VERSION + 1)
    sql(store, "UPDATE meta SET value = :newer WHERE key = 'schema_version'", newer=newer)
    sql(store, "ALTER TABLE trials DROP COLUMN model")  # what it would add again
    store.close()
    with pytest.raises(StoreError, match="written by a newer HEMRA") as refused:
        Store(store_address)
    assert "\n" not in str(refused.value)
    assert main(["runs", "--store", store_address]) == 4  # refused input
    assert _meta_and_columns(store_address) == (newer, False)  # nothing migrated or added


def _meta_and_columns(address: str) -> tuple[str, bool]:
    """The recorded schema version and whether trials has a `model` column, read raw."""
    if address.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(address) as connection:
            version = connection.execute("SELECT value FROM meta").fetchone()
            has = connection.execute(
                "SELECT 1 FROM information_schema.columns WHERE table_name = 'trials'"
                " AND column_name = 'model'"
            ).fetchone()
        assert version is not None
        return str(version[0]), has is not None
    import sqlite3

    connection = sqlite3.connect(address)
    try:
        version = connection.execute("SELECT value FROM meta").fetchone()[0]
        columns = {row[1] for row in connection.execute("PRAGMA table_info(trials)")}
    finally:
        connection.close()
    return str(version), "model" in columns


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("mysql://root@db/hemra", "unknown store scheme 'mysql'"),
        ("postgresql://hemra:s3cret@db:99999/hemra", "malformed PostgreSQL URL"),
        ("postgresql://hemra:s3cret@db:port/hemra", "malformed PostgreSQL URL"),
        ("postgresql://hemra@db/hemra?sslmode=sometimes", "sslmode"),
    ],
)
def test_a_store_address_that_cannot_name_a_store_is_refused_in_one_line(
    address: str, expected: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["runs", "--store", address]) == 4
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1
    assert "s3cret" not in err
    assert list(tmp_path.iterdir()) == []


def test_an_unreachable_database_is_refused_at_once_naming_it_without_its_password(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"postgresql://hemra:s3cret@127.0.0.1:{closed_port()}/hemra"
    monkeypatch.setenv("HEMRA_STORE", url)
    started = time.monotonic()
    assert main(["runs"]) == 4
    err = capsys.readouterr().err
    assert time.monotonic() - started < 10
    assert err.count("\n") == 1 and "cannot connect to the PostgreSQL store" in err
    assert "hemra:***@127.0.0.1" in err and "s3cret" not in err
    with pytest.raises(StoreUnavailable):
        Store(url)


def test_a_store_url_is_shown_without_its_password() -> None:
    assert redacted("postgresql://me:pw@db:5432/x") == "postgresql://me:***@db:5432/x"
    assert redacted("postgresql://db/x?password=pw&sslmode=off") == (
        "postgresql://db/x?password=***&sslmode=off"
    )
    assert redacted("/tmp/hemra.db") == "/tmp/hemra.db"
    location = store_location("postgresql://me:pw@db/x")
    assert location.is_server and location.path is None and location.exists()
    assert "pw" not in location.describe() and location.address.endswith("me:pw@db/x")
