"""A report's statistics checked by simulation on pass/fail rewards, in one table.

For each cell (task difficulty x number of tasks x attempts per task) it draws `--datasets`
datasets and computes, as a report does:

- **mean_ci**: the share of one harness's intervals that hold the mean chance of a task, E[p]
  (nominal 95%).
- **paired, null**: two harnesses with every task's chance in common; the share of datasets
  where `paired_difference` gives p < 0.05 (nominal 5%).
- **paired, effect**: harness a fixes a share 0.2 of b's failures (chance p + 0.2 (1 - p)); the
  share of intervals that hold the true difference 0.2 (1 - E[p]) (nominal 95%).
- **pass@k bias**: the mean over datasets of `mean_pass_at_k` with k = attempts, minus the truth
  E[1 - (1 - p)^k], in points (0 for an unbiased estimator).
- **variance components** (`--runs` runs a cell; the logit-normal rows alone, where the mixed
  model's assumptions hold): 3 harnesses x 3 models on each task, log-odds of a pass = harness +
  model + task + task x cell, with harness effects -0.5, 0, 0.5 (variance 1/6), model effects
  -0.3, 0, 0.3 (variance 0.06), no harness x model interaction, task sd 1 and task x cell sd 0.5
  (variance 0.25). Each component `variance.decompose` reports, as a ratio of its true variance
  (1.00 unbiased), averaged over the runs; the interaction (true 0) as its mean estimate; and
  beside each, the share of runs whose 95% interval holds the true value (nominal 95%).

Difficulty, a task's chance of passing: Beta(1, 1) (uniform), Beta(0.5, 2) (skewed: most tasks
hard; mean 0.2), Beta(0.3, 0.3) (bimodal: tasks mostly easy or hard), or the logistic of
N(0, 1) (logit-normal: the mixed model's own assumption). Every dataset draws its tasks afresh.
A rate's Monte Carlo standard error is sqrt(r (1 - r) / datasets): 0.5 points at 2,000.

    python benchmarks/stats_simulation.py                 # 2,000 datasets and 100 runs a cell
    python benchmarks/stats_simulation.py --datasets 200 --runs 20          # quick
    python benchmarks/stats_simulation.py --difficulty skewed --tasks 20 --attempts 3
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
from scipy.special import expit
from tabulate import tabulate

from pytest_hemra.report.stats import mean_ci, mean_pass_at_k, paired_difference
from pytest_hemra.report.variance import Observation, decompose

LEVEL = 0.05
EFFECT = 0.2  # the share of b's failures a fixes in the effect datasets
HARNESS_EFFECTS = np.array([-0.5, 0.0, 0.5])
MODEL_EFFECTS = np.array([-0.3, 0.0, 0.3])
TASK_SD, CELL_SD = 1.0, 0.5
TRUE_VARIANCE = {
    "harness": float(HARNESS_EFFECTS.var()),
    "model": float(MODEL_EFFECTS.var()),
    "task": TASK_SD**2,
    "task:harness:model": CELL_SD**2,
}

Draw = Callable[[np.random.Generator, int], np.ndarray]
DIFFICULTY: dict[str, Draw] = {
    "uniform": lambda rng, n: rng.beta(1.0, 1.0, n),
    "skewed": lambda rng, n: rng.beta(0.5, 2.0, n),
    "bimodal": lambda rng, n: rng.beta(0.3, 0.3, n),
    "logit-normal": lambda rng, n: expit(rng.normal(0.0, 1.0, n)),
}


@dataclass(frozen=True)
class Cell:
    difficulty: str
    tasks: int
    attempts: int


def truths(difficulty: str, attempts: int) -> tuple[float, float]:
    """E[p] and E[1 - (1 - p)^attempts] of the difficulty, by a large seeded sample."""
    chances = DIFFICULTY[difficulty](np.random.default_rng(12345), 4_000_000)
    return float(chances.mean()), float(np.mean(1 - (1 - chances) ** attempts))


def simulate(cell: Cell, datasets: int, runs: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    draw = DIFFICULTY[cell.difficulty]
    mean_chance, true_pass_at_k = truths(cell.difficulty, cell.attempts)
    true_effect = EFFECT * (1 - mean_chance)
    held = rejected = effect_held = 0
    pass_at_k = 0.0
    for _ in range(datasets):
        chances = draw(rng, cell.tasks)
        base = _rewards(rng, chances, cell.attempts)
        estimate = mean_ci(base)
        held += estimate.low <= mean_chance <= estimate.high
        passes = {task: [r == 1.0 for r in rewards] for task, rewards in base.items()}
        pass_at_k += mean_pass_at_k(passes, cell.attempts) or 0.0
        rejected += paired_difference(_rewards(rng, chances, cell.attempts), base).p_value < LEVEL
        better = chances + EFFECT * (1 - chances)
        moved = paired_difference(_rewards(rng, better, cell.attempts), base)
        effect_held += moved.low <= true_effect <= moved.high
    row = [
        cell.difficulty,
        str(cell.tasks),
        str(cell.attempts),
        _rate(held / datasets, datasets),
        _rate(rejected / datasets, datasets),
        _rate(effect_held / datasets, datasets),
        f"{100 * (pass_at_k / datasets - true_pass_at_k):+.2f}",
    ]
    if cell.difficulty != "logit-normal" or not runs:
        return row + ["-"] * 6
    return row + _components(cell, runs, rng)


def _components(cell: Cell, runs: int, rng: np.random.Generator) -> list[str]:
    """Each component's mean estimate over its truth and the share of runs whose 95% interval
    holds the truth; the interaction's mean estimate and coverage (truth 0); and how many runs
    were not fitted."""
    truth = {**TRUE_VARIANCE, "harness:model": 0.0}
    found: dict[str, list[float]] = {name: [] for name in truth}
    held: dict[str, list[bool]] = {name: [] for name in truth}
    unfitted = 0
    for _ in range(runs):
        report = decompose(_run(rng, cell.tasks, cell.attempts), "h0", "m0")
        if report.note is not None:
            unfitted += 1
            continue
        for name, values in found.items():
            if name in report.variances:
                values.append(report.variances[name])
            if name in report.intervals:
                low, high = report.intervals[name]
                held[name].append(low <= truth[name] <= high)
    cells = []
    for name, value in truth.items():
        if not found[name]:
            cells.append("-")
            continue
        mean = np.mean(found[name])
        estimate = f"{mean / value:.2f}" if value else f"{mean:.3f}"
        cover = f" / {100 * np.mean(held[name]):.0f}%" if held[name] else ""
        cells.append(estimate + cover)
    return [*cells, str(unfitted)]


def _run(rng: np.random.Generator, tasks: int, attempts: int) -> list[Observation]:
    task = rng.normal(0, TASK_SD, tasks)
    cell = rng.normal(0, CELL_SD, (tasks, 3, 3))
    eta = HARNESS_EFFECTS[None, :, None] + MODEL_EFFECTS[None, None, :] + task[:, None, None]
    passes = rng.binomial(attempts, expit(eta + cell))
    return [
        Observation(f"t{t}", f"h{h}", f"m{m}", float(a < passes[t, h, m]))
        for t in range(tasks)
        for h in range(3)
        for m in range(3)
        for a in range(attempts)
    ]


def _rewards(
    rng: np.random.Generator, chances: np.ndarray, attempts: int
) -> dict[str, list[float]]:
    passed = rng.random((len(chances), attempts)) < chances[:, None]
    return {f"task-{i}": row.astype(float).tolist() for i, row in enumerate(passed)}


def _rate(rate: float, datasets: int) -> str:
    return f"{100 * rate:.1f} ± {100 * math.sqrt(rate * (1 - rate) / datasets):.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--datasets", type=int, default=2000, help="per cell (default 2000)")
    parser.add_argument("--runs", type=int, default=100, help="variance runs per cell (100)")
    parser.add_argument("--tasks", type=int, nargs="+", default=[12, 20, 50])
    parser.add_argument("--attempts", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--difficulty", nargs="+", choices=list(DIFFICULTY), default=None)
    parser.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    cells = [
        Cell(difficulty, tasks, attempts)
        for difficulty in args.difficulty or list(DIFFICULTY)
        for tasks in args.tasks
        for attempts in args.attempts
    ]
    started = time.perf_counter()
    seeds = [args.seed * 100_003 + n for n in range(len(cells))]  # one stream a cell
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        rows = list(
            pool.map(
                simulate,
                cells,
                [args.datasets] * len(cells),
                [args.runs] * len(cells),
                seeds,
            )
        )
    headers = [
        "difficulty",
        "tasks",
        "att.",
        "mean_ci covers %",
        "null p<.05 %",
        "effect CI covers %",
        "pass@k bias pt",
        "harness var / cov.",
        "model var / cov.",
        "task var / cov.",
        "cell var / cov.",
        "h:m var (0) / cov.",
        "unfit",
    ]
    print(
        f"pass/fail rewards, {args.datasets} datasets a cell ({args.runs} variance runs a"
        " logit-normal cell; a variance as its mean estimate over its truth, harness x model as"
        " its mean estimate, truth 0; cov.: the share of runs whose 95% interval holds the truth;"
        " unfit: runs with no fit)"
    )
    print(tabulate(rows, headers=headers, disable_numparse=True))
    print(f"{time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
