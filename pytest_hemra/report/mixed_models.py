"""The mixed models behind the variance decomposition (`variance.py`), fitted with statsmodels.

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
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.intp]

LOGISTIC_VARIANCE = math.pi**2 / 3  # the latent residual of a logit model (Nakagawa 2013)
PRIOR_SD_EFFECT = 10.0  # a fixed effect's prior sd in log-odds: weak, odds of e^20 within 2 sd
PRIOR_SD_LOG_SD = 1.0  # the prior sd of the log of the task sd (statsmodels' default)
UNBOUNDED_SD = PRIOR_SD_EFFECT / 2  # a posterior sd this wide means the data do not bound it
SINGULAR_TASK_SD = 1e-3  # a task sd below this on the log-odds scale: the tasks collapsed


@dataclass(frozen=True)
class Cells:
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
class Fit:
    """A fitted model: its fixed effects and their covariance, and its random variances."""

    method: str
    effects: Floats  # the fixed effects, in the columns of `fixed_design`
    covariance: Floats
    df: float  # the degrees of freedom of the intervals
    random: dict[str, float]  # task, task:harness:model, residual -> variance


class Unfitted(Exception):
    """Why no model was fitted, in one line; `variance.decompose` makes it a report's note."""


def fixed_design(cells: Cells, harness: Ints, model: Ints) -> Floats:
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


def fit_model(cells: Cells, is_pass_fail: bool) -> Fit:
    """Fit the model with every warning caught; raise Unfitted when the fit is not usable."""
    from statsmodels.tools.sm_exceptions import ModelWarning

    kind = model_kind(is_pass_fail)
    fitter: Callable[[Cells], Fit] = _fit_binomial if is_pass_fail else _fit_linear
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fit = fitter(cells)
        except Unfitted:
            raise
        except Exception as error:  # a numerical library's failure must not fail the report
            raise Unfitted(
                f"the {kind} could not be fitted: {type(error).__name__}: {_first_line(error)}"
            ) from None
    for warning in caught:
        if issubclass(warning.category, ModelWarning | RuntimeWarning):
            raise Unfitted(f"the {kind} did not fit cleanly: {_first_line(warning.message)}")
    if not (np.all(np.isfinite(fit.effects)) and np.all(np.isfinite(fit.covariance))):
        raise Unfitted(f"the {kind} came out singular: its estimates are not finite")
    if np.any(np.diag(fit.covariance) <= 0):
        raise Unfitted(f"the {kind} came out singular: an effect has no uncertainty")
    return fit


def model_kind(is_pass_fail: bool) -> str:
    return "binomial mixed model" if is_pass_fail else "linear mixed model"


def _first_line(message: object) -> str:
    return (str(message).strip().splitlines() or [type(message).__name__])[0]


def _residual_df(cells: Cells, n_effects: int) -> float:
    """The cells' degrees of freedom left within tasks: the error df of a randomized block
    design. With two harnesses and one model it is n_tasks - 1, as in the paired t-test."""
    return float(max(cells.task.size - cells.n_tasks - n_effects + 1, 1))


def _fit_linear(cells: Cells) -> Fit:
    from statsmodels.regression.mixed_linear_model import MixedLM

    exog = fixed_design(cells, cells.harness, cells.model)
    means = cells.total / cells.count
    # Fitted in units of the means' sd: statsmodels calls a variance under 0.01 "on the
    # boundary", which rewards in [0, 1] would trip with no boundary near.
    center, unit = float(means.mean()), float(means.std())
    if unit == 0:
        raise Unfitted("every cell has the same mean reward: no variation to decompose")
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
    return Fit(method, effects, covariance, _residual_df(cells, k), random)


def _fit_binomial(cells: Cells) -> Fit:
    import scipy.sparse
    from scipy.special import expit

    exog = fixed_design(cells, cells.harness, cells.model)
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
        raise Unfitted("the binomial mixed model came out singular: the task variance is 0")
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
        raise Unfitted(
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
    return Fit(method, effects, covariance * dispersion, df, random)


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
