"""A harbor-oracle trial (Harbor running its own oracle) against HEMRA's oracle, per trial.

Runs examples/harbor.toml (both harnesses on the 6 hemra-offline tasks) through pytest into
a scratch store, then prints each harness's mean trial duration and mean phases, and the
run's wall time. The runner image must be built already (`hemra harness install
harbor-oracle`), so its one-time build is not measured.

    python benchmarks/harbor_trial.py [--concurrency 2]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pytest_hemra.store import Store

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        run_file = Path(scratch) / "run.toml"
        text = (REPO / "examples" / "harbor.toml").read_text()
        run_file.write_text(text.replace("concurrency = 2", f"concurrency = {args.concurrency}"))
        store_path = Path(scratch) / "bench.db"
        started = time.monotonic()
        argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"]
        argv += ["--hemra-run", str(run_file), "--hemra-store", str(store_path)]
        done = subprocess.run(argv, capture_output=True, text=True, cwd=scratch)
        wall = time.monotonic() - started
        if done.returncode != 0:
            sys.exit(done.stdout[-2000:] + done.stderr[-2000:])
        store = Store(store_path)
        (run,) = store.runs()
        trials = store.trials(run.id)
        print(f"concurrency {args.concurrency}: {len(trials)} trials in {wall:.1f} s wall")
        for harness in ("oracle", "harbor-oracle"):
            mine = [t for t in trials if t.harness == harness]
            durations = [t.duration or 0.0 for t in mine]
            phases: dict[str, list[float]] = {}
            for trial in mine:
                for name, seconds in store.trial_detail(trial.id).phases.items():
                    phases.setdefault(name, []).append(seconds)
            shown = ", ".join(f"{n} {statistics.mean(v):.2f}" for n, v in sorted(phases.items()))
            print(f"{harness:14} {statistics.mean(durations):.2f} s a trial ({shown})")


if __name__ == "__main__":
    main()
