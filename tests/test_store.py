"""The store: the plan recorded in one transaction, results kept, the queue's leases; each on
both kinds of store (a SQLite file, a PostgreSQL database: `store_address` in conftest.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy import inspect

from pytest_hemra.core.errors import StoreError
from pytest_hemra.core.records import PlannedTrial
from pytest_hemra.store import SCHEMA_VERSION, Store, queue
from tests.records import OLD_PLAN, OLD_RUN, load_sqlite_dump, sql, trial_result

PLAN = [PlannedTrial("ds", "t", "h", 1), PlannedTrial("ds", "t", "h", 2)]


def test_plan_is_recorded_with_its_jobs(tmp_path: Path, store_address: str) -> None:
    store = Store(store_address)
    store.record_plan("r1", "run", {"spec": {}}, tmp_path, PLAN)
    assert [t.item_id for t in store.trials("r1")] == ["ds::t[h-1]", "ds::t[h-2]"]
    assert store.count("jobs") == 2 and store.count("runs") == 1
    assert store.run("r1").spec == {"spec": {}}


def test_a_failed_record_leaves_nothing(tmp_path: Path, store_address: str) -> None:
    store = Store(store_address)
    store.record_plan("r1", "run", {}, tmp_path, PLAN)
    with pytest.raises(Exception, match=r"(?i)unique"):
        store.record_plan("r1", "again", {}, tmp_path, PLAN)  # same run id: refused whole
    assert store.count("runs") == 1 and store.count("trials") == 2 and store.count("jobs") == 2
    assert store.count("events") == 1


def test_finished_trial_closes_its_job_and_the_run(tmp_path: Path, store_address: str) -> None:
    store = Store(store_address)
    store.record_plan("r1", "run", {}, tmp_path, PLAN[:1])
    (trial,) = store.trials("r1")
    assert store.claim(trial.id, "w", 30).state == "leased"
    assert store.run("r1").status == "running"
    store.finish_trial(
        trial.id,
        trial_result(
            {
                "outcome": "pass",
                "reward": 1.0,
                "rewards": {"reward": 1.0},
                "exit_code": 0,
                "error": None,
                "finished_at": 1.0,
                "duration": 0.5,
                "phases": {},
                "trial_dir": "x",
            }
        ),
    )
    (done,) = store.trials("r1")
    assert done.is_finished and done.outcome == "pass" and done.rewards == {"reward": 1.0}
    assert store.run("r1").status == "finished"
    assert sql(store, "SELECT state FROM jobs")[0][0] == "done"


def test_a_job_is_leased_once_and_its_lease_is_renewed_by_its_owner_only(
    tmp_path: Path, store_address: str
) -> None:
    store = Store(store_address)
    store.record_plan("r1", "run", {}, tmp_path, PLAN[:1])
    (trial,) = store.trials("r1")
    assert store.claim(trial.id, "gw0@elsewhere:1", 30).state == "leased"
    assert store.claim(trial.id, "gw1@elsewhere:2", 30).state == "taken"
    assert store.heartbeat(trial.id, "gw0@elsewhere:1", 30) == "leased"
    assert store.heartbeat(trial.id, "gw1@elsewhere:2", 30) is None
    assert store.stale_trials("r1", lambda owner: True) == []
    assert store.stale_trials("r1", lambda owner: False) == [trial.id]  # its runner died


def test_one_write_renews_many_leases_and_says_which_are_cancelling(
    tmp_path: Path, store_address: str
) -> None:
    """A process running many trials at once beats them all in one transaction."""
    store = Store(store_address)
    store.record_plan("r1", "run", {}, tmp_path, PLAN)
    first, second = store.trials("r1")
    assert store.claim(first.id, "gw0@elsewhere:1", 30).state == "leased"
    assert store.claim(second.id, "gw1@elsewhere:2", 30).state == "leased"
    assert store.cancel_run("r1", lambda owner: True) == (0, 2)
    beats = store.heartbeats([first.id, second.id], "gw0@elsewhere:1", 30)
    assert beats == {first.id: "cancelling", second.id: None}  # the second is not its lease


def test_a_beat_past_one_statements_share_renews_every_lease_of_its_worker_only(
    tmp_path: Path, store_address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Leases are renewed `BEAT_CHUNK` trials a statement: every chunk's trials, and only the
    worker's own, whatever chunk each falls in."""
    monkeypatch.setattr(queue, "BEAT_CHUNK", 2)
    store = Store(store_address)
    store.record_plan(
        "r1", "run", {}, tmp_path, [PlannedTrial("ds", f"t{i}", "h", 1) for i in range(5)]
    )
    ids = [trial.id for trial in store.trials("r1")]
    for n, trial in enumerate(ids):
        store.claim(trial, "gw1@elsewhere:2" if n == 3 else "gw0@elsewhere:1", -1)
    beats = store.heartbeats([*ids, "no-such-trial"], "gw0@elsewhere:1", 30)
    assert beats == {**dict.fromkeys(ids, "leased"), ids[3]: None, "no-such-trial": None}
    assert store.stale_trials("r1", lambda owner: True) == [ids[3]]  # only its lease expired


def test_an_expired_lease_is_stale_even_if_its_owner_may_live(
    tmp_path: Path, store_address: str
) -> None:
    store = Store(store_address)
    store.record_plan("r1", "run", {}, tmp_path, PLAN[:1])
    (trial,) = store.trials("r1")
    store.claim(trial.id, "gw0@elsewhere:1", -1)
    assert store.stale_trials("r1", lambda owner: True) == [trial.id]
    assert store.runnable_runs(lambda owner: True) == ["r1"]


def test_replacing_a_trial_links_a_new_attempt_row_and_queues_its_job(
    tmp_path: Path, store_address: str
) -> None:
    store = Store(store_address)
    store.record_plan("r1", "run", {}, tmp_path, PLAN)
    first, second = store.trials("r1")
    store.claim(first.id, "w", 30)
    again = store.replace_trial(first.id, retry=True)
    assert (again.replaces, again.retries, again.item_id) == (first.id, 1, first.item_id)
    assert again.seq == 2 and again.status == "planned"
    assert [t.id for t in store.trials("r1")] == [again.id, second.id]  # in its trial's place
    assert [t.status for t in store.trials("r1", history=True)] == [
        "replaced",
        "planned",
        "planned",
    ]
    assert [t.id for t in store.trials("r1", history=True)] == [first.id, again.id, second.id]
    assert store.job_state(again.id) == "queued" and store.job_state(first.id) == "replaced"
    assert store.replace_trial(again.id, retry=False).retries == 1  # a resume is no retry


def test_cancel_run_cancels_queued_now_and_asks_live_runners(
    tmp_path: Path, store_address: str
) -> None:
    store = Store(store_address)
    store.record_plan("r1", "run", {}, tmp_path, PLAN)
    running, queued = store.trials("r1")
    store.claim(running.id, "w", 30)
    assert store.cancel_run("r1", lambda owner: True) == (1, 1)
    assert store.job_state(running.id) == "cancelling"
    assert store.heartbeat(running.id, "w", 30) == "cancelling"
    assert store.trial(queued.id).outcome == "cancelled"
    assert store.trial(queued.id).is_finished
    assert store.cancel_trials([running.id], "stopped") == 1
    assert store.run("r1").status == "cancelled"
    assert store.runnable_runs(lambda owner: True) == []


def test_a_dead_runners_trials_are_cancelled_at_once(tmp_path: Path, store_address: str) -> None:
    store = Store(store_address)
    store.record_plan("r1", "run", {}, tmp_path, PLAN[:1])
    (trial,) = store.trials("r1")
    store.claim(trial.id, "w", 30)
    assert store.cancel_run("r1", lambda owner: False) == (1, 0)
    assert store.trial(trial.id).status == "cancelled"


def test_a_sqlite_store_is_in_wal_mode(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    assert sql(store, "PRAGMA journal_mode")[0][0] == "wal"
    assert store.path == tmp_path / "s.db" and store.address == str(tmp_path / "s.db")


def test_an_older_store_is_brought_forward_and_its_runs_stay_readable(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    load_sqlite_dump(path, 2)  # a store HEMRA's schema 2 wrote (tests/stores/)
    again = Store(path)
    assert [t.item_id for t in again.trials(OLD_RUN)] == [p.item_id for p in OLD_PLAN]
    assert sql(again, "SELECT count(*) FROM trials WHERE plan_seq = seq")[0][0] == 4
    columns = {column["name"] for column in inspect(again.engine).get_columns("trials")}
    assert inspect(again.engine).has_table("steps") and "error_class" in columns
    assert sql(again, "SELECT value FROM meta")[0][0] == str(SCHEMA_VERSION)
    assert sql(again, "SELECT count(*) FROM events WHERE kind = 'migrated'")[0][0]


def test_a_store_too_old_to_migrate_is_refused_clearly(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = Store(path)
    sql(store, "UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    store.close()
    with pytest.raises(StoreError, match=r"s.db: store schema 1, expected \d+"):
        Store(path)


def test_a_shared_board_lock_holds_up_no_other_writer_and_one_holder_at_a_time(
    tmp_path: Path, store_address: str
) -> None:
    import threading
    import time

    store = Store(store_address)
    store.record_plan("r1", "run", {}, tmp_path, PLAN)
    other = Store(store.address)
    entered: list[str] = []
    with store.locked_shared_board("r1", "harbor", owner="a@here:1") as board:
        board.jobs.append({"name": "job-1"})
        # another process writes at once while the board is held (a heartbeat, a result)
        (trial,) = [t for t in other.trials("r1") if t.attempt == 1]
        assert other.claim(trial.id, "w", 30).state == "leased"

        def second() -> None:
            with other.locked_shared_board("r1", "harbor", owner="b@here:2") as seen:
                entered.append(",".join(job["name"] for job in seen.jobs))

        waiter = threading.Thread(target=second)
        waiter.start()
        time.sleep(0.5)
        assert entered == []  # the second holder waits for the first
    waiter.join(10)
    assert entered == ["job-1"]  # and then sees what the first wrote back
    assert store.count("shared_locks") == 0


def test_a_dead_holders_board_lock_is_taken_over(tmp_path: Path, store_address: str) -> None:
    import socket

    store = Store(store_address)
    store.record_plan("r1", "run", {}, tmp_path, PLAN)
    dead = f"main@{socket.gethostname()}:999999999"
    sql(
        store,
        "INSERT INTO shared_locks (id, owner, expires_at) VALUES (:id, :owner, :expires)",
        id="r1/harbor",
        owner=dead,
        expires=4e9,
    )
    with store.locked_shared_board("r1", "harbor", owner="a@here:1") as board:
        board.claims["job-1/trial"] = "r1.00001"
    assert store.shared_board("r1", "harbor").claims == {"job-1/trial": "r1.00001"}


def test_opening_and_closing_a_store_many_times_leaves_no_file_open(store_address: str) -> None:
    """Every connection a store opened (a file's, a server's socket) is closed with it."""
    Store(store_address).close()

    def open_files() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = open_files()
    for _ in range(200):
        with Store(store_address) as store:
            store.trials("none")
            store.record_event(None, None, "opened", {})
    assert open_files() <= before
