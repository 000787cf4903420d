"""Statistics for a report: confidence intervals, paired comparisons, pass@k and spreads.

Pure functions over plain values; nothing here reads the store, pytest or files.

A harness's rewards come as a mapping task -> the rewards of its attempts. The attempts of one
task are not independent (an easy task passes every attempt), so every interval here is
**clustered by task**: the bootstrap resamples tasks with replacement and keeps each task's
attempts together (Miller 2024, "Adding Error Bars to Evals").

The statistic throughout is the **mean of task means**: every task weighs the same however many
of its attempts finished. With the same number of attempts per task it equals the mean over all
trials. A task with no rewards did not run and is left out.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]

EXACT_PERMUTATION_TASKS = 16
"""Up to this many shared tasks the sign-flip test enumerates all 2**n sign vectors."""

CHUNK_ELEMENTS = 1 << 18
"""Resampling draws at most this many indices at once, so memory stays bounded for huge runs."""


@dataclass(frozen=True)
class Estimate:
    """A mean reward with its confidence interval [low, high]."""

    mean: float
    low: float
    high: float
    n_tasks: int
    n_trials: int


@dataclass(frozen=True)
class Comparison:
    """Harness a minus harness b on the tasks both ran, with an interval and a p-value."""

    diff: float
    low: float
    high: float
    p_value: float
    n_tasks: int
    only_a: int
    only_b: int


@dataclass(frozen=True)
class Spread:
    """Count, median and total of a quantity such as tokens, cost or duration."""

    count: int
    median: float | None
    total: float | None


def mean_ci(
    by_task: Mapping[str, Sequence[float]],
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> Estimate:
    """The mean of task means, with a percentile bootstrap interval clustered by task.

    Deterministic for a given seed. With one task there is no spread across tasks to draw
    from and the interval is the point itself (low = high = mean), as it is when every task
    has the same mean. Read `n_tasks` before trusting an interval.
    Raises ValueError when no task has a reward.
    """
    _check_resampling(confidence, resamples)
    means, n_trials = _task_means(by_task)
    rng = np.random.default_rng(seed)
    low, high = _percentile_interval(_bootstrap_means(means, resamples, rng), confidence)
    return Estimate(float(means.mean()), low, high, len(means), n_trials)


def clustered_standard_error(by_task: Mapping[str, Sequence[float]]) -> float:
    """The cluster-robust standard error of the mean of task means (Miller 2024).

    sqrt(sum over tasks of (task mean - mean)**2) / n_tasks: the plug-in (no n/(n-1)
    correction) sandwich estimator, the same quantity the bootstrap of `mean_ci` estimates.
    With equal attempts per task it is Miller's formula for the mean over all trials.
    Raises ValueError when no task has a reward.
    """
    means, _ = _task_means(by_task)
    return float(np.sqrt(np.sum((means - means.mean()) ** 2)) / len(means))


def naive_ci(by_task: Mapping[str, Sequence[float]], *, confidence: float = 0.95) -> Estimate:
    """The interval a report would give if every trial were independent: for comparison only.

    Normal approximation for the mean of task means, with one variance (ddof=1) shared by
    all trials; not clipped to [0, 1]. Too narrow whenever tasks differ in difficulty.
    Raises ValueError when no task has a reward.
    """
    _check_confidence(confidence)
    means, n_trials = _task_means(by_task)
    rewards = np.concatenate([np.asarray(r, dtype=np.float64) for r in by_task.values() if r])
    variance = float(rewards.var(ddof=1)) if n_trials > 1 else 0.0
    counts = np.array([len(r) for r in by_task.values() if r], dtype=np.float64)
    # each trial of task c weighs 1 / (n_tasks * attempts of c) in the mean of task means
    standard_error = math.sqrt(variance * float(np.sum(1.0 / counts)) / len(means) ** 2)
    margin = statistics.NormalDist().inv_cdf(0.5 + confidence / 2) * standard_error
    mean = float(means.mean())
    return Estimate(mean, mean - margin, mean + margin, len(means), n_trials)


def paired_difference(
    a_by_task: Mapping[str, Sequence[float]],
    b_by_task: Mapping[str, Sequence[float]],
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> Comparison:
    """Harness a minus harness b: the mean over shared tasks of (a's task mean - b's).

    Only the tasks both harnesses ran count; `only_a` and `only_b` say how many were left out.
    The interval is a percentile bootstrap over shared tasks, each task keeping its pair.
    The p-value is two-sided, from a paired permutation test that flips the sign of each
    task's difference: exact over all 2**n sign vectors up to 16 tasks, otherwise from
    `resamples` random sign vectors with the +1 correction, (1 + hits) / (1 + resamples),
    so it is never 0. Deterministic for a given seed.
    Raises ValueError when no task was run by both.
    """
    _check_resampling(confidence, resamples)
    ran_a = {task for task, rewards in a_by_task.items() if rewards}
    ran_b = {task for task, rewards in b_by_task.items() if rewards}
    shared = sorted(ran_a & ran_b)
    if not shared:
        raise ValueError("no task was run by both harnesses: nothing to compare")
    diffs = np.array(
        [_mean(a_by_task[task]) - _mean(b_by_task[task]) for task in shared], dtype=np.float64
    )
    rng = np.random.default_rng(seed)
    low, high = _percentile_interval(_bootstrap_means(diffs, resamples, rng), confidence)
    return Comparison(
        diff=float(diffs.mean()),
        low=low,
        high=high,
        p_value=_sign_flip_p_value(diffs, resamples, rng),
        n_tasks=len(shared),
        only_a=len(ran_a - ran_b),
        only_b=len(ran_b - ran_a),
    )


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance at least one of k attempts passes, from c passes in n (Chen et al. 2021).

    The unbiased estimator 1 - C(n-c, k) / C(n, k), computed as a product of k ratios.
    Raises ValueError unless 1 <= k <= n and 0 <= c <= n.
    """
    return 1.0 - pass_hat_k(n, n - c, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """The chance all k attempts pass, from c passes in n: tau-bench's pass^k, C(c, k) / C(n, k).

    Computed as a product of k ratios, so it neither overflows nor leaves [0, 1].
    Raises ValueError unless 1 <= k <= n and 0 <= c <= n.
    """
    if not 1 <= k <= n:
        raise ValueError(f"pass@k: k must be between 1 and n={n} attempts, got k={k}")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k: passes must be between 0 and n={n} attempts, got c={c}")
    return math.prod((c - i) / (n - i) for i in range(k))


def mean_pass_at_k(by_task_passes: Mapping[str, Sequence[bool]], k: int) -> float | None:
    """pass@k averaged over tasks; tasks with fewer than k attempts are left out.

    None when no task has k attempts.
    """
    return _mean_over_tasks(pass_at_k, by_task_passes, k)


def mean_pass_hat_k(by_task_passes: Mapping[str, Sequence[bool]], k: int) -> float | None:
    """pass^k averaged over tasks; tasks with fewer than k attempts are left out.

    None when no task has k attempts.
    """
    return _mean_over_tasks(pass_hat_k, by_task_passes, k)


def summary(values: Sequence[float]) -> Spread:
    """Count, median and total; median and total are None when there are no values.

    None rather than 0 for the total, so "nothing recorded" never reads as "free".
    """
    if not values:
        return Spread(count=0, median=None, total=None)
    return Spread(
        count=len(values), median=float(statistics.median(values)), total=math.fsum(values)
    )


def _mean(rewards: Sequence[float]) -> float:
    return math.fsum(rewards) / len(rewards)


def _task_means(by_task: Mapping[str, Sequence[float]]) -> tuple[Floats, int]:
    """Each task's mean reward in task order, and the number of trials behind them."""
    ran = [rewards for _, rewards in sorted(by_task.items()) if rewards]
    if not ran:
        raise ValueError("no task has a reward: nothing to estimate")
    means = np.array([_mean(rewards) for rewards in ran], dtype=np.float64)
    return means, sum(len(rewards) for rewards in ran)


def _check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")


def _check_resampling(confidence: float, resamples: int) -> None:
    _check_confidence(confidence)
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")


def _bootstrap_means(values: Floats, resamples: int, rng: np.random.Generator) -> Floats:
    """The means of `resamples` samples of `values` drawn with replacement.

    Rewards are mostly pass or fail, so task means take few distinct values; then a sample is
    drawn as how many times each value comes up (multinomial), far cheaper than n indices.
    """
    n = len(values)
    distinct, counts = np.unique(values, return_counts=True)
    if len(distinct) <= math.isqrt(n):
        tallies = rng.multinomial(n, counts / n, size=resamples)
        return np.asarray(tallies @ distinct / n, dtype=np.float64)
    rows = max(1, CHUNK_ELEMENTS // n)
    means = np.empty(resamples, dtype=np.float64)
    for start in range(0, resamples, rows):
        stop = min(start + rows, resamples)
        picks = rng.integers(0, n, size=(stop - start, n), dtype=np.int32)
        means[start:stop] = values[picks].mean(axis=1)
    return means


def _percentile_interval(draws: Floats, confidence: float) -> tuple[float, float]:
    tail = (1 - confidence) / 2
    low, high = np.quantile(draws, [tail, 1 - tail])
    return float(low), float(high)


def _sign_flip_p_value(diffs: Floats, resamples: int, rng: np.random.Generator) -> float:
    """Two-sided p-value of sum(diffs) under sign flips of each task's difference."""
    n = len(diffs)
    observed = abs(float(diffs.sum()))
    # sums that tie the observed one in exact arithmetic may differ from it in the last bits
    threshold = observed - 1e-9 * max(float(np.abs(diffs).sum()), 1.0)
    if n <= EXACT_PERMUTATION_TASKS:
        bits = (np.arange(2**n)[:, None] >> np.arange(n)) & 1
        flipped = np.abs((2.0 * bits - 1.0) @ diffs)
        return float(np.mean(flipped >= threshold))
    hits = np.count_nonzero(_random_sign_flip_sums(diffs, resamples, rng) >= threshold)
    return (1 + int(hits)) / (1 + resamples)


def _random_sign_flip_sums(diffs: Floats, resamples: int, rng: np.random.Generator) -> Floats:
    """|sum of diffs| under `resamples` random sign vectors.

    With few distinct magnitudes, how many tasks of each magnitude keep their sign is drawn
    instead (binomial), as `_bootstrap_means` draws counts instead of indices.
    """
    n = len(diffs)
    magnitudes, counts = np.unique(np.abs(diffs), return_counts=True)
    if len(magnitudes) <= math.isqrt(n):
        kept = rng.binomial(counts, 0.5, size=(resamples, len(counts)))
        return np.asarray(np.abs((2 * kept - counts) @ magnitudes), dtype=np.float64)
    rows = max(1, CHUNK_ELEMENTS // n)
    sums = np.empty(resamples, dtype=np.float64)
    for start in range(0, resamples, rows):
        stop = min(start + rows, resamples)
        bits = rng.integers(0, 2, size=(stop - start, n), dtype=np.int8)
        sums[start:stop] = np.abs((2.0 * bits - 1.0) @ diffs)
    return sums


def _mean_over_tasks(
    estimator: Callable[[int, int, int], float],
    by_task_passes: Mapping[str, Sequence[bool]],
    k: int,
) -> float | None:
    if k < 1:
        raise ValueError(f"pass@k: k must be at least 1, got k={k}")
    # tasks share few (attempts, passes) pairs: evaluate each pair once
    pairs = Counter(
        (len(passes), sum(passes)) for passes in by_task_passes.values() if len(passes) >= k
    )
    tasks = sum(pairs.values())
    if not tasks:
        return None
    return math.fsum(estimator(n, c, k) * count for (n, c), count in pairs.items()) / tasks
