"""Statistics for a report: confidence intervals, paired comparisons, pass@k and spreads.

Pure functions over plain values; nothing here reads the store, pytest or files.

A harness's rewards come as a mapping task -> the rewards of its attempts. The attempts of one
task are not independent (an easy task passes every attempt), so every interval here is
**clustered by task**: it is built from the task means, the tasks being the independent units
(Miller 2024, "Adding Error Bars to Evals").

The statistic throughout is the **mean of task means**: every task weighs the same however many
of its attempts finished. With the same number of attempts per task it equals the mean over all
trials. A task with no rewards did not run and is left out.

Two harnesses are compared by a **paired t-test on task means** (`paired_difference`): its
p-value and its interval come from the same t statistic, so they never disagree. Rewards must
be finite: NaN and infinities are refused with a ValueError naming the task.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]


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
    """Harness a minus harness b on the tasks both ran, with an interval and a p-value.

    Both come from one paired t-test, so they give one verdict: the interval [low, high]
    excludes 0 exactly when p < 1 - confidence (`is_significant`).
    """

    diff: float
    low: float
    high: float
    p_value: float
    n_tasks: int
    only_a: int
    only_b: int
    sd: float = 0.0  # of the tasks' differences (ddof=1); 0 for one task or tasks all alike
    confidence: float = 0.95

    @property
    def is_significant(self) -> bool:
        return self.p_value < round(1 - self.confidence, 12)


@dataclass(frozen=True)
class PassAtK:
    """pass@k and pass^k for k = 1 up to the largest k, every k over the same tasks."""

    pass_at_k: dict[int, float | None]
    pass_hat_k: dict[int, float | None]
    tasks: int  # tasks with at least the largest k attempts scored: every k averages over them
    left_out: int  # tasks with some attempts scored, but fewer than the largest k


@dataclass(frozen=True)
class Spread:
    """Count, median and total of a quantity such as tokens, cost or duration."""

    count: int
    median: float | None
    total: float | None


def mean_ci(by_task: Mapping[str, Sequence[float]], *, confidence: float = 0.95) -> Estimate:
    """The mean of task means, with a t interval over tasks; for rewards in [0, 1], its score form.

    The tasks are the independent units (their attempts are not), so the interval is built from
    the n task means: a Student t quantile with n - 1 degrees of freedom and their spread s.
    Task means in [0, 1] get the **score (Wilson) form** of that interval, with an effective
    number of tasks n_eff = n m (1 - m) / s^2 (m the mean: the design effect of Korn and
    Graubard's clustered proportions): the interval holds every mean whose own spread
    m (1 - m) / n_eff puts the observed one within t standard errors. It is not symmetric
    about the mean near 0 or 1, where a plain t interval undercovers (skewed difficulty), and
    never leaves [0, 1]. Task means outside [0, 1] get mean +- t s / sqrt(n).

    Where every task mean is 0 or 1 (pass/fail rewards, one attempt a task, or each task
    passed all its attempts or none) the tasks are a proportion's trials: their spread is the
    mean's own, nothing is left to estimate, and the interval is **Wilson's for a proportion of
    n** (a normal quantile), also where every task had the same result (0 of 20 passed: 0 to
    0.16, not a point).

    Deterministic (no resampling). With one task there is no spread across tasks and the
    interval is the point itself (low = high = mean), as it is when every task has the same
    mean strictly between 0 and 1. Read `n_tasks` before trusting an interval.
    Raises ValueError when no task has a reward.
    """
    _check_confidence(confidence)
    means, n_trials = _task_means(by_task)
    n, mean = len(means), float(means.mean())
    if n == 1:
        return Estimate(mean, mean, mean, n, n_trials)
    bounded = bool(means.min() >= 0 and means.max() <= 1)
    binary = bool(np.all((means == 0) | (means == 1)))
    sd = float(means.std(ddof=1))
    return Estimate(mean, *interval_of_means(n, mean, sd, bounded, binary, confidence), n, n_trials)


def interval_of_means(
    n: int, mean: float, sd: float, bounded: bool, binary: bool, confidence: float = 0.95
) -> tuple[float, float]:
    """`mean_ci`'s interval from what it reads of n >= 2 task means: their mean and their sd
    (ddof=1); `bounded`, every task mean in [0, 1] (the score form); `binary`, every one 0 or 1
    (Wilson's for a proportion of n). What an exact computation of its coverage calls
    (`benchmarks/stats_simulation.py --exact`)."""
    if binary:
        return _score_interval(mean, n, statistics.NormalDist().inv_cdf(0.5 + confidence / 2))
    from scipy.special import stdtrit

    quantile = float(stdtrit(n - 1, 0.5 + confidence / 2))
    if not bounded:
        return mean - quantile * sd / math.sqrt(n), mean + quantile * sd / math.sqrt(n)
    spread = mean * (1 - mean)
    if sd <= 1e-9 * spread or spread <= 0:  # every task has the same mean: nothing varies
        return mean, mean
    return _score_interval(mean, n * spread / sd**2, quantile)


def _score_interval(mean: float, n_eff: float, quantile: float) -> tuple[float, float]:
    """Wilson's interval for a mean in [0, 1] from `n_eff` effective independent units."""
    spread = mean * (1 - mean)
    q2 = quantile**2 / n_eff
    center = (mean + q2 / 2) / (1 + q2)
    half = quantile / (1 + q2) * math.sqrt(spread / n_eff + q2 / (4 * n_eff))
    return max(center - half, 0.0), min(center + half, 1.0)


def clustered_standard_error(by_task: Mapping[str, Sequence[float]]) -> float:
    """The cluster-robust standard error of the mean of task means (Miller 2024).

    sqrt(sum over tasks of (task mean - mean)**2) / n_tasks: the plug-in (no n/(n-1)
    correction) sandwich estimator; `mean_ci` uses the task means' sd (ddof=1) instead.
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
) -> Comparison:
    """Harness a minus harness b: the mean over shared tasks of (a's task mean - b's).

    Only the tasks both harnesses ran count; `only_a` and `only_b` say how many were left out.
    A paired t-test on the tasks' differences (Student's t, n - 1 degrees of freedom) gives
    both the two-sided p-value and the interval, mean +- t * sd / sqrt(n), so the interval
    excludes 0 exactly when p < 1 - confidence. The interval is clipped to the differences
    rewards can make (+-1 for rewards in [0, 1]).

    When every shared task differs by the same amount (one task, or no spread: the t statistic
    is undefined), the exact sign-flip test is used instead: p = 2 / 2**n (1 for no
    difference), and its inversion for the interval: that one value when 2 / 2**n is below the
    level, else every difference rewards can make.
    Raises ValueError when no task was run by both, or a reward is not finite.
    """
    _check_confidence(confidence)
    _check_finite(a_by_task, "harness a")
    _check_finite(b_by_task, "harness b")
    ran_a = {task for task, rewards in a_by_task.items() if rewards}
    ran_b = {task for task, rewards in b_by_task.items() if rewards}
    shared = sorted(ran_a & ran_b)
    if not shared:
        raise ValueError("no task was run by both harnesses: nothing to compare")
    diffs = np.array(
        [_mean(a_by_task[task]) - _mean(b_by_task[task]) for task in shared], dtype=np.float64
    )
    rewards = [r for task in shared for r in (*a_by_task[task], *b_by_task[task])]
    widest = max(1.0, *rewards) - min(0.0, *rewards)
    low, high, p_value, sd = _paired_t(diffs, confidence, widest)
    return Comparison(
        diff=float(diffs.mean()),
        low=low,
        high=high,
        p_value=p_value,
        n_tasks=len(shared),
        only_a=len(ran_a - ran_b),
        only_b=len(ran_b - ran_a),
        sd=sd,
        confidence=confidence,
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


def pass_k_over_one_task_set(
    by_task_passes: Mapping[str, Sequence[bool]], largest_k: int
) -> PassAtK:
    """pass@k and pass^k for k = 1..largest_k, every k over the same tasks: those with at least
    `largest_k` attempts scored. A task with fewer is left out of every k (and counted in
    `left_out`), so pass@1 and pass@k never describe different tasks.
    """
    if largest_k < 1:
        raise ValueError(f"pass@k: k must be at least 1, got k={largest_k}")
    ran = {task: passes for task, passes in by_task_passes.items() if passes}
    kept = {task: passes for task, passes in ran.items() if len(passes) >= largest_k}
    ks = range(1, largest_k + 1)
    pairs = _pairs(kept, 1)  # counted once for every k: every kept task has them all
    return PassAtK(
        pass_at_k={k: _mean_over_pairs(pass_at_k, pairs, k) for k in ks},
        pass_hat_k={k: _mean_over_pairs(pass_hat_k, pairs, k) for k in ks},
        tasks=len(kept),
        left_out=len(ran) - len(kept),
    )


def summary(values: Sequence[float]) -> Spread:
    """Count, median and total; median and total are None when there are no values.

    None rather than 0 for the total, so "nothing recorded" never reads as "free".
    Raises ValueError for a value that is not finite.
    """
    if not all(map(math.isfinite, values)):  # the common case, without a Python loop
        for value in values:
            if not math.isfinite(value):
                raise ValueError(f"summary: {value!r} is not a finite number")
    if not values:
        return Spread(count=0, median=None, total=None)
    return Spread(
        count=len(values), median=float(statistics.median(values)), total=math.fsum(values)
    )


def _mean(rewards: Sequence[float]) -> float:
    return math.fsum(rewards) / len(rewards)


def _check_finite(by_task: Mapping[str, Sequence[float]], whose: str) -> None:
    if all(map(math.isfinite, chain.from_iterable(by_task.values()))):  # the common case
        return
    for task, rewards in by_task.items():
        if all(map(math.isfinite, rewards)):  # the common case, without a Python loop
            continue
        for reward in rewards:
            if not math.isfinite(reward):
                raise ValueError(
                    f"{whose}: task {task!r} has reward {reward!r}: rewards must be finite"
                    " numbers (NaN and infinities are refused)"
                )


def _task_means(by_task: Mapping[str, Sequence[float]]) -> tuple[Floats, int]:
    """Each task's mean reward in task order, and the number of trials behind them."""
    _check_finite(by_task, "rewards")
    ran = [rewards for _, rewards in sorted(by_task.items()) if rewards]
    if not ran:
        raise ValueError("no task has a reward: nothing to estimate")
    means = np.array([math.fsum(rewards) / len(rewards) for rewards in ran], dtype=np.float64)
    return means, sum(len(rewards) for rewards in ran)


def _check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")


def _paired_t(diffs: Floats, confidence: float, widest: float) -> tuple[float, float, float, float]:
    """(low, high, p, sd) of the paired t-test on `diffs`, the interval clipped to +-widest."""
    n, mean = len(diffs), float(diffs.mean())
    scale = max(1.0, float(np.abs(diffs).max()))
    # task means of equal rewards can differ in their last bits (2/3 - 1/3 != 1/3)
    if float(diffs.max() - diffs.min()) <= 1e-12 * scale:
        every = 2.0 ** (1 - n)  # the sign-flip p-value of any shift but the observed one
        mean = 0.0 if abs(mean) <= 1e-12 * scale else mean
        p_value = 1.0 if mean == 0 else every
        if every < round(1 - confidence, 12):
            return mean, mean, p_value, 0.0
        return -widest, widest, p_value, 0.0
    sd = float(diffs.std(ddof=1))
    standard_error = sd / math.sqrt(n)
    t = mean / standard_error
    from scipy.special import stdtr, stdtrit  # a tenth of a second, for this test alone

    p_value = float(2 * stdtr(n - 1, -abs(t)))
    margin = float(stdtrit(n - 1, 0.5 + confidence / 2)) * standard_error
    return max(mean - margin, -widest), min(mean + margin, widest), p_value, sd


def _mean_over_tasks(
    estimator: Callable[[int, int, int], float],
    by_task_passes: Mapping[str, Sequence[bool]],
    k: int,
) -> float | None:
    if k < 1:
        raise ValueError(f"pass@k: k must be at least 1, got k={k}")
    return _mean_over_pairs(estimator, _pairs(by_task_passes, k), k)


def _pairs(by_task_passes: Mapping[str, Sequence[bool]], k: int) -> Counter[tuple[int, int]]:
    """How many tasks of at least k attempts have each (attempts, passes): tasks share few
    pairs, so each is evaluated once."""
    return Counter(
        (len(passes), sum(passes)) for passes in by_task_passes.values() if len(passes) >= k
    )


def _mean_over_pairs(
    estimator: Callable[[int, int, int], float], pairs: Counter[tuple[int, int]], k: int
) -> float | None:
    tasks = sum(pairs.values())
    if not tasks:
        return None
    return math.fsum(estimator(n, c, k) * count for (n, c), count in pairs.items()) / tasks
