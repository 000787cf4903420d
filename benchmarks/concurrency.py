"""Concurrency: many sleeping trials at once from one runner.

For each level N (default 16, 64 and 200), N trials whose harness sleeps 10 s are run by one
`pytest --hemra-run` process with `concurrency = N` (threads: `run/lanes.py`). Printed per
level: the wall time, the ideal (one wave: the sleep plus the per-trial floor, measured in the
same run as one trial of the same task with a harness that does not sleep, run serially), their
ratio (targets: at most 1.3 at 64, 2.0 at 200), the runner's peak memory (every process of the
session, sampled; target: under 1 GB at 200), the JUnit testcases and the store's rows (each
trial once), and the plain-Docker floor at N: N containers of the same image created, started
and removed with force at once through the Docker SDK, the engine's own cost before any of
HEMRA's; and Docker alone running N containers that each sleep as long as the trials' harness
(created, started, waited for, removed: no exec, no file copied), the least N sleeping trials
in Docker sandboxes can take on this machine, as a ratio to the ideal.

HEMRA and Docker alone sleeping are measured in `--rounds` pairs (default 3), which goes first
alternating, each pair's ratio printed and their median: on this 2-core machine one pair's
ratio at 64 ranged 1.29-1.49x within an hour, so one pair is not a measurement.
The sessions run with bytecode cached (`with_bytecode`) and the runner's memory is sampled
cheaply (`tree_rss`), so neither charges HEMRA's side with what a user's run does not pay.

`--before` also runs 64 trials the way a runner did before lanes: `-n 16` workers, one trial at
once each.

`--offline` runs tasks without internet (their sandboxes on `hemra-gateway`).

    python benchmarks/concurrency.py [--levels 16 64 200] [--sleep 10] [--rounds 3] [--before]
        [--offline]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

BASE_IMAGE = "debian:bookworm-slim"
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def write_dataset(root: Path, tasks: int, offline: bool = False) -> None:
    """`tasks` copies of a task a sleeping harness solves; `offline`: without internet (on
    `hemra-gateway`; an engine without HEMRA's networks gives them none)."""
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


def tree_rss(root_pid: int) -> int:
    """Resident memory of a process and all its descendants, in bytes: one read of each
    process's `stat` (its parent and resident pages), so that sampling, every half second,
    takes little of the CPU the engine and the runner share (reading `status` too, every 0.2 s,
    took 1.8 s of CPU in a 64-trial run here, which Docker alone's runs never paid)."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
        rss[int(entry.name)] = int(fields[21]) * PAGE_BYTES
    wanted, total = {root_pid}, 0
    changed = True
    while changed:
        changed = False
        for pid, parent in parents.items():
            if parent in wanted and pid not in wanted:
                wanted.add(pid)
                changed = True
    for pid in wanted:
        total += rss.get(pid, 0)
    return total


def with_bytecode(prefix: Path) -> dict[str, str]:
    """This environment with modules' bytecode written under `prefix` and read back from it, as
    a user's install has it (pip compiles a wheel's modules as it installs them): where
    PYTHONDONTWRITEBYTECODE is set (this machine, CI images), every session compiled HEMRA's
    modules from source again, 0.2-0.3 s of each session's start that no user pays. Here the
    unmeasured first session writes it."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(prefix)
    return env


def session(
    root: Path, harness: str, trials: int, concurrency: int, workers: int = 1
) -> tuple[float, int]:
    """One pytest session of `trials` trials (one task each); its wall time and peak memory."""
    run_file = root / f"{harness}-{trials}-{concurrency}-{workers}.toml"
    names = ", ".join(f'"task-{n:02d}"' for n in range(trials))
    run_file.write_text(
        f'harnesses = ["{harness}"]\ndatasets = ["bench"]\nattempts = 1\n'
        f"concurrency = {concurrency}\ntasks = [{names}]\n"
    )
    junit = root / f"{run_file.stem}.xml"
    # hypothesis is this project's dev dependency, not HEMRA's: its pytest plugin imports all of
    # hypothesis at every session's end (1.0-1.4 s here), which a user's session without it
    # does not pay
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:hypothesispytest"]
    argv += ["-q", "--hemra-run"]
    argv += [str(run_file), f"--junitxml={junit}"]
    argv += ["-n", str(workers)] if workers > 1 else []
    started = time.monotonic()
    child = subprocess.Popen(
        argv,
        cwd=root,
        env=with_bytecode(root / "pycache"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.5):
            peak = max(peak, tree_rss(child.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, _ = child.communicate()
    elapsed = time.monotonic() - started
    done.set()
    sampler.join()
    if child.returncode != 0:
        raise SystemExit(f"{harness}: pytest exited {child.returncode}\n{out.decode()[-3000:]}")
    cases = ET.parse(junit).getroot().iter("testcase")
    names = [c.get("name") for c in cases]
    if len(names) != trials or len(set(names)) != trials:
        raise SystemExit(
            f"{junit}: {len(names)} testcases ({len(set(names))} distinct), not {trials}"
        )
    return elapsed, peak


def check_store(root: Path, trials: int) -> str:
    """The latest run's rows: each trial once, every one finished."""
    db = sqlite3.connect(root / ".hemra" / "hemra.db")
    (run,) = db.execute("SELECT id FROM runs ORDER BY created_at DESC LIMIT 1").fetchone()
    rows = db.execute(
        "SELECT item_id, status, outcome FROM trials WHERE run_id = ? AND status != 'replaced'",
        [run],
    ).fetchall()
    items = {item for item, _, _ in rows}
    passed = sum(1 for _, status, outcome in rows if status == "finished" and outcome == "pass")
    if len(rows) != trials or len(items) != trials:
        raise SystemExit(f"run {run}: {len(rows)} current rows for {len(items)} items")
    return f"{passed}/{trials} passed, each once"


def docker_floor(count: int, seconds: float = 0.0) -> float:
    """`count` containers created, started and removed with force at once (SDK, threads); with
    `seconds`, each runs `sleep <seconds>` and is removed once it has exited: Docker's own time
    for `count` sleeping trials, before anything of HEMRA's (no exec, no file copied)."""
    import docker

    client = docker.from_env(timeout=300, max_pool_size=count)
    command = ["sleep", f"{seconds:g}"] if seconds else ["sleep", "infinity"]

    def one(_: int) -> None:
        container = client.containers.create(BASE_IMAGE, command, labels={"hemra-bench": "1"})
        container.start()
        if seconds:
            container.wait()
        container.remove(force=True)

    started = time.monotonic()
    with ThreadPoolExecutor(count) as pool:
        list(pool.map(one, range(count)))
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--levels", type=int, nargs="+", default=[16, 64, 200])
    parser.add_argument("--sleep", type=float, default=10.0)
    parser.add_argument("--before", action="store_true", help="also 64 trials on -n 16")
    parser.add_argument("--offline", action="store_true", help="tasks without internet")
    parser.add_argument("--rounds", type=int, default=3, help="HEMRA and Docker alone, in pairs")
    parser.add_argument("--settle", type=float, default=15.0, help="seconds before each run")
    args = parser.parse_args()
    tasks = max([*args.levels, 64])
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        write_dataset(root, tasks, offline=args.offline)
        write_harness(root, "sleeper", args.sleep)
        write_harness(root, "instant", 0)
        session(root, "instant", 1, 1)  # builds the task image once; not measured
        floor_trials = 4
        serial = session(root, "instant", floor_trials, 1)[0] / floor_trials
        print(f"per-trial floor (serial, no sleep, session start included): {serial:.2f} s")
        print(f"cpus: {os.cpu_count()}; load before: {os.getloadavg()[0]:.1f}")
        if args.before:
            wall, peak = session(root, "sleeper", 64, 1, workers=16)
            ideal = 64 * (args.sleep + serial) / 16
            print(
                f"before (-n 16, one trial a worker): 64 trials {wall:.1f} s, ideal {ideal:.1f} s,"
                f" ratio {wall / ideal:.2f}x, peak memory {peak / 2**20:.0f} MiB"
            )
        for level in args.levels:
            floor = docker_floor(level)
            ideal = args.sleep + serial
            ratios, walls, alone, peaks = [], [], [], []
            for round_ in range(args.rounds):  # alternating which goes first: drift hits both
                measured: dict[str, Any] = {}
                for side in ("hemra", "alone") if round_ % 2 else ("alone", "hemra"):
                    time.sleep(args.settle)
                    measured[side] = (
                        session(root, "sleeper", level, level)
                        if side == "hemra"
                        else docker_floor(level, args.sleep)
                    )
                (wall, peak), sleeping = measured["hemra"], measured["alone"]
                walls.append(wall)
                alone.append(sleeping)
                peaks.append(peak)
                ratios.append(wall / sleeping)
                print(
                    f"concurrency {level}, round {round_ + 1}: {level} trials {wall:.1f} s;"
                    f" docker alone, {level} containers sleeping {args.sleep:g} s at once:"
                    f" {sleeping:.1f} s; HEMRA {wall / sleeping:.2f}x that;"
                    f" {check_store(root, level)}",
                    flush=True,
                )
            wall, sleeping = statistics.median(walls), statistics.median(alone)
            print(
                f"concurrency {level}: {level} trials {wall:.1f} s (median of {args.rounds}),"
                f" ideal {ideal:.1f} s, ratio {wall / ideal:.2f}x; peak memory"
                f" {max(peaks) / 2**20:.0f} MiB; plain docker at {level}: {floor:.1f} s"
                f" (sleep + docker floor {args.sleep + floor:.1f} s: ratio"
                f" {wall / (args.sleep + floor):.2f}x)"
            )
            print(
                f"  docker alone, {level} containers sleeping {args.sleep:g} s at once:"
                f" {sleeping:.1f} s = {sleeping / ideal:.2f}x the ideal (the engine's own"
                f" floor here); HEMRA / docker alone, median of {args.rounds} rounds:"
                f" {statistics.median(ratios):.2f}x (each: "
                + ", ".join(f"{r:.2f}" for r in ratios)
                + ")"
            )


if __name__ == "__main__":
    main()
