"""Concurrency: 40 trials whose harness sleeps 2 s, run by `pytest --hemra-run ... -n 4`.

The ideal is 40 * 2 / 4 = 20 s of sleeping plus each worker's share of the per-trial floor,
measured in the same run: one trial of the same task with a harness that does not sleep (image,
container, verifier, store), run by a serial `pytest --hemra-run` session of 4 trials. Printed:
the wall time of the -n 4 session, the ideal, and their ratio (target: at most 1.3).

    python benchmarks/concurrency.py [--trials 40] [--workers 4] [--sleep 2]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

BASE_IMAGE = "debian:bookworm-slim"


def write_dataset(root: Path, tasks: int, offline: bool = False) -> None:
    """`tasks` copies of a task a sleeping harness solves; `offline`: with no network at all
    (for engines that have no bridge network)."""
    network = "[environment]\nallow_internet = false\n" if offline else ""
    for n in range(tasks):
        task = root / "datasets" / "bench" / f"task-{n:02d}"
        (task / "environment").mkdir(parents=True)
        (task / "tests").mkdir()
        (task / "environment" / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nWORKDIR /app\n")
        (task / "instruction.md").write_text("Write hi to /app/out.txt.\n")
        (task / "task.toml").write_text(
            "[agent]\ntimeout_sec = 60\n[verifier]\ntimeout_sec = 30\n" + network
        )
        (task / "tests" / "test.sh").write_text(
            'if [ "$(cat /app/out.txt)" = hi ]; then echo 1; else echo 0; fi'
            " > /logs/verifier/reward.txt\n"
        )


def write_harness(root: Path, name: str, seconds: float) -> None:
    (root / "harnesses").mkdir(exist_ok=True)
    (root / "harnesses" / f"{name}.toml").write_text(
        textwrap.dedent(
            f"""\
            kind = "program"
            command = ["bash", "-c", "sleep {seconds}; echo hi > /app/out.txt"]
            """
        )
    )


def session(root: Path, harness: str, attempts: int, workers: int) -> float:
    run_file = root / f"{harness}.toml"
    run_file.write_text(f'harnesses = ["{harness}"]\ndatasets = ["bench"]\nattempts = {attempts}\n')
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--hemra-run"]
    argv += [str(run_file), *(["-n", str(workers)] if workers > 1 else [])]
    started = time.monotonic()
    done = subprocess.run(argv, cwd=root, capture_output=True, text=True)
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{harness}: pytest exited {done.returncode}\n{done.stdout[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--sleep", type=float, default=2.0)
    args = parser.parse_args()
    tasks = 10
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        write_dataset(root, tasks)
        write_harness(root, "sleeper", args.sleep)
        write_harness(root, "instant", 0)
        session(root, "instant", 1, 1)  # builds the task images once; not measured
        floor_trials = 4
        serial = session(root, "instant", floor_trials // tasks + 1, 1) / (
            (floor_trials // tasks + 1) * tasks
        )
        wall = session(root, "sleeper", args.trials // tasks, args.workers)
    ideal = args.trials * (args.sleep + serial) / args.workers
    print(f"per-trial floor (serial, no sleep): {serial:.2f} s")
    print(f"{args.trials} trials x {args.sleep:g} s on -n {args.workers}: {wall:.1f} s")
    print(f"ideal {args.trials}*({args.sleep:g}+floor)/{args.workers} = {ideal:.1f} s")
    print(f"ratio wall/ideal: {wall / ideal:.2f}x (target <= 1.30)")


if __name__ == "__main__":
    main()
