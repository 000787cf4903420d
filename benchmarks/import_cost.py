"""What installing HEMRA costs a pytest session that does not use it, and what `hemra --help` costs.

An unrelated project with one test runs `pytest -q` with HEMRA installed and again with
`-p no:hemra`, in pairs (the order alternating), measured in the same run; it prints both
medians and the median of the paired ratios. Target: at most 1.1x.

Then `hemra --help`: the seconds spent importing (`python -X importtime`, every top-level
import's cumulative time, minus what a bare `python -c pass` imports) and its wall time.
Target: under 0.3 s of imports.

Last, what a process of a run imports beyond pytest and pytest-xdist: an xdist worker
(`plugin/worker.py`: what runs trials, no report) and the controller (`plugin/controller.py`:
resolve, record, report), each in a fresh interpreter, timed in the process, with bytecode
cached (as a pip install has it; the first run writes it) and in this environment as it is
(on this machine PYTHONDONTWRITEBYTECODE is set: the editable install's modules, HEMRA's, are
compiled from source at every start; installed packages' bytecode is still read).
Target for a worker: at most 0.5 s (issue 29 measured the whole plugin, which every worker
imported, at 3.4-4.4 s on a loaded machine).

    python benchmarks/import_cost.py [--runs 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from concurrency import with_bytecode  # this folder's: its sessions' environment

ONE_TEST = "def test_one():\n    assert 1 + 1 == 2\n"
HELP = "import sys; sys.argv = ['hemra', '--help']; from pytest_hemra.cli import main; main()"
ROLES = {  # a run's processes: what each imports
    "xdist worker": "pytest_hemra.plugin.worker",
    "controller": "pytest_hemra.plugin.controller",
}


def wall(argv: list[str], cwd: Path | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - start


def import_secs(code: str) -> float:
    """Seconds of imports `python -X importtime -c code` reports (top-level modules only)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, check=True
    )
    total = 0
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line[len("import time:") :].split("|", 2)
        if not name.startswith("  "):  # nested imports are counted in their parent's time
            total += int(cumulative)
    return total / 1e6


def role_secs(module: str, env: dict[str, str] | None) -> float:
    """Seconds a fresh interpreter spends importing `module` after pytest and pytest-xdist,
    timed in the process (`-X importtime` adds its own cost to every import)."""
    code = (
        "import time, pytest, xdist; started = time.perf_counter(); "
        f"import {module}; print(time.perf_counter() - started)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return float(done.stdout)


def pytest_pairs(runs: int) -> tuple[list[float], list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        (project / "test_one.py").write_text(ONE_TEST)
        (project / "pytest.ini").write_text("[pytest]\n")
        base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        with_hemra: list[float] = []
        without: list[float] = []
        wall(base, project)  # warm the file cache and the bytecode
        for n in range(runs):  # alternate which goes first, so drift hits both alike
            if n % 2:
                without.append(wall([*base, "-p", "no:hemra"], project))
            with_hemra.append(wall(base, project))
            if not n % 2:
                without.append(wall([*base, "-p", "no:hemra"], project))
        return with_hemra, without


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()

    with_hemra, without = pytest_pairs(args.runs)
    ratio = statistics.median(a / b for a, b in zip(with_hemra, without, strict=True))
    print(f"pytest, one test, median of {args.runs} pairs:")
    print(f"  with HEMRA installed   {statistics.median(with_hemra):.3f} s")
    print(f"  with -p no:hemra       {statistics.median(without):.3f} s")
    print(f"  ratio                  {ratio:.2f}x (target <= 1.1x)")

    bare = statistics.median(import_secs("pass") for _ in range(args.runs))
    imports = statistics.median(import_secs(HELP) for _ in range(args.runs)) - bare
    help_wall = statistics.median(
        wall([sys.executable, "-c", HELP]) for _ in range(args.runs)
    ) - statistics.median(wall([sys.executable, "-c", "pass"]) for _ in range(args.runs))
    print("hemra --help:")
    print(f"  imports                {imports:.3f} s (target < 0.3 s)")
    print(f"  wall over bare python  {help_wall:.3f} s")
    print("a run's processes, importing HEMRA's part once pytest and pytest-xdist are loaded")
    print("(wall time in the process, median of the runs):")
    here = "this environment" + (
        " (PYTHONDONTWRITEBYTECODE: an editable install's modules compiled at each start)"
        if os.environ.get("PYTHONDONTWRITEBYTECODE")
        else ""
    )
    with tempfile.TemporaryDirectory() as cached:
        conditions = {"bytecode cached, as installed": with_bytecode(Path(cached)), here: None}
        for role, module in ROLES.items():
            target = " (target <= 0.5 s)" if role == "xdist worker" else ""
            for condition, env in conditions.items():
                for _ in range(3):  # the cache written, the files read once: not measured
                    role_secs(module, env)
                secs = statistics.median(role_secs(module, env) for _ in range(args.runs))
                print(f"  {role:<14} {secs:.3f} s  {condition}{target}")


if __name__ == "__main__":
    main()
