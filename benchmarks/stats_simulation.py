"""The paired comparison of a report checked by simulation, for pass/fail rewards.

For each cell (task difficulty x attempts per task x number of tasks) it draws `--datasets`
datasets of two harnesses and runs `stats.paired_difference` on each, as a report does:

- **null**: both harnesses pass each attempt with the task's own chance. The share of datasets
  with p < 0.05 should be 5%; the interval should hold 0 in 95% of them.
- **effect**: harness a fixes a share 0.2 of b's failures (chance p + 0.2 (1 - p)), so the true
  difference over the population of tasks is 0.2 (1 - E[p]). The interval should hold it in 95%.
- **disagree**: datasets whose interval excludes 0 while p >= 0.05, or holds 0 while p < 0.05
  (one table, two verdicts); it should be 0.

Each dataset draws its tasks afresh: a task's chance of passing from Beta(1, 1) (uniform
difficulty) or Beta(0.5, 2) (skewed: most tasks hard, a few easy; mean 0.2). `±` is the Monte Carlo
standard error of a rate, sqrt(r (1 - r) / datasets).

    python benchmarks/stats_simulation.py                        # 1,000 datasets per cell
    python benchmarks/stats_simulation.py --datasets 100         # quick
    python benchmarks/stats_simulation.py --tasks 20 --attempts 3 --difficulty skewed
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

import numpy as np
from tabulate import tabulate

from pytest_hemra.report.stats import paired_difference

LEVEL = 0.05
EFFECT = 0.2  # the share of b's failures a fixes in the effect datasets
DIFFICULTY = {"uniform": (1.0, 1.0), "skewed": (0.5, 2.0)}  # Beta(a, b) of a task's chance


@dataclass(frozen=True)
class Cell:
    difficulty: str
    attempts: int
    tasks: int


@dataclass(frozen=True)
class Rates:
    rejected: float  # null datasets with p < LEVEL
    null_coverage: float  # null datasets whose interval holds 0
    effect_coverage: float  # effect datasets whose interval holds the true difference
    disagree: int  # datasets (null and effect) where the interval and p-value disagree
    effect_width: float  # mean width of the interval in the effect datasets


def simulate(cell: Cell, datasets: int, rng: np.random.Generator) -> Rates:
    alpha, beta = DIFFICULTY[cell.difficulty]
    truth = EFFECT * (1 - alpha / (alpha + beta))
    rejected = null_held = effect_held = disagree = 0
    widths = 0.0
    for _ in range(datasets):
        chances = rng.beta(alpha, beta, cell.tasks)
        base = _rewards(rng, chances, cell.attempts)
        same = paired_difference(_rewards(rng, chances, cell.attempts), base)
        rejected += same.p_value < LEVEL
        null_held += same.low <= 0 <= same.high
        disagree += (same.p_value < LEVEL) == (same.low <= 0 <= same.high)
        better = chances + EFFECT * (1 - chances)
        moved = paired_difference(
            _rewards(rng, better, cell.attempts), _rewards(rng, chances, cell.attempts)
        )
        effect_held += moved.low <= truth <= moved.high
        disagree += (moved.p_value < LEVEL) == (moved.low <= 0 <= moved.high)
        widths += moved.high - moved.low
    return Rates(
        rejected / datasets,
        null_held / datasets,
        effect_held / datasets,
        disagree,
        widths / datasets,
    )


def _rewards(
    rng: np.random.Generator, chances: np.ndarray, attempts: int
) -> dict[str, list[float]]:
    passed = rng.random((len(chances), attempts)) < chances[:, None]
    return {f"task-{i}": [float(x) for x in row] for i, row in enumerate(passed)}


def _rate(rate: float, datasets: int) -> str:
    return f"{100 * rate:.1f} ± {100 * math.sqrt(rate * (1 - rate) / datasets):.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--datasets", type=int, default=1000, help="per cell (default 1000)")
    parser.add_argument("--tasks", type=int, nargs="+", default=[12, 20, 50, 89])
    parser.add_argument("--attempts", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--difficulty", nargs="+", choices=sorted(DIFFICULTY), default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    rows = []
    started = time.perf_counter()
    for difficulty in args.difficulty or list(DIFFICULTY):
        for attempts in args.attempts:
            for tasks in args.tasks:
                rates = simulate(Cell(difficulty, attempts, tasks), args.datasets, rng)
                rows.append(
                    [
                        difficulty,
                        attempts,
                        tasks,
                        _rate(rates.rejected, args.datasets),
                        _rate(rates.null_coverage, args.datasets),
                        _rate(rates.effect_coverage, args.datasets),
                        f"{rates.effect_width:.3f}",
                        rates.disagree,
                    ]
                )
    headers = [
        "difficulty",
        "attempts",
        "tasks",
        "null: p<0.05 %",
        "null: CI holds 0 %",
        "effect: CI holds truth %",
        "effect: CI width",
        "disagree",
    ]
    print(f"paired difference, pass/fail rewards, {args.datasets} datasets per cell")
    print(tabulate(rows, headers=headers, disable_numparse=True))
    print(f"{time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
