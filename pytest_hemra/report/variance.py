"""Where the variance of a run's rewards comes from: harness, model, task, their interplay, noise.

A mixed-effects model of the reward with harness and model (and, where every pair has the data
for it, their interaction) as fixed effects and the task as a random intercept, fitted on
per-cell sufficient statistics (`mixed_models.py` holds the fits: a Laplace fit in numpy for
pass/fail rewards, statsmodels' MixedLM for fractional ones); `docs/reports.md` ("Where the
variance comes from") states the method and its assumptions. Here: checking the design,
summing the trials per cell, and turning a fit into coefficients, shares, intervals and text.
Pure functions over plain values, like `stats`: nothing here reads the store.

scipy is imported inside the function that uses it: every process that reads a report imports
this module.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from pytest_hemra.core.words import plural
from pytest_hemra.report.mixed_models import (
    Cells,
    Fit,
    Floats,
    Ints,
    Unfitted,
    fit_model,
    fixed_design,
    model_kind,
)

CONFIDENCE = 0.95
MIN_DF = 2  # a fixed source of fewer degrees of freedom (levels - 1) is flagged as too few
DRAWS = 2000  # draws of the fixed effects behind a fixed source's interval


class Observation(NamedTuple):
    """One scored trial (a named tuple: a report makes one a trial, and reads them by column)."""

    task: str
    harness: str
    model: str
    reward: float


@dataclass(frozen=True)
class Coefficient:
    """A fixed effect against the baseline level, with its 95% interval and p-value.

    On the model's scale: log-odds for the binomial model, reward for the linear one. A
    harness's (model's) effect is its difference from the baseline averaged over the models
    (harnesses), each weighing the same; an interaction term `harness[a]:model[m]` is how much
    more a's effect is under m than under the baseline model.
    """

    term: str
    estimate: float
    low: float
    high: float
    p_value: float


@dataclass(frozen=True)
class VarianceReport:
    """The fit, or when no model could be fitted a one-line `note` saying why.

    `shares` maps each source of variance to its share of the total (summing to 1): `harness`,
    `model` (each where it has more than one level), `harness:model` (where the interaction
    was fitted), `task`, `task:harness:model` (linear model, cells with repeated attempts) and
    `residual`. Empty, like `coefficients`, when `note` is set.
    """

    method: str
    n_trials: int
    n_tasks: int
    coefficients: tuple[Coefficient, ...]
    shares: dict[str, float]
    note: str | None = None
    # fixed sources in `shares` from too few levels (2 harnesses) to estimate a variance
    # beyond those levels: their share describes the levels run, nothing more
    too_few_levels: tuple[str, ...] = ()
    # each source's variance, whose share of their total is `shares`: on the latent log-odds
    # scale for the binomial model, the reward's for the linear one
    variances: dict[str, float] = field(default_factory=dict)
    # a 95% interval for a source's variance, on the scale of `variances`: every fixed source;
    # the random ones where the fit gives one (binomial: task, task:harness:model); none for
    # the residual (binomial: fixed at pi^2/3; linear: not computed)
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def is_fitted(self) -> bool:
        return self.note is None


def decompose(
    observations: Sequence[Observation],
    baseline_harness: str,
    baseline_model: str,
    min_tasks: int = 10,
) -> VarianceReport:
    """Fit the mixed model to a run's scored trials and split the reward's variance.

    Never raises for the data it is given: too few tasks, one harness and one model, no
    variation, separation, a fit that does not converge or comes out singular, each give a
    report whose `note` says so. Warnings of the fitting library are captured, not passed on.
    """
    n_trials, n_tasks = len(observations), len({o.task for o in observations})
    is_pass_fail = all(o.reward in (0.0, 1.0) for o in observations)
    try:
        cells = _summarize(observations, baseline_harness, baseline_model, min_tasks, is_pass_fail)
        fit = fit_model(cells, is_pass_fail)
        found = _components(cells, fit)
        total = sum(found.variances.values())
        report = VarianceReport(
            fit.method,
            n_trials,
            n_tasks,
            _coefficients(cells, fit),
            {name: variance / total for name, variance in found.variances.items()},
            None,
            found.too_few,
            found.variances,
            found.intervals,
        )
    except Unfitted as why:
        return VarianceReport(model_kind(is_pass_fail), n_trials, n_tasks, (), {}, note=str(why))
    return report


def render_variance(report: VarianceReport) -> list[str]:
    """A few lines for a text report: the method; each source's share, variance and 95%
    interval, one a line; the sources with too few levels; the coefficients. Or the note."""
    counts = f"{plural(report.n_trials, 'trial')}, {plural(report.n_tasks, 'task')}"
    head = f"Where the variance comes from ({counts})"
    if report.note is not None:
        return [f"{head}: not fitted: {report.note}"]
    lines = [f"{head}: {report.method}"]
    width = max(len(name) for name in report.shares)
    lines.append(f"  {'source':<{width}}   share  variance  95% interval")
    for name, share in report.shares.items():
        variance = report.variances.get(name)
        shown = "" if variance is None else f"{variance:.3g}"
        lines.append(f"  {name:<{width}}  {share:6.1%}  {shown:>8}  {_interval(report, name)}")
    if report.too_few_levels:
        names = ", ".join(report.too_few_levels)
        lines.append(
            f"  too few levels to estimate a variance beyond those run: {names} (its share"
            " describes them only)"
        )
    width = max(len(c.term) for c in report.coefficients)
    for c in report.coefficients:
        p = "p<0.001" if c.p_value < 0.001 else f"p={c.p_value:.3f}"
        lines.append(f"  {c.term:<{width}}  {c.estimate:+.3f}  [{c.low:+.3f}, {c.high:+.3f}]  {p}")
    return lines


def _interval(report: VarianceReport, name: str) -> str:
    if name in report.intervals:
        low, high = report.intervals[name]
        return f"[{low:.3g}, {high:.3g}]"
    if name == "residual" and report.method.startswith(model_kind(is_pass_fail=True)):
        return "none: the logistic's pi^2/3"
    return "none"


def _summarize(
    observations: Sequence[Observation],
    baseline_harness: str,
    baseline_model: str,
    min_tasks: int,
    is_pass_fail: bool,
) -> Cells:
    """Check the design can be fitted and sum the trials per cell; raise Unfitted if not."""
    if not observations:
        raise Unfitted("no scored trial")
    task_column, harness_column, model_column, reward_column = zip(*observations, strict=True)
    rewards = np.array(reward_column, dtype=np.float64)
    if not np.all(np.isfinite(rewards)):
        bad = observations[int(np.argmin(np.isfinite(rewards)))]
        raise Unfitted(f"task {bad.task!r}: reward {bad.reward} is not a finite number")
    harness_names, model_names = set(harness_column), set(model_column)
    if len(harness_names) == 1 and len(model_names) == 1:
        raise Unfitted("one harness and one model: nothing to compare")
    task_names = sorted(set(task_column))
    if len(task_names) < min_tasks:
        few = plural(len(task_names), "task")
        raise Unfitted(f"{few}, fewer than the {min_tasks} a fit needs")
    harnesses = _levels(harness_names, baseline_harness, "harness")
    models = _levels(model_names, baseline_model, "model")
    if np.all(rewards == rewards[0]):
        raise Unfitted(f"every trial scored {rewards[0]:g}: no variation to decompose")

    t = _codes(task_column, task_names)
    h = _codes(harness_column, harnesses)
    m = _codes(model_column, models)
    cell_ids, row_cell = np.unique((t * len(harnesses) + h) * len(models) + m, return_inverse=True)
    count = np.bincount(row_cell).astype(np.float64)
    total = np.bincount(row_cell, weights=rewards).astype(np.float64)
    deviations = rewards - (total / count)[row_cell]
    within = np.bincount(row_cell, weights=deviations**2).astype(np.float64)
    cell_task, rest = np.divmod(cell_ids, len(harnesses) * len(models))
    cell_harness, cell_model = np.divmod(rest, len(models))

    if is_pass_fail:
        _refuse_separation(cell_harness, harnesses, "harness", count, total)
        _refuse_separation(cell_model, models, "model", count, total)
    return Cells(
        harnesses,
        models,
        len(task_names),
        len(observations),
        cell_task,
        cell_harness,
        cell_model,
        count,
        total,
        within,
        _allows_interaction(cell_harness, cell_model, harnesses, models, min_tasks)
        and not (
            is_pass_fail and _any_pair_separated(cell_harness, cell_model, models, count, total)
        ),
    )


def _codes(column: Sequence[str], levels: Sequence[str]) -> Ints:
    """Each entry's position in `levels`."""
    code = {name: position for position, name in enumerate(levels)}
    return np.fromiter(map(code.__getitem__, column), np.intp, len(column))


def _levels(names: set[str], baseline: str, axis: str) -> tuple[str, ...]:
    """The axis's levels, baseline first; the baseline matters only with two or more."""
    levels = sorted(names)
    if len(levels) == 1:
        return (levels[0],)
    if baseline not in levels:
        raise Unfitted(f"the baseline {axis} {baseline!r} has no scored trial")
    return (baseline, *(name for name in levels if name != baseline))


def _refuse_separation(
    level: Ints, names: tuple[str, ...], axis: str, count: Floats, total: Floats
) -> None:
    """A level whose every trial passed (or failed) has unbounded log-odds: no logit fit."""
    if len(names) == 1:
        return
    trials = np.bincount(level, weights=count, minlength=len(names))
    passes = np.bincount(level, weights=total, minlength=len(names))
    for code, name in enumerate(names):
        if passes[code] in (0.0, trials[code]):
            verdict = "failed" if passes[code] == 0.0 else "passed"
            raise Unfitted(
                f"{axis} {name!r} {verdict} every trial: its log-odds are unbounded (separation)"
            )


def _allows_interaction(
    harness: Ints, model: Ints, harnesses: tuple[str, ...], models: tuple[str, ...], min_tasks: int
) -> bool:
    """Every harness x model pair ran at least `min_tasks` tasks (so the grid is complete).

    `harness` and `model` have one entry per cell, so a pair's entries count its tasks."""
    if len(harnesses) == 1 or len(models) == 1:
        return False
    pairs = len(harnesses) * len(models)
    tasks_per_pair = np.bincount(harness * len(models) + model, minlength=pairs)
    return bool(np.all(tasks_per_pair >= min_tasks))


def _any_pair_separated(
    harness: Ints, model: Ints, models: tuple[str, ...], count: Floats, total: Floats
) -> bool:
    """Some harness x model pair passed (or failed) every trial: its interaction is unbounded."""
    pair = harness * len(models) + model
    trials = np.bincount(pair, weights=count)
    passes = np.bincount(pair, weights=total)
    present = trials > 0
    return bool(np.any((passes[present] == 0) | (passes[present] == trials[present])))


def _grid(cells: Cells) -> Floats:
    """The fixed design of every harness x model pair, shaped (harness, model, column)."""
    n_h, n_m = len(cells.harnesses), len(cells.models)
    harness, model = np.divmod(np.arange(n_h * n_m), n_m)
    return fixed_design(cells, harness, model).reshape(n_h, n_m, -1)


def _coefficients(cells: Cells, fit: Fit) -> tuple[Coefficient, ...]:
    """Each harness and model against its baseline, averaged over the other axis; then the
    interaction terms. Wald intervals and p-values from Student's t with `fit.df`."""
    grid = _grid(cells)
    contrasts: list[tuple[str, Floats]] = []
    for a in range(1, len(cells.harnesses)):
        row = (grid[a] - grid[0]).mean(axis=0)
        contrasts.append((f"harness[{cells.harnesses[a]}]", row))
    for b in range(1, len(cells.models)):
        row = (grid[:, b] - grid[:, 0]).mean(axis=0)
        contrasts.append((f"model[{cells.models[b]}]", row))
    if cells.has_interaction:
        for a in range(1, len(cells.harnesses)):
            for b in range(1, len(cells.models)):
                row = grid[a, b] - grid[a, 0] - grid[0, b] + grid[0, 0]
                term = f"harness[{cells.harnesses[a]}]:model[{cells.models[b]}]"
                contrasts.append((term, row))
    from scipy.special import stdtr, stdtrit

    quantile = float(stdtrit(fit.df, 0.5 + CONFIDENCE / 2))
    coefficients = []
    for term, row in contrasts:
        estimate = float(row @ fit.effects)
        se = math.sqrt(float(row @ fit.covariance @ row))
        p_value = float(2 * stdtr(fit.df, -abs(estimate) / se))
        coefficients.append(
            Coefficient(term, estimate, estimate - quantile * se, estimate + quantile * se, p_value)
        )
    return tuple(coefficients)


@dataclass(frozen=True)
class _Components:
    """Each source's variance, the fixed ones from too few levels, and the 95% intervals."""

    variances: dict[str, float]
    too_few: tuple[str, ...]
    intervals: dict[str, tuple[float, float]]


def _components(cells: Cells, fit: Fit) -> _Components:
    """The fixed effects' variance over the harness x model grid (each pair weighing the
    same), split into harness, model and interaction parts, beside the random variances; the
    fixed sources with too few levels to estimate a variance from; and the 95% intervals.

    A fixed part's plug-in variance, the mean square of its estimated effects, is too large by
    their estimation noise, the mean of their variances (from the fit's covariance): that is
    taken off (at least 0 remains), so the estimate is unbiased to first order whatever the
    number of tasks. A source of fewer than MIN_DF degrees of freedom (two harnesses: one
    difference) is named as well: its share describes those levels, and says nothing of a
    variance across harnesses (or models) beyond them.

    A fixed part's interval: the draws' 2.5% and 97.5% points of the same estimate computed on
    DRAWS of the effects from their fitted normal distribution (no refitting), each draw's less
    the noise twice: a draw's mean square is the estimates' plus their noise again, so taking
    it off twice centres the draws on the estimate (clipped at 0 like it). Seeded, so a report
    reads the same every time."""
    grid = _grid(cells)  # (harness, model, effect)
    by_harness = grid.mean(axis=1)
    by_model = grid.mean(axis=0)
    interplay = grid - by_harness[:, None] - by_model[None, :] + grid.mean(axis=(0, 1))
    n_h, n_m = len(cells.harnesses), len(cells.models)
    sources = [
        ("harness", n_h > 1, n_h - 1, by_harness - by_harness.mean(axis=0)),
        ("model", n_m > 1, n_m - 1, by_model - by_model.mean(axis=0)),
        ("harness:model", cells.has_interaction, (n_h - 1) * (n_m - 1), interplay),
    ]
    draws = _draws(fit)
    variances: dict[str, float] = {}
    intervals: dict[str, tuple[float, float]] = {}
    too_few = []
    for name, is_present, df, rows in sources:
        if not is_present:
            continue
        if df < MIN_DF:
            too_few.append(name)
        maps = rows.reshape(-1, rows.shape[-1])
        plug_in = float(np.mean((maps @ fit.effects) ** 2))
        noise = float(np.mean(np.einsum("ij,jk,ik->i", maps, fit.covariance, maps)))
        variances[name] = max(plug_in - noise, 0.0) * fit.effect_scale
        drawn = np.mean((draws @ maps.T) ** 2, axis=1) - 2 * noise
        ends = np.percentile(drawn, [50 * (1 - CONFIDENCE), 50 * (1 + CONFIDENCE)])
        low, high = np.maximum(ends, 0.0) * fit.effect_scale
        intervals[name] = (float(low), float(high))
    variances.update(fit.random)
    intervals.update(fit.intervals)
    if not sum(variances.values()) > 0:
        raise Unfitted("the fitted variances are all 0: nothing to share out")
    return _Components(variances, tuple(too_few), intervals)


def _draws(fit: Fit) -> Floats:
    """DRAWS samples of the fixed effects from N(effects, covariance), one a row."""
    eigenvalues, eigenvectors = np.linalg.eigh(fit.covariance)
    root = eigenvectors * np.sqrt(np.clip(eigenvalues, 0.0, None))
    normal = np.random.default_rng(0).standard_normal((DRAWS, fit.effects.size))
    return np.asarray(fit.effects + normal @ root.T, dtype=np.float64)
