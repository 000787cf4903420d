"""`hemra report` on a large store: 150,000 trials (30 harnesses x 1,000 tasks x 5 attempts).

Fills a store with synthetic finished trials (rewards drawn from per-task difficulty, so tasks
differ) of a closed run, then times building and rendering its report from every trial (as at
the run's end, or after any of its trials changed), apart from it reading the rows alone and the
variance decomposition alone (the parts that time splits into), and `hemra report` of the run
once its report is kept (`report/snapshot.py`: every later report of a closed run). Target
(issue 30): under 1 s.

    python benchmarks/report.py [--harnesses 30] [--tasks 1000] [--attempts 5]
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import tempfile
import time
from pathlib import Path

from pytest_hemra.core.outcome import Outcome
from pytest_hemra.core.records import PlannedTrial
from pytest_hemra.report.formats import render_text
from pytest_hemra.report.snapshot import report_of
from pytest_hemra.report.tables import build_report
from pytest_hemra.report.variance import Observation, decompose
from pytest_hemra.store import Store

TARGET = 1.0  # seconds, issue 30


def fill(store: Store, harnesses: int, tasks: int, attempts: int) -> str:
    names = [f"h{n:02d}" for n in range(harnesses)]
    spec = {
        "spec": {"harnesses": names, "baseline": names[0], "model": "m"},
        "datasets": {
            "bench": {"digest": "0" * 64, "path": "/nowhere", "tasks": list(range(tasks))}
        },
        "harnesses": {name: {"digest": "1" * 64} for name in names},
    }
    plan = [
        PlannedTrial("bench", f"task-{t:04d}", name, a)
        for name in names
        for t in range(tasks)
        for a in range(1, attempts + 1)
    ]
    store.record_plan("bench", "bench", spec, store.path.parent, plan)
    rng = random.Random(0)
    difficulty = [rng.random() for _ in range(tasks)]
    skill = {name: rng.uniform(-0.2, 0.2) for name in names}
    rows = []
    for seq, trial in enumerate(plan):
        chance = difficulty[int(trial.task[5:])] + skill[trial.harness]
        passed = rng.random() < chance
        rows.append((
            "pass" if passed else "fail", float(passed), rng.randint(1000, 90000),
            rng.random() / 10, rng.uniform(5, 300), f"bench.{seq:05d}",
        ))  # fmt: skip
    connection = sqlite3.connect(str(store.path))  # the file, written past the store's API
    with connection:
        connection.executemany(
            "UPDATE trials SET status = 'finished', outcome = ?, reward = ?, input_tokens = ?,"
            " cost = ?, cost_known = 1, duration = ?, rewards = '{}' WHERE id = ?",
            rows,
        )
        connection.execute("UPDATE runs SET status = 'finished' WHERE id = 'bench'")
    connection.close()
    return "bench"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--harnesses", type=int, default=30)
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--attempts", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        store = Store(Path(scratch) / "big.db")
        run_id = fill(store, args.harnesses, args.tasks, args.attempts)
        total = args.harnesses * args.tasks * args.attempts
        started = time.perf_counter()
        trials = store.trials(run_id)
        loaded = time.perf_counter() - started
        scored = [t for t in trials if t.outcome in Outcome.SCORED]
        observations = [Observation(t.task, t.harness, "m", t.reward or 0.0) for t in scored]
        started = time.perf_counter()
        variance = decompose(observations, "h00", "m")
        fitted = time.perf_counter() - started
        times, cpu = [], []
        for _ in range(3):
            started, used = time.perf_counter(), time.process_time()
            text = render_text(build_report(store, run_id))  # built from every trial
            times.append(time.perf_counter() - started)
            cpu.append(time.process_time() - used)
        report_of(store, run_id)  # kept, as at the run's end (the terminal summary)
        kept, kept_cpu = [], []
        for _ in range(3):
            started, used = time.perf_counter(), time.process_time()
            again = render_text(report_of(store, run_id))  # what `hemra report` does
            kept.append(time.perf_counter() - started)
            kept_cpu.append(time.process_time() - used)
    best, best_kept = min(times), min(kept)
    print(f"{total} trials ({len(trials)} rows read alone in {loaded:.2f} s)")
    print(f"variance decomposition alone: {fitted:.2f} s ({variance.method})")
    print(
        f"report built from every trial (read, statistics, render), best of 3: {best:.2f} s,"
        f" of which {best - loaded:.2f} s past reading the rows ({len(text.splitlines())} lines)"
    )
    print(
        f"hemra report of the closed run (its report as kept), best of 3: {best_kept:.3f} s"
        f" ({best / best_kept:.0f}x faster); target < {TARGET:g} s:"
        f" {'met' if best_kept < TARGET else 'NOT met'} ({len(again.splitlines())} lines)"
    )
    # on a machine shared with other work the wall time is what it leaves over; the CPU time
    # the report took is steadier
    print(f"  CPU time, best of 3: built {min(cpu):.2f} s, kept {min(kept_cpu):.3f} s")


if __name__ == "__main__":
    main()
