"""Engines: 40 trials whose harness sleeps, over one Docker engine and over three.

The one engine is this machine's; the three are it and two more dockerd processes started here
(tests/dockerd.py: each in its own network namespace, reached at its own loopback address). Each
engine has the same capacity (slots), and the session has as many xdist workers as the pool has
slots, so three engines run three times as many trials at once. Task images are built on every
engine first (not measured). Printed: both wall times and their ratio; the ideal is 3.0, less
what the machine itself shares between the three (its CPUs, one runner, one store).

    python benchmarks/engines.py [--trials 40] [--capacity 2] [--sleep 3]   # as root
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(REPO / "benchmarks"))

from concurrency import write_dataset, write_harness  # noqa: E402

from pytest_hemra.store import Store  # noqa: E402
from tests.dockerd import ExtraEngine, free_loopback_hosts  # noqa: E402

MAIN = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
TASKS = 10


def session(
    root: Path, name: str, harness: str, attempts: int, engines: list[tuple[str, str]], slots: int
) -> tuple[float, float]:
    """One pytest session over `engines` (name, address), `slots` each: its wall time and its
    trials' mean duration."""
    pool = "".join(
        textwrap.dedent(
            f"""
            [[sandbox.engines]]
            name = "{engine}"
            address = "{address}"
            capacity = {slots}
            """
        )
        for engine, address in engines
    )
    run_file = root / f"{name}.toml"
    run_file.write_text(
        f'name = "{name}"\nharnesses = ["{harness}"]\ndatasets = ["bench"]\n'
        f"attempts = {attempts}\n{pool}"
    )
    workers = slots * len(engines)
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--hemra-run"]
    argv += [str(run_file), "-n", str(workers)]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    started = time.monotonic()
    done = subprocess.run(argv, cwd=root, capture_output=True, text=True, env=env)
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{name}: pytest exited {done.returncode}\n{done.stdout[-3000:]}")
    store = Store(root / ".hemra" / "hemra.db")
    (run,) = [run for run in store.runs() if run.name == name]
    durations = [t.duration or 0.0 for t in store.trials(run.id)]
    store.close()
    return elapsed, sum(durations) / len(durations)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--capacity", type=int, default=2, help="slots per engine")
    parser.add_argument("--sleep", type=float, default=3.0)
    args = parser.parse_args()
    extra = [ExtraEngine(host) for host in free_loopback_hosts(2)]
    try:
        for engine in extra:
            engine.start()
        pool = [("main", MAIN), ("b", extra[0].address), ("c", extra[1].address)]
        with tempfile.TemporaryDirectory() as scratch:
            root = Path(scratch)
            write_dataset(root, TASKS, offline=True)  # the extra engines have no bridge
            write_harness(root, "sleeper", args.sleep)
            write_harness(root, "instant", 0)
            for engine in pool:  # every task image on every engine; not measured
                session(root, f"warm-{engine[0]}", "instant", 1, [engine], args.capacity)
            attempts = args.trials // TASKS
            one, one_trial = session(root, "one", "sleeper", attempts, pool[:1], args.capacity)
            three, three_trial = session(root, "three", "sleeper", attempts, pool, args.capacity)
    finally:
        for engine in extra:
            engine.remove()
    trials = attempts * TASKS
    print(f"{trials} trials x {args.sleep:g} s sleep, {args.capacity} slots per engine")
    print(f"one engine    (-n {args.capacity}): {one:.1f} s (a trial: {one_trial:.2f} s)")
    print(f"three engines (-n {3 * args.capacity}): {three:.1f} s (a trial: {three_trial:.2f} s)")
    print(f"ratio one/three: {one / three:.2f}x (ideal 3.00x)")


if __name__ == "__main__":
    main()
