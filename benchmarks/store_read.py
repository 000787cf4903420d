"""Reading a big run back: `Store.trials` over 150,000 finished trials, as the report and the
viewer read them (every column of a trial, its JSON columns parsed, into `TrialRecord`s).

The run is recorded through the store (`record_plan`), then every trial is given a finished
result in one statement on the SQLite file (`finish_trial` one by one would take minutes and
measure the writes); the read is timed a few times, the best kept, beside the same rows fetched
by sqlite3 alone (what no mapping can go below).

    python benchmarks/store_read.py [--trials 150000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pytest_hemra.core.records import PlannedTrial  # noqa: E402
from pytest_hemra.store import Store  # noqa: E402

FINISHED = """
UPDATE trials SET status = 'finished', outcome = CASE WHEN seq % 3 = 0 THEN 'fail' ELSE 'pass' END,
  reward = CASE WHEN seq % 3 = 0 THEN 0.0 ELSE 1.0 END, rewards = '{"reward": 1.0}',
  exit_code = 0, error = NULL, started_at = 1.0, finished_at = 2.0, duration = 1.0,
  phases = '{"agent": 0.5, "verify": 0.5}', trial_dir = 'ds/task/trial', worker = 'main@host:1',
  calls = 3, input_tokens = 1200, output_tokens = 340, cache_read_tokens = 800,
  cache_write_tokens = 0, cost = 0.0123, cost_known = 1, usage_unknown = 0,
  models = '["claude-sonnet-4-5"]', other_model_tokens = 0,
  own_report = '{"input_tokens": 1200, "output_tokens": 340, "turns": 4}', judges = '{}'
"""

ROWS = "SELECT * FROM trials WHERE run_id = 'run' AND status != 'replaced' ORDER BY plan_seq, seq"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=150_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "hemra.db"
        store = Store(path)
        planned = [
            PlannedTrial("ds", f"task-{n // 10:05d}", f"harness-{n % 2}", n % 5 + 1)
            for n in range(args.trials)
        ]
        store.record_plan("run", "run", {}, Path(folder), planned)
        connection = sqlite3.connect(path)
        with connection:
            connection.execute(FINISHED)
        connection.close()
        best = float("inf")
        for _ in range(args.repeat):
            started = time.perf_counter()
            trials = store.trials("run")
            best = min(best, time.perf_counter() - started)
        assert len(trials) == args.trials and trials[1].reward == 1.0
        store.close()
        floor = float("inf")  # the same rows fetched by sqlite3 alone, no record made
        connection = sqlite3.connect(path)
        for _ in range(args.repeat):
            started = time.perf_counter()
            connection.execute(ROWS).fetchall()
            floor = min(floor, time.perf_counter() - started)
        connection.close()
    print(f"store.trials: {args.trials} trials read in {best:.2f} s (best of {args.repeat});")
    print(f"  the same rows fetched by sqlite3 alone, as tuples: {floor:.2f} s")


if __name__ == "__main__":
    main()
