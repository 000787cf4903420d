"""The viewer's API on a large store: 150,000 trials (30 harnesses x 1,000 tasks x 5 attempts).

Fills a store as `benchmarks/report.py` does (rewards from per-task difficulty), in plan order
(task, harness, attempt), with a few infra errors, running and planned trials, then serves it
with the real viewer on loopback and times what the run page asks for: its first response (the
page, the run and the first page of trials), pages of trials deep in the run, by cursor and
with filters, and the report (built once per state of the run, then cached). Target: the run
page's first response and each page of trials under 300 ms.

    python benchmarks/viewer.py [--harnesses 30] [--tasks 1000] [--attempts 5]
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from pytest_hemra.core.records import PlannedTrial
from pytest_hemra.store import Store
from pytest_hemra.viewer.server import ViewerThread

TARGET = 0.300
RUN = "bench"


def fill(store: Store, harnesses: int, tasks: int, attempts: int) -> None:
    names = [f"h{n:02d}" for n in range(harnesses)]
    task_names = [f"task-{t:04d}" for t in range(tasks)]
    spec = {
        "spec": {"harnesses": names, "baseline": names[0], "model": "m", "attempts": attempts},
        "datasets": {"bench": {"digest": "0" * 64, "path": "/nowhere", "tasks": task_names}},
        "harnesses": {name: {"digest": "1" * 64} for name in names},
    }
    plan = [
        PlannedTrial("bench", task, name, a)
        for task in task_names
        for name in names
        for a in range(1, attempts + 1)
    ]
    store.record_plan(RUN, "bench", spec, store.path.parent / "runs" / RUN, plan)
    rng = random.Random(0)
    difficulty = [rng.random() for _ in range(tasks)]
    skill = {name: rng.uniform(-0.2, 0.2) for name in names}
    rows = []
    for seq, trial in enumerate(plan[: len(plan) - 200]):  # the last 200: still planned
        chance = difficulty[int(trial.task[5:])] + skill[trial.harness]
        passed = rng.random() < chance
        outcome = "infra_error" if seq % 997 == 0 else "pass" if passed else "fail"
        error = "docker: the engine does not answer" if outcome == "infra_error" else None
        rows.append((
            outcome, None if error else float(passed), error, rng.randint(1000, 90000),
            rng.random() / 10, rng.uniform(5, 300), f"{RUN}.{seq:05d}",
        ))  # fmt: skip
    connection = sqlite3.connect(str(store.path))  # the file, written past the store's API
    with connection:
        connection.executemany(
            "UPDATE trials SET status = 'finished', outcome = ?, reward = ?, error = ?,"
            " input_tokens = ?, cost = ?, cost_known = 1, duration = ?, rewards = '{}'"
            " WHERE id = ?",
            rows,
        )
        connection.execute(
            "UPDATE trials SET status = 'running', outcome = NULL, reward = NULL"
            " WHERE run_id = ? AND seq >= ? AND seq < ?",
            [RUN, len(plan) - 220, len(plan) - 200],
        )
    connection.close()


def timed(connection: http.client.HTTPConnection, path: str) -> tuple[float, Any]:
    started = time.perf_counter()
    connection.request("GET", path)
    response = connection.getresponse()
    body = response.read()
    elapsed = time.perf_counter() - started
    if response.status != 200:
        raise SystemExit(f"GET {path}: HTTP {response.status}, expected 200: {body[:200]!r}")
    is_json = response.getheader("Content-Type", "").startswith("application/json")
    return elapsed, json.loads(body) if is_json else body


def best(connection: http.client.HTTPConnection, path: str, times: int = 5) -> float:
    return statistics.median(timed(connection, path)[0] for _ in range(times))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--harnesses", type=int, default=30)
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--attempts", type=int, default=5)
    args = parser.parse_args()
    total = args.harnesses * args.tasks * args.attempts
    with tempfile.TemporaryDirectory() as scratch:
        store = Store(Path(scratch) / "big.db")
        started = time.perf_counter()
        fill(store, args.harnesses, args.tasks, args.attempts)
        print(f"{total} trials recorded in {time.perf_counter() - started:.1f} s")
        store.close()
        viewer = ViewerThread(Path(scratch) / "big.db", "127.0.0.1", 0)
        viewer.start()
        try:
            measure(viewer.port, total)
        finally:
            viewer.stop()


def measure(port: int, total: int) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    trials = f"/api/runs/{RUN}/trials"
    first = [f"/runs/{RUN}", f"/api/runs/{RUN}", f"{trials}?limit=300"]
    timed(connection, "/api/runs")  # the first request opens the worker threads' stores
    rows: list[tuple[str, float]] = []
    cold = [timed(connection, path)[0] for path in first]
    rows.append(("run page, first response, cold (page + run + trials)", sum(cold)))
    rows.append(("run page, first response, median of 5", sum(best(connection, p) for p in first)))
    rows.append(("GET /api/runs (every run with its progress)", best(connection, "/api/runs")))
    for label, query in (
        ("trials page 1 (300)", "limit=300"),
        ("trials page at offset 75,000", "limit=300&offset=75000"),
        ("trials last page by offset", f"limit=300&offset={total - 300}"),
        ("trials filtered: harness=h07", "limit=300&harness=h07"),
        ("trials filtered: outcome=fail", "limit=300&outcome=fail"),
        ("trials filtered: outcome=infra_error (rare)", "limit=300&outcome=infra_error"),
        ("trials filtered: outcome=running", "limit=300&outcome=running"),
        ("trials filtered: task=task-0500", "limit=300&task=task-0500"),
        ("trials filtered: text=task-0999", "limit=300&text=task-0999"),
        ("trials filtered: text=engine (in errors)", "limit=300&text=engine"),
        ("trials: harness=h29, outcome=pass, offset 2,000", "limit=300&harness=h29&outcome=pass"
         "&offset=2000"),
    ):  # fmt: skip
        rows.append((label, best(connection, f"{trials}?{query}")))
    cursor, pages = None, []
    for _ in range(20):
        path = f"{trials}?limit=300" + (f"&cursor={cursor}" if cursor else "")
        elapsed, page = timed(connection, path)
        pages.append(elapsed)
        cursor = page["next_cursor"]
    rows.append(("trials by cursor, 20 pages: the slowest", max(pages)))
    report_cold, _ = timed(connection, f"/api/runs/{RUN}/report")
    report_warm = best(connection, f"/api/runs/{RUN}/report")
    data = timed(connection, f"/api/runs/{RUN}/report")[1]
    width = max(len(label) for label, _ in rows)
    print(f"{'request':<{width}}  ms     target {TARGET * 1000:.0f} ms")
    for label, seconds in rows:
        verdict = "met" if seconds < TARGET else "NOT met"
        print(f"{label:<{width}}  {seconds * 1000:6.1f} {verdict}")
    kept = "from the cache" if data.get("cached") else "NOT cached"
    print(
        f"report (asked apart from the first response): {report_cold:.2f} s to build in a worker"
        f" thread, then {report_warm * 1000:.1f} ms {kept} until a trial finishes"
    )
    worst = max(seconds for _, seconds in rows)
    verdict = "met" if worst < TARGET else "NOT met"
    print(f"slowest: {worst * 1000:.1f} ms; target < 300 ms: {verdict}")


if __name__ == "__main__":
    main()
