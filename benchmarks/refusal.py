"""How long `hemra run` takes to refuse input it cannot use, against the commands it should be
about as fast as: `hemra --version` (the command line alone) and `hemra run --dry-run` of a good
run file (everything resolved, nothing started), measured in the same run, in turns.

Each refusal is a run file a newcomer mistypes: a key (`attemps`), a harness (`oraclee`), a
dataset (`hemra-ofline`), and one the pytest session refuses (a harness needing an unset
variable, checked only once the session resolves the whole run). Each must exit 4 with one
`hemra: ...` line. It prints each command's median wall time and its ratio to `--dry-run`'s.
Target: every refusal under 2 s here (issue 31 measured 9.5-17 s on a loaded machine, where a
`--dry-run` took 1.7 s).

    python benchmarks/refusal.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

GOOD = 'harnesses = ["oracle", "nop"]\ndatasets = ["hemra-offline"]\n'
REFUSED = {
    "mistyped key": GOOD + "attemps = 2\n",
    "unknown harness": 'harnesses = ["oraclee"]\ndatasets = ["hemra-offline"]\n',
    "unknown dataset": 'harnesses = ["oracle"]\ndatasets = ["hemra-ofline"]\n',
    "unset variable": GOOD + 'verifier = { env = ["HEMRA_BENCHMARK_UNSET"] }\n',
}


def wall(folder: Path, *argv: str, expect: int) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("HEMRA_STORE", "PYTEST_ADDOPTS")}
    start = time.perf_counter()
    done = subprocess.run(["hemra", *argv], cwd=folder, env=env, capture_output=True, text=True)
    took = time.perf_counter() - start
    if done.returncode != expect:
        raise SystemExit(f"hemra {' '.join(argv)}: exit {done.returncode}\n{done.stderr}")
    if expect == 4 and not (done.stderr.startswith("hemra: ") and done.stderr.count("\n") == 1):
        raise SystemExit(f"hemra {' '.join(argv)}: not one 'hemra:' line:\n{done.stderr}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "good.toml").write_text(GOOD)
        commands = {
            "hemra --version": (["--version"], 0),
            "--dry-run": (["run", "good.toml", "--dry-run"], 0),
        }
        for what, text in REFUSED.items():
            (folder / f"{what.replace(' ', '-')}.toml").write_text(text)
            commands[f"refused: {what}"] = (["run", f"{what.replace(' ', '-')}.toml"], 4)
        for argv, expect in commands.values():  # warm the file cache and the bytecode
            wall(folder, *argv, expect=expect)
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.runs):  # in turns, so drift hits each alike
            for name, (argv, expect) in commands.items():
                times[name].append(wall(folder, *argv, expect=expect))
        baseline = statistics.median(times["--dry-run"])
        for name, took in times.items():
            median = statistics.median(took)
            print(f"{name:<26} {median:6.2f} s   {median / baseline:5.2f}x --dry-run")
        slowest = max(statistics.median(times[n]) for n in times if n.startswith("refused"))
        print(f"slowest refusal: {slowest:.2f} s (target: under 2 s)")


if __name__ == "__main__":
    main()
