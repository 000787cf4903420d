"""Where the variance of a run's rewards comes from: harness, model, task, their interplay, noise.

A mixed-effects model of the reward with harness and model (and, where every pair has the data
for it, their interaction) as fixed effects and the task as a random intercept, fitted with
statsmodels; `docs/reports.md` ("Where the variance comes from") states the method and its
assumptions. Pure functions over plain values, like `stats`: nothing here reads the store.

Both models are fitted to one row per **cell** (a task x harness x model with trials), never to
the trials themselves, so 150,000 trials fit in seconds:

- **pass/fail rewards** (every reward 0 or 1): a logistic mixed model on each cell's passes out
  of its trials, the same likelihood as one Bernoulli row per trial. Fitted by variational
  Bayes (statsmodels' `BinomialBayesMixedGLM.fit_vb`, weak priors); the intervals come from the
  log-posterior's curvature at that fit, widened for overdispersion.
- **fractional rewards**: a linear mixed model (statsmodels `MixedLM`, REML) on the cells'
  means, with the trial-to-trial variance taken from the spread inside the cells. With the same
  number of attempts in every cell this is exactly the REML fit of the model with a random
  intercept per task and per cell on every trial.

statsmodels and scipy are imported inside the functions that use them: statsmodels costs seconds
to import, scipy a tenth of one, and every process that reads a report imports this module.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import numpy.typing as npt

from pytest_hemra.core.words import plural

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.intp]

CONFIDENCE = 0.95
LOGISTIC_VARIANCE = math.pi**2 / 3  # the latent residual of a logit model (Nakagawa 2013)
PRIOR_SD_EFFECT = 10.0  # a fixed effect's prior sd in log-odds: weak, odds of e^20 within 2 sd
PRIOR_SD_LOG_SD = 1.0  # the prior sd of the log of the task sd (statsmodels' default)
UNBOUNDED_SD = PRIOR_SD_EFFECT / 2  # a posterior sd this wide means the data do not bound it
SINGULAR_TASK_SD = 1e-3  # a task sd below this on the log-odds scale: the tasks collapsed


@dataclass(frozen=True)
class Observation:
    """One scored trial."""

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

    @property
    def is_fitted(self) -> bool:
        return self.note is None


@dataclass(frozen=True)
class _Cells:
    """The trials summed per task x harness x model cell; level 0 is the baseline."""

    harnesses: tuple[str, ...]
    models: tuple[str, ...]
    n_tasks: int
    n_trials: int
    task: Ints
    harness: Ints
    model: Ints
    count: Floats
    total: Floats  # the sum of the cell's rewards
    within: Floats  # the sum of squared deviations from the cell's mean
    has_interaction: bool


@dataclass(frozen=True)
class _Fit:
    method: str
    effects: Floats  # the fixed effects, in the columns of `_fixed_design`
    covariance: Floats
    df: float  # the degrees of freedom of the intervals
    random: dict[str, float]  # task, task:harness:model, residual -> variance


class _Unfitted(Exception):
    """Why no model was fitted, in one line; never leaves this module."""


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
        fit = _fit(cells, is_pass_fail)
        report = VarianceReport(
            fit.method, n_trials, n_tasks, _coefficients(cells, fit), _shares(cells, fit)
        )
    except _Unfitted as why:
        return VarianceReport(_kind(is_pass_fail), n_trials, n_tasks, (), {}, note=str(why))
    return report


def render_variance(report: VarianceReport) -> list[str]:
    """A few lines for a text report: the method, the shares, the coefficients; or the note."""
    counts = f"{plural(report.n_trials, 'trial')}, {plural(report.n_tasks, 'task')}"
    head = f"Where the variance comes from ({counts})"
    if report.note is not None:
        return [f"{head}: not fitted: {report.note}"]
    shares = ", ".join(f"{name} {share:.1%}" for name, share in report.shares.items())
    lines = [f"{head}: {report.method}", f"  shares of the variance: {shares}"]
    width = max(len(c.term) for c in report.coefficients)
    for c in report.coefficients:
        p = "p<0.001" if c.p_value < 0.001 else f"p={c.p_value:.3f}"
        lines.append(f"  {c.term:<{width}}  {c.estimate:+.3f}  [{c.low:+.3f}, {c.high:+.3f}]  {p}")
    return lines


def _summarize(
    observations: Sequence[Observation],
    baseline_harness: str,
    baseline_model: str,
    min_tasks: int,
    is_pass_fail: bool,
) -> _Cells:
    """Check the design can be fitted and sum the trials per cell; raise _Unfitted if not."""
    if not observations:
        raise _Unfitted("no scored trial")
    for o in observations:
        if not math.isfinite(o.reward):
            raise _Unfitted(f"task {o.task!r}: reward {o.reward} is not a finite number")
    harness_names = {o.harness for o in observations}
    model_names = {o.model for o in observations}
    if len(harness_names) == 1 and len(model_names) == 1:
        raise _Unfitted("one harness and one model: nothing to compare")
    task_names = sorted({o.task for o in observations})
    if len(task_names) < min_tasks:
        few = plural(len(task_names), "task")
        raise _Unfitted(f"{few}, fewer than the {min_tasks} a fit needs")
    harnesses = _levels(harness_names, baseline_harness, "harness")
    models = _levels(model_names, baseline_model, "model")
    rewards = np.fromiter((o.reward for o in observations), np.float64, len(observations))
    if np.all(rewards == rewards[0]):
        raise _Unfitted(f"every trial scored {rewards[0]:g}: no variation to decompose")

    task_codes = {name: code for code, name in enumerate(task_names)}
    harness_codes = {name: code for code, name in enumerate(harnesses)}
    model_codes = {name: code for code, name in enumerate(models)}
    t = np.fromiter((task_codes[o.task] for o in observations), np.intp, len(observations))
    h = np.fromiter((harness_codes[o.harness] for o in observations), np.intp, len(observations))
    m = np.fromiter((model_codes[o.model] for o in observations), np.intp, len(observations))
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
    return _Cells(
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


def _levels(names: set[str], baseline: str, axis: str) -> tuple[str, ...]:
    """The axis's levels, baseline first; the baseline matters only with two or more."""
    levels = sorted(names)
    if len(levels) == 1:
        return (levels[0],)
    if baseline not in levels:
        raise _Unfitted(f"the baseline {axis} {baseline!r} has no scored trial")
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
            raise _Unfitted(
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


def _fixed_design(cells: _Cells, harness: Ints, model: Ints) -> Floats:
    """Treatment-coded columns: intercept, harnesses, models, then harness x model pairs."""
    n_h, n_m = len(cells.harnesses), len(cells.models)
    columns = [np.ones(harness.size)]
    columns += [(harness == k).astype(np.float64) for k in range(1, n_h)]
    columns += [(model == k).astype(np.float64) for k in range(1, n_m)]
    if cells.has_interaction:
        columns += [
            ((harness == a) & (model == b)).astype(np.float64)
            for a in range(1, n_h)
            for b in range(1, n_m)
        ]
    return np.column_stack(columns)


def _grid(cells: _Cells) -> Floats:
    """The fixed design of every harness x model pair, shaped (harness, model, column)."""
    n_h, n_m = len(cells.harnesses), len(cells.models)
    harness, model = np.divmod(np.arange(n_h * n_m), n_m)
    return _fixed_design(cells, harness, model).reshape(n_h, n_m, -1)


def _fit(cells: _Cells, is_pass_fail: bool) -> _Fit:
    """Fit the model with every warning caught; raise _Unfitted when the fit is not usable."""
    from statsmodels.tools.sm_exceptions import ModelWarning

    kind = _kind(is_pass_fail)
    fitter: Callable[[_Cells], _Fit] = _fit_binomial if is_pass_fail else _fit_linear
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fit = fitter(cells)
        except _Unfitted:
            raise
        except Exception as error:  # a numerical library's failure must not fail the report
            raise _Unfitted(
                f"the {kind} could not be fitted: {type(error).__name__}: {_first_line(error)}"
            ) from None
    for warning in caught:
        if issubclass(warning.category, ModelWarning | RuntimeWarning):
            raise _Unfitted(f"the {kind} did not fit cleanly: {_first_line(warning.message)}")
    if not (np.all(np.isfinite(fit.effects)) and np.all(np.isfinite(fit.covariance))):
        raise _Unfitted(f"the {kind} came out singular: its estimates are not finite")
    if np.any(np.diag(fit.covariance) <= 0):
        raise _Unfitted(f"the {kind} came out singular: an effect has no uncertainty")
    return fit


def _kind(is_pass_fail: bool) -> str:
    return "binomial mixed model" if is_pass_fail else "linear mixed model"


def _first_line(message: object) -> str:
    return (str(message).strip().splitlines() or [type(message).__name__])[0]


def _residual_df(cells: _Cells, n_effects: int) -> float:
    """The cells' degrees of freedom left within tasks: the error df of a randomized block
    design. With two harnesses and one model it is n_tasks - 1, as in the paired t-test."""
    return float(max(cells.task.size - cells.n_tasks - n_effects + 1, 1))


def _fit_linear(cells: _Cells) -> _Fit:
    from statsmodels.regression.mixed_linear_model import MixedLM

    exog = _fixed_design(cells, cells.harness, cells.model)
    means = cells.total / cells.count
    # Fitted in units of the means' sd: statsmodels calls a variance under 0.01 "on the
    # boundary", which rewards in [0, 1] would trip with no boundary near.
    center, unit = float(means.mean()), float(means.std())
    if unit == 0:
        raise _Unfitted("every cell has the same mean reward: no variation to decompose")
    result = MixedLM((means - center) / unit, exog, groups=cells.task).fit(reml=True)
    k = exog.shape[1]
    effects = np.asarray(result.fe_params, dtype=np.float64) * unit
    effects[0] += center
    covariance = np.asarray(result.cov_params(), dtype=np.float64)[:k, :k] * unit**2
    task = float(np.asarray(result.cov_re)[0, 0]) * unit**2
    cell = float(result.scale) * unit**2  # a cell mean's variance about its task's
    df_within = cells.n_trials - cells.task.size
    random = {"task": task}
    if df_within > 0:
        residual = float(cells.within.sum()) / df_within
        random["task:harness:model"] = max(cell - residual * float(np.mean(1 / cells.count)), 0)
        random["residual"] = residual
    else:
        random["residual"] = cell
    method = "linear mixed model (REML; task as random intercept; fitted to cell means)"
    return _Fit(method, effects, covariance, _residual_df(cells, k), random)


def _fit_binomial(cells: _Cells) -> _Fit:
    import scipy.sparse
    from scipy.special import expit

    exog = _fixed_design(cells, cells.harness, cells.model)
    n_cells, k = exog.shape
    tasks = scipy.sparse.csr_array(
        (np.ones(n_cells), (np.arange(n_cells), cells.task)), shape=(n_cells, cells.n_tasks)
    )
    model = _binomial_counts_model()(
        cells.total, cells.count, exog, tasks, np.zeros(cells.n_tasks, dtype=np.intp)
    )
    # ftol: stop once an iteration gains less than 1e-7 of the bound: at 150,000 trials about
    # 0.01 nats, far below the data's own noise, in a third to a half of the default's steps
    result = model.fit_vb(fit_method="L-BFGS-B", minim_opts={"ftol": 1e-7}, rng=0)
    effects = np.asarray(result.fe_mean, dtype=np.float64)
    task_sd = float(np.exp(result.vcp_mean[0]))
    if task_sd < SINGULAR_TASK_SD:
        raise _Unfitted("the binomial mixed model came out singular: the task variance is 0")
    task_effects = np.asarray(result.vc_mean, dtype=np.float64)
    chance = expit(exog @ effects + task_effects[cells.task])

    # The effects' covariance: the inverse curvature of the log-posterior in the effects and
    # the task intercepts at the fit, the task variance held at its estimate (as lme4's Wald
    # intervals are). Mean-field variational sds ignore that a harness's effect trades off
    # against the intercepts, and come out about half as wide.
    weight = cells.count * chance * (1 - chance)
    task_weight = np.bincount(cells.task, weights=weight, minlength=cells.n_tasks)
    cross = np.stack(
        [np.bincount(cells.task, weights=weight * c, minlength=cells.n_tasks) for c in exog.T]
    )  # (effect, task)
    curvature = (exog.T * weight) @ exog + np.eye(k) / PRIOR_SD_EFFECT**2
    curvature -= (cross / (task_weight + 1 / task_sd**2)) @ cross.T
    covariance = np.linalg.inv(curvature)
    if np.any(np.sqrt(np.abs(np.diag(covariance))) > UNBOUNDED_SD):
        raise _Unfitted(
            "the binomial mixed model is not bounded by the data (separation): an effect's"
            " interval spans its prior"
        )

    # The attempts of one cell can agree more than a binomial allows (a task that suits a
    # harness): the Pearson dispersion of the cells' counts widens the intervals, as a
    # quasi-binomial model does (Williams 1982). One attempt per cell has no such spread.
    df = _residual_df(cells, k)
    expected = cells.count * chance
    pearson = float(np.sum((cells.total - expected) ** 2 / (expected * (1 - chance))))
    dispersion = max(pearson / df, 1.0) if cells.count.max() > 1 else 1.0
    method = "binomial mixed model (logit; variational Bayes; task as random intercept)"
    if dispersion > 1:
        method += f"; intervals widened x{math.sqrt(dispersion):.2f} for overdispersion"
    random = {"task": task_sd**2, "residual": LOGISTIC_VARIANCE}
    return _Fit(method, effects, covariance * dispersion, df, random)


@cache
def _binomial_counts_model() -> Any:
    """statsmodels' `BinomialBayesMixedGLM` with the likelihood of counts, not 0/1 rows.

    It takes one 0/1 row per trial; summed per cell, a cell's trials give the same evidence
    lower bound (the variational objective) in a hundredth of the rows. Only the bound and its
    gradient change, by the factor `trials`; the fit (`fit_vb`) is statsmodels'.
    """
    from scipy.special import expit
    from statsmodels.genmod.bayes_mixed_glm import BinomialBayesMixedGLM

    class BinomialCountsMixedGLM(BinomialBayesMixedGLM):  # type: ignore[misc]
        def __init__(
            self, successes: Floats, trials: Floats, exog: Floats, exog_vc: Any, ident: Ints
        ) -> None:
            # past BinomialBayesMixedGLM.__init__, which refuses anything but 0/1 rows
            super(BinomialBayesMixedGLM, self).__init__(
                successes,
                exog,
                exog_vc=exog_vc,
                ident=ident,
                family=_binomial_family(),
                vcp_p=PRIOR_SD_LOG_SD,
                fe_p=PRIOR_SD_EFFECT,
            )
            self.trials = trials

        def _parts(
            self, vb_mean: Floats, vb_sd: Floats
        ) -> tuple[tuple[Floats, ...], Floats, Floats]:
            """The unpacked parameters, and each cell's linear predictor's mean and sd."""
            effects, log_sd, random = self._unpack(vb_mean)
            effects_sd, log_sd_sd, random_sd = self._unpack(vb_sd)
            moments: tuple[Floats, Floats] = self._lp_stats(effects, effects_sd, random, random_sd)
            parts = (effects, log_sd, random, effects_sd, log_sd_sd, random_sd)
            return parts, moments[0], np.sqrt(moments[1])

        def vb_elbo(self, vb_mean: Floats, vb_sd: Floats) -> float:
            parts, mean, sd = self._parts(vb_mean, vb_sd)
            trials: Floats = self.trials

            def h(z: Floats) -> Floats:
                return -trials * np.logaddexp(0, mean + sd * z)

            return float(self.vb_elbo_base(h, mean, *parts))

        def vb_elbo_grad(self, vb_mean: Floats, vb_sd: Floats) -> tuple[Floats, Floats]:
            parts, mean, sd = self._parts(vb_mean, vb_sd)
            trials: Floats = self.trials

            def h(z: Floats) -> Floats:
                chance: Floats = expit(mean + sd * z)
                return -trials * chance

            gradient: tuple[Floats, Floats] = self.vb_elbo_grad_base(h, mean, sd**2, *parts)
            return gradient

    return BinomialCountsMixedGLM


def _binomial_family() -> Any:
    from statsmodels.genmod.families import Binomial

    return Binomial()


def _coefficients(cells: _Cells, fit: _Fit) -> tuple[Coefficient, ...]:
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


def _shares(cells: _Cells, fit: _Fit) -> dict[str, float]:
    """The fixed effects' variance over the harness x model grid (each pair weighing the
    same), split into harness, model and interaction parts, beside the random variances."""
    eta = _grid(cells) @ fit.effects  # (harness, model)
    by_harness = eta.mean(axis=1)
    by_model = eta.mean(axis=0)
    interplay = eta - by_harness[:, None] - by_model[None, :] + eta.mean()
    variances: dict[str, float] = {}
    if len(cells.harnesses) > 1:
        variances["harness"] = float(by_harness.var())
    if len(cells.models) > 1:
        variances["model"] = float(by_model.var())
    if cells.has_interaction:
        variances["harness:model"] = float(np.mean(interplay**2))
    variances.update(fit.random)
    total = sum(variances.values())
    if not total > 0:
        raise _Unfitted("the fitted variances are all 0: nothing to share out")
    return {name: variance / total for name, variance in variances.items()}
