"""Report statistics: clustered intervals, paired comparisons, pass@k and spreads."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy.special import comb
from scipy.stats import binom, binomtest

from pytest_hemra.report.stats import (
    Comparison,
    Estimate,
    Spread,
    clustered_standard_error,
    mean_ci,
    mean_pass_at_k,
    mean_pass_hat_k,
    naive_ci,
    paired_difference,
    pass_at_k,
    pass_hat_k,
    summary,
)

Z95 = 1.959963984540054


def tasks_with_difficulty(
    rng: np.random.Generator, n_tasks: int, attempts: int, *, binary: bool = True
) -> dict[str, list[float]]:
    """Rewards of tasks whose difficulty varies: task i passes with its own chance."""
    chances = rng.random(n_tasks)
    return {f"task-{i}": draw(rng, chance, attempts, binary) for i, chance in enumerate(chances)}


def draw(rng: np.random.Generator, chance: float, attempts: int, binary: bool) -> list[float]:
    if binary:
        return [float(x) for x in rng.random(attempts) < chance]
    # continuous rewards with mean `chance`, so task means rarely repeat
    return [float(x) for x in rng.beta(1 + 4 * chance, 5 - 4 * chance, attempts)]


def width(estimate: Estimate) -> float:
    return estimate.high - estimate.low


# pass@k and pass^k


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 0.4),
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (5, 0, 3, 0.0),
        (5, 5, 3, 1.0),
        (5, 2, 5, 1.0),  # five draws from five attempts include both passes
        (5, 0, 5, 0.0),
        (1, 1, 1, 1.0),
        (10, 3, 4, 1 - 35 / 210),
    ],
)
def test_pass_at_k_matches_hand_worked_values(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-15)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 0.4),
        (5, 2, 2, 0.1),  # C(2,2)/C(5,2) = 1/10
        (5, 2, 3, 0.0),
        (5, 0, 1, 0.0),
        (5, 5, 5, 1.0),
        (5, 4, 5, 0.0),
        (10, 7, 3, 35 / 120),
    ],
)
def test_pass_hat_k_matches_hand_worked_values(n: int, c: int, k: int, expected: float) -> None:
    assert pass_hat_k(n, c, k) == pytest.approx(expected, abs=1e-15)


def test_pass_at_k_and_pass_hat_k_agree_with_binomial_coefficients() -> None:
    for n in [*range(1, 21), 60]:
        for c in range(n + 1):
            for k in range(1, n + 1):
                total = Fraction(int(comb(n, k, exact=True)))
                none_pass = Fraction(int(comb(n - c, k, exact=True))) / total
                all_pass = Fraction(int(comb(c, k, exact=True))) / total
                assert pass_at_k(n, c, k) == pytest.approx(float(1 - none_pass), abs=1e-12)
                assert pass_hat_k(n, c, k) == pytest.approx(float(all_pass), abs=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(5, 2, 6), (5, 2, 0), (5, -1, 1), (5, 6, 1), (0, 0, 1)])
def test_pass_at_k_refuses_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match="pass@k"):
        pass_at_k(n, c, k)
    with pytest.raises(ValueError, match="pass@k"):
        pass_hat_k(n, c, k)


def test_mean_pass_at_k_averages_over_tasks_with_enough_attempts() -> None:
    passes = {"a": [True, False], "b": [True, True, False, False], "short": [True]}
    # a: pass@2 = 1, pass^2 = 0; b: pass@2 = 1 - 1/6, pass^2 = 1/6; "short" has too few attempts
    assert mean_pass_at_k(passes, 2) == pytest.approx((1 + 5 / 6) / 2)
    assert mean_pass_hat_k(passes, 2) == pytest.approx((0 + 1 / 6) / 2)
    assert mean_pass_at_k(passes, 1) == pytest.approx((0.5 + 0.5 + 1) / 3)


def test_mean_pass_at_k_is_none_when_no_task_has_k_attempts() -> None:
    assert mean_pass_at_k({"a": [True, False]}, 3) is None
    assert mean_pass_hat_k({}, 1) is None
    with pytest.raises(ValueError, match="k must be at least 1"):
        mean_pass_at_k({}, 0)


# spreads


def test_summary_gives_count_median_and_total() -> None:
    assert summary([3.0, 1.0, 2.0, 10.0]) == Spread(count=4, median=2.5, total=16.0)
    assert summary([0.1] * 10).total == 1.0


def test_summary_of_nothing_has_no_median_and_no_total() -> None:
    assert summary([]) == Spread(count=0, median=None, total=None)


# mean_ci and its reference intervals


def test_mean_is_the_mean_of_task_means() -> None:
    estimate = mean_ci({"a": [1.0, 1.0, 1.0, 1.0], "b": [0.0], "not run": []})
    assert (estimate.mean, estimate.n_tasks, estimate.n_trials) == (0.5, 2, 5)
    assert naive_ci({"a": [1.0, 1.0, 1.0, 1.0], "b": [0.0]}).mean == 0.5


def test_one_task_gives_the_point_as_its_interval() -> None:
    assert mean_ci({"only": [0.2, 0.4, 0.9]}) == Estimate(0.5, 0.5, 0.5, 1, 3)
    assert clustered_standard_error({"only": [0.2, 0.4, 0.9]}) == 0.0


def test_no_rewards_is_refused() -> None:
    with pytest.raises(ValueError, match="no task has a reward"):
        mean_ci({"a": []})
    with pytest.raises(ValueError, match="no task has a reward"):
        clustered_standard_error({})


def test_clustered_interval_is_wider_than_naive_when_tasks_differ_in_difficulty() -> None:
    rng = np.random.default_rng(1)
    # every task passes all ten attempts or none: ten attempts say no more than one
    by_task = {f"t{i}": [float(rng.random() < 0.5)] * 10 for i in range(200)}
    clustered, naive = mean_ci(by_task), naive_ci(by_task)
    assert clustered.mean == naive.mean
    assert clustered.low < naive.low and naive.high < clustered.high
    assert width(clustered) / width(naive) == pytest.approx(math.sqrt(10), rel=0.15)


def test_clustered_interval_is_about_naive_when_attempts_are_independent() -> None:
    rng = np.random.default_rng(2)
    by_task = {f"t{i}": [float(x) for x in rng.random(10) < 0.5] for i in range(500)}
    assert width(mean_ci(by_task)) / width(naive_ci(by_task)) == pytest.approx(1, abs=0.15)


@pytest.mark.parametrize("binary", [True, False], ids=["pass-fail", "continuous"])
def test_bootstrap_standard_error_is_close_to_the_analytic_clustered_one(binary: bool) -> None:
    by_task = tasks_with_difficulty(np.random.default_rng(3), 2000, 4, binary=binary)
    estimate = mean_ci(by_task, resamples=20_000)
    analytic = clustered_standard_error(by_task)
    assert width(estimate) / (2 * Z95) == pytest.approx(analytic, rel=0.05)
    assert estimate.low < estimate.mean < estimate.high


def test_clustered_standard_error_is_millers_formula_for_equal_attempts() -> None:
    by_task = tasks_with_difficulty(np.random.default_rng(4), 50, 3)
    rewards = np.array(list(by_task.values()))
    residuals = rewards - rewards.mean()
    # Miller (2024): the iid variance plus the within-task covariances, over n_trials squared
    variance = (
        np.sum(residuals**2) + sum(np.sum(np.outer(row, row)) - np.sum(row**2) for row in residuals)
    ) / rewards.size**2
    assert clustered_standard_error(by_task) == pytest.approx(math.sqrt(variance))


def test_intervals_are_deterministic_given_the_seed() -> None:
    by_task = tasks_with_difficulty(np.random.default_rng(5), 100, 3, binary=False)
    other = tasks_with_difficulty(np.random.default_rng(6), 100, 3, binary=False)
    assert mean_ci(by_task, seed=7) == mean_ci(by_task, seed=7)
    assert mean_ci(dict(reversed(by_task.items())), seed=7) == mean_ci(by_task, seed=7)
    assert mean_ci(by_task, seed=7) != mean_ci(by_task, seed=8)
    assert paired_difference(by_task, other, seed=7) == paired_difference(by_task, other, seed=7)
    assert paired_difference(by_task, other, seed=7) != paired_difference(by_task, other, seed=8)


def test_bad_confidence_or_resamples_is_refused() -> None:
    with pytest.raises(ValueError, match="confidence"):
        mean_ci({"a": [1.0]}, confidence=95)
    with pytest.raises(ValueError, match="resamples"):
        paired_difference({"a": [1.0]}, {"a": [0.0]}, resamples=0)


# paired_difference


def test_paired_difference_uses_only_the_tasks_both_ran() -> None:
    a = {"x": [1.0, 1.0], "y": [0.0, 1.0], "z": [1.0], "b skipped": [1.0]}
    b = {"y": [0.0, 0.0], "z": [0.0], "b skipped": [], "w": [1.0]}
    comparison = paired_difference(a, b)
    assert (comparison.n_tasks, comparison.only_a, comparison.only_b) == (2, 2, 1)
    assert comparison.diff == pytest.approx((0.5 + 1.0) / 2)


def test_no_shared_task_is_refused() -> None:
    with pytest.raises(ValueError, match="no task was run by both"):
        paired_difference({"x": [1.0]}, {"y": [1.0]})


@pytest.mark.parametrize(
    ("a", "expected"),
    [
        ([0.2, 0.5, 1.0], 2 / 8),  # all signs kept or all flipped reach the observed sum
        ([1.0, 0.5, -0.2], 4 / 8),  # and flipping only the smallest reaches it as well
        ([0.0, 0.0, 0.0], 1.0),
    ],
)
def test_permutation_p_value_is_exact_for_few_tasks(a: list[float], expected: float) -> None:
    comparison = paired_difference(
        {f"t{i}": [x] for i, x in enumerate(a)}, {f"t{i}": [0.0] for i in range(len(a))}
    )
    assert comparison.p_value == pytest.approx(expected)
    assert comparison.diff == pytest.approx(sum(a) / len(a))


def test_permutation_p_value_is_never_zero() -> None:
    zeros = {f"t{i}": [0.0] for i in range(40)}
    better = {f"t{i}": [1.0] for i in range(16)}
    assert paired_difference(better, zeros).p_value == 2 / 2**16
    better = {f"t{i}": [0.5 + i / 100] for i in range(40)}
    assert paired_difference(better, zeros, resamples=999).p_value == 1 / 1000


@pytest.mark.parametrize(
    ("n_tasks", "binary"),
    [(10, False), (40, False), (10, True), (40, True)],
    ids=["exact", "monte-carlo", "exact-pass-fail", "monte-carlo-pass-fail"],
)
def test_permutation_p_value_rejects_at_its_level_under_no_difference(
    n_tasks: int, binary: bool
) -> None:
    runs = 200
    p_values = []
    for run in range(runs):
        rng = np.random.default_rng(100 + run)
        chances = rng.random(n_tasks)
        # both harnesses draw their attempts from the same per-task chance
        a = {f"t{i}": draw(rng, chance, 3, binary) for i, chance in enumerate(chances)}
        b = {f"t{i}": draw(rng, chance, 3, binary) for i, chance in enumerate(chances)}
        p_values.append(paired_difference(a, b, resamples=1000, seed=run).p_value)
    for level in (0.05, 0.25, 0.5):
        rejected = sum(p <= level for p in p_values)
        assert rejected / runs <= level + 3 * math.sqrt(level * (1 - level) / runs)
        # pass-fail rewards tie often (many tasks differ by exactly 0), so there the test is
        # conservative: it rejects less often than its level, never more
        if not binary:
            assert binomtest(rejected, runs, level).pvalue > 0.001


def test_monte_carlo_p_value_approaches_the_exact_one_for_many_tasks() -> None:
    # 17 tasks of distinct differences: one past exact enumeration, so sign vectors are drawn
    diffs = np.array([0.9, -0.8, 0.75, 0.7, -0.6, 0.55, 0.5, 0.45, -0.4, 0.35, 0.3, 0.25, 0.2])
    diffs = np.concatenate([diffs, [-0.15, 0.1, 0.05, -0.02]])
    bits = (np.arange(2**17)[:, None] >> np.arange(17)) & 1
    exact = np.mean(np.abs((2.0 * bits - 1.0) @ diffs) >= abs(diffs.sum()) - 1e-9)
    a = {f"t{i}": [float(d)] for i, d in enumerate(diffs)}
    b = {f"t{i}": [0.0] for i in range(17)}
    assert paired_difference(a, b, resamples=20_000).p_value == pytest.approx(exact, abs=0.01)


def test_monte_carlo_p_value_approaches_the_exact_one_for_pass_fail_tasks() -> None:
    # 14 of 20 tasks pass only for a, 6 only for b: the sum under sign flips is 2X - 20
    a = {f"t{i}": [float(i < 14)] for i in range(20)}
    b = {f"t{i}": [float(i >= 14)] for i in range(20)}
    exact = 2 * binom.sf(13, 20, 0.5)
    assert paired_difference(a, b, resamples=20_000).p_value == pytest.approx(exact, abs=0.01)


def test_a_real_difference_gets_a_small_p_value_and_an_interval_above_zero() -> None:
    rng = np.random.default_rng(9)
    chances = rng.random(60) * 0.6
    a = {f"t{i}": draw(rng, chance + 0.3, 3, True) for i, chance in enumerate(chances)}
    b = {f"t{i}": draw(rng, chance, 3, True) for i, chance in enumerate(chances)}
    comparison = paired_difference(a, b)
    assert comparison.p_value < 0.001
    assert 0 < comparison.low < comparison.diff < comparison.high
    assert comparison.diff == pytest.approx(0.3, abs=0.1)
    assert isinstance(comparison, Comparison)
