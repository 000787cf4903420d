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

`--exact` computes `mean_ci`'s coverage instead of drawing it: a dataset of n tasks with k
attempts each is, for `mean_ci`, how many tasks passed 0, 1, ..., k times (their task means);
every such count vector is enumerated (C(n + k, k) of them: 3.5 million at 50 tasks and 5
attempts), its interval computed once by `stats.interval_of_means`, and its probability summed
under each difficulty (multinomial over the tasks, with a task's chance of j passes its
difficulty's beta-binomial, or for logit-normal an integral) wherever the interval holds the
exact E[p] (a / (a + b) for Beta(a, b), 0.5 for logit-normal). No Monte Carlo error.

Difficulty, a task's chance of passing: Beta(1, 1) (uniform), Beta(0.5, 2) (skewed: most tasks
hard; mean 0.2), Beta(0.3, 0.3) (bimodal: tasks mostly easy or hard), or the logistic of
N(0, 1) (logit-normal: the mixed model's own assumption). Every dataset draws its tasks afresh.
A rate's Monte Carlo standard error is sqrt(r (1 - r) / datasets): 0.5 points at 2,000.

    python benchmarks/stats_simulation.py                 # 2,000 datasets and 100 runs a cell
    python benchmarks/stats_simulation.py --datasets 200 --runs 20          # quick
    python benchmarks/stats_simulation.py --difficulty skewed --tasks 20 --attempts 3
    python benchmarks/stats_simulation.py --exact         # mean_ci's exact coverage, one table
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
from scipy import integrate
from scipy.special import betaln, expit, gammaln
from scipy.stats import norm
from tabulate import tabulate

from pytest_hemra.report.stats import (
    interval_of_means,
    mean_ci,
    mean_pass_at_k,
    paired_difference,
)
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


BETA = {"uniform": (1.0, 1.0), "skewed": (0.5, 2.0), "bimodal": (0.3, 0.3)}  # as DIFFICULTY


def passes_chances(difficulty: str, attempts: int) -> tuple[np.ndarray, float]:
    """A task's chance of passing j of `attempts` times (j = 0..attempts), and E[p], exactly."""
    if difficulty in BETA:
        a, b = BETA[difficulty]
        logs = [betaln(j + a, attempts - j + b) - betaln(a, b) for j in range(attempts + 1)]
        chances = [math.comb(attempts, j) * math.exp(log) for j, log in enumerate(logs)]
        return np.array(chances), a / (a + b)

    def density(x: float, j: int) -> float:
        p = float(expit(x))
        return float(norm.pdf(x)) * p**j * (1 - p) ** (attempts - j)

    chances = [
        math.comb(attempts, j) * integrate.quad(density, -12, 12, args=(j,), limit=200)[0]
        for j in range(attempts + 1)
    ]
    return np.array(chances), 0.5  # logit-normal: symmetric about 0.5


def exact_coverage(tasks: int, attempts: int, difficulties: list[str]) -> list[float]:
    """`mean_ci`'s coverage of E[p] under each difficulty, every dataset enumerated."""
    counts, lows, highs = [], [], []
    values = np.arange(attempts + 1) / attempts
    for bars in itertools.combinations(range(tasks + attempts), attempts):  # stars and bars
        edges = (-1, *bars, tasks + attempts)
        count = [edges[i + 1] - edges[i] - 1 for i in range(attempts + 1)]
        mean = sum(c * v for c, v in zip(count, values, strict=True)) / tasks
        squares = sum(c * v * v for c, v in zip(count, values, strict=True)) - tasks * mean**2
        sd = math.sqrt(max(squares, 0.0) / (tasks - 1))
        binary = not any(count[1:-1])  # every task passed all its attempts or none
        low, high = interval_of_means(tasks, mean, sd, True, binary)
        counts.append(count)
        lows.append(low)
        highs.append(high)
    table = np.array(counts)
    ways = gammaln(tasks + 1) - gammaln(table + 1).sum(axis=1)  # the multinomial coefficient
    low, high = np.array(lows), np.array(highs)
    covered = []
    for difficulty in difficulties:
        chances, truth = passes_chances(difficulty, attempts)
        probability = np.exp(ways + table @ np.log(chances))
        held = (low <= truth + 1e-12) & (truth - 1e-12 <= high)
        covered.append(float(probability[held].sum()))
    return covered


def exact_table(args: argparse.Namespace) -> None:
    difficulties = args.difficulty or list(DIFFICULTY)
    shapes = [(tasks, attempts) for tasks in args.tasks for attempts in args.attempts]
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        found = dict(
            zip(
                shapes,
                pool.map(
                    exact_coverage,
                    [t for t, _ in shapes],
                    [a for _, a in shapes],
                    [difficulties] * len(shapes),
                ),
                strict=True,
            )
        )
    rows = [
        [difficulty, str(tasks)] + [f"{100 * found[(tasks, a)][d]:.2f}" for a in args.attempts]
        for d, difficulty in enumerate(difficulties)
        for tasks in args.tasks
    ]
    print("mean_ci: the exact share of datasets whose 95% interval holds E[p], %")
    headers = ["difficulty", "tasks", *(f"{a} att." for a in args.attempts)]
    print(tabulate(rows, headers=headers, disable_numparse=True))
    print(f"{time.perf_counter() - started:.1f} s")


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
    parser.add_argument("--exact", action="store_true", help="mean_ci's exact coverage alone")
    args = parser.parse_args()
    if args.exact:
        exact_table(args)
        return
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
