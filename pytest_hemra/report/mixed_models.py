"""The mixed models behind the variance decomposition (`variance.py`).

Both models are fitted to one row per **cell** (a task x harness x model with trials), never to
the trials themselves, so 150,000 trials fit in a fraction of a second:

- **pass/fail rewards** (every reward 0 or 1): a logistic mixed model on each cell's passes out
  of its trials, the same likelihood as one Bernoulli row per trial, fitted by Laplace's
  approximation with numpy alone (`_fit_binomial`): the task sd maximises the approximate
  marginal likelihood, the effects and task intercepts are their joint mode given it; the
  intervals come from the likelihood's curvature there, widened for overdispersion, and the
  task x harness x model variance is the overdispersion's method-of-moments estimate. The task
  variance's interval is the profile of that likelihood, the cell term's a Wald interval on
  its moment estimate.
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
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.intp]

LOGISTIC_VARIANCE = math.pi**2 / 3  # the latent residual of a logit model (Nakagawa 2013)
PRIOR_SD_EFFECT = 10.0  # a fixed effect's prior sd in log-odds: weak, odds of e^20 within 2 sd
ATTENUATION = 16 * math.sqrt(3) / (15 * math.pi)  # the logistic as a scaled normal, c
PROFILE_DROP = 1.920729  # half chi-square(1)'s 95% point: a profile interval's log-likelihood drop
NORMAL_QUANTILE = 1.959964  # the normal's 97.5% point
PROFILE_FIRST_STEP = 0.25  # the profile interval's first step from the estimate, in log sd
PROFILE_TOLERANCE = 0.02  # an end's signed root of twice the drop within this of the target
PROFILE_STEPS = 8
NULL_CELLS = 40_000  # cells drawn in all for Pearson's expectation with no cell term
NULL_NEWTON_STEPS = 6
NULL_MAX_STEP = 3.0  # log-odds: the widest Newton step of a task intercept fitted to a draw
NULL_MAX_LOG_ODDS = 30.0
MAX_TASK_SD = 20.0  # the widest task sd in log-odds the binomial fit looks at
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
    # what the fixed effects' variances are multiplied by to be on the random terms' scale
    # (binomial with a cell term: the effects are fitted averaged over it, hence shrunk)
    effect_scale: float = 1.0
    # a random variance's 95% interval (binomial: task, task:harness:model); none for the rest
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)


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
    troubles: tuple[type[Warning], ...] = (RuntimeWarning,)
    if not is_pass_fail:  # statsmodels' own warnings; the binomial fit does not import it
        from statsmodels.tools.sm_exceptions import ModelWarning

        troubles += (ModelWarning,)
    for warning in caught:
        if issubclass(warning.category, troubles):
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
    """The logistic mixed model by Laplace's approximation, on a (task, pair) grid of counts.

    A cell is summed to its passes out of its trials, and the cells are laid out as a dense
    (task x harness-model pair) grid, so every step is a handful of numpy reductions over the
    cells and small (pair x effect) products: no per-trial row, no sparse matrix, no statsmodels.
    """
    from scipy.optimize import minimize_scalar

    grid = _CountGrid.of(cells)
    best = _LaplaceFit(grid)
    low, high = math.log(SINGULAR_TASK_SD / 10), math.log(MAX_TASK_SD)
    # the task sd maximising the approximate marginal likelihood, the effects and task
    # intercepts at their joint mode given it (glmer's nAGQ=0 with the sd profiled)
    found = minimize_scalar(
        lambda log_sd: -best.evaluate(log_sd), bounds=(low, high), method="bounded",
        options={"xatol": 1e-4},
    )  # fmt: skip
    log_sd = float(found.x)
    peak = best.evaluate(log_sd)
    task_sd = math.exp(log_sd)
    if task_sd < SINGULAR_TASK_SD:
        raise Unfitted("the binomial mixed model came out singular: the task variance is 0")
    # The effects' covariance: the inverse curvature of the log-likelihood in the effects once
    # the task intercepts are profiled out, the task variance held at its estimate (as lme4's
    # Wald intervals are).
    covariance = np.asarray(np.linalg.inv(best.schur), dtype=np.float64)
    if np.any(np.sqrt(np.abs(np.diag(covariance))) > UNBOUNDED_SD):
        raise Unfitted(
            "the binomial mixed model is not bounded by the data (separation): an effect's"
            " interval spans its prior"
        )

    # The attempts of one cell can agree more than a binomial allows (a task that suits a
    # harness): the task x harness x model component. A cell term of variance tau^2 on the
    # log-odds multiplies a cell's expected squared Pearson residual by about
    # 1 + tau^2 (n - 1) p (1 - p) (delta method), and the fit takes the same share of both
    # parts, so Pearson's statistic over its expectation with no cell term is about 1 + tau^2
    # times the cells' mean of (n - 1) p (1 - p): a method of moments for tau^2. The
    # statistic over df widens the intervals, as a quasi-binomial model does (Williams 1982).
    # One attempt per cell has no such spread.
    k = grid.pair_design.shape[1]
    df = _residual_df(cells, k)
    chance, present = best.chance, grid.trials > 0
    n, spread = grid.trials[present], (chance * (1 - chance))[present]
    pearson = float(np.sum((grid.passes[present] - n * chance[present]) ** 2 / (n * spread)))
    repeated = bool(cells.count.max() > 1)
    dispersion = max(pearson / df, 1.0) if repeated else 1.0
    method = "binomial mixed model (logit; Laplace approximation on each cell's pass counts;"
    method += " task as random intercept)"
    if dispersion > 1:
        method += f"; intervals widened x{math.sqrt(dispersion):.2f} for overdispersion"
    # Pearson's statistic with no cell term runs below df (the fit bends most to the cells with
    # few passes or failures), by as much as the cell term adds with few attempts: its
    # expectation with none is read from draws of the fitted model instead (`_null_pearson`)
    cell_variance = raw = null = moment = 0.0
    if repeated:
        null = _null_pearson(grid, best, log_sd)
        moment = float(np.mean((n - 1) * spread))
        raw = (pearson / null - 1) / moment
        cell_variance = max(raw, 0.0)
    # A cell term the model leaves out shrinks the log-odds it fits (the effects and the task
    # intercepts alike) towards 0 by about 1 / sqrt(1 + c^2 tau^2), c = 16 sqrt(3) / (15 pi)
    # (Zeger, Liang and Albert 1988): their variances are put back on the cell term's scale.
    # The coefficients stay as fitted (per task, averaged over the cell term).
    effect_scale = 1 + ATTENUATION**2 * cell_variance
    random = {"task": task_sd**2 * effect_scale}
    if repeated:
        random["task:harness:model"] = cell_variance
    random["residual"] = LOGISTIC_VARIANCE
    covariance = covariance * dispersion
    effects = best.effects.copy()
    sd_low, sd_high = _profile_interval(best, log_sd, peak, (low, high))
    intervals = {"task": (sd_low**2 * effect_scale, sd_high**2 * effect_scale)}
    if repeated:
        # Pearson's statistic is a sum over tasks, which are independent: the spread of the
        # tasks' sums gives its standard error, and the method of moments turns it into one for
        # tau^2 (a Wald interval, clipped at 0 like the estimate)
        by_task = np.where(present, (grid.passes - grid.trials * chance) ** 2, 0.0)
        by_task = (by_task / np.where(present, grid.trials * chance * (1 - chance), 1.0)).sum(1)
        spread_pearson = math.sqrt(float(by_task.var(ddof=1)) * by_task.size)
        half = NORMAL_QUANTILE * spread_pearson / (null * moment)
        intervals["task:harness:model"] = (max(raw - half, 0.0), max(raw + half, 0.0))
    return Fit(method, effects, covariance, df, random, effect_scale, intervals)


def _null_pearson(grid: _CountGrid, fit: _LaplaceFit, log_sd: float) -> float:
    """Pearson's statistic's expectation under the fitted model with no cell term, by
    simulation: passes drawn from each cell's fitted chance, the task intercepts fitted again
    to each draw (Newton steps per task, the effects and task sd held), and the statistic's
    mean over the draws, less the effects' degrees of freedom (not refitted). Enough draws for
    about NULL_CELLS cells in all, seeded: a report reads the same every time."""
    from scipy.special import expit

    present = grid.trials > 0
    draws = min(max(math.ceil(NULL_CELLS / int(present.sum())), 2), 200)
    fixed = grid.pair_design @ fit.effects  # (pair,)
    precision = math.exp(-2 * log_sd)
    chance = expit(fixed + fit.intercepts[:, None])
    trials = grid.trials.astype(np.int64)
    passes = np.random.default_rng(0).binomial(trials, chance, (draws, *chance.shape))
    intercepts = np.repeat(fit.intercepts[None, :], draws, axis=0)
    for _ in range(NULL_NEWTON_STEPS):
        chance = expit(fixed + intercepts[..., None])
        gradient = (passes - grid.trials * chance).sum(axis=2) - precision * intercepts
        curvature = (grid.trials * chance * (1 - chance)).sum(axis=2) + precision
        # a task a draw passes (or fails) throughout has its intercept far out, and so flat a
        # likelihood that a full Newton step would overshoot: steps of a few log-odds at most
        intercepts += np.clip(gradient / curvature, -NULL_MAX_STEP, NULL_MAX_STEP)
    # kept off 0 and 1, where Pearson's residual would be 0 / 0
    chance = expit(np.clip(fixed + intercepts[..., None], -NULL_MAX_LOG_ODDS, NULL_MAX_LOG_ODDS))
    variance = np.where(present, grid.trials * chance * (1 - chance), 1.0)
    pearson = np.where(present, (passes - grid.trials * chance) ** 2 / variance, 0.0)
    total = float(np.mean(pearson.sum(axis=(1, 2))))
    return total - float(grid.pair_design.shape[1] - 1)


def _profile_interval(
    fit: _LaplaceFit, log_sd: float, peak: float, bounds: tuple[float, float]
) -> tuple[float, float]:
    """The task sd's 95% profile-likelihood interval: the sds whose Laplace log-likelihood
    (the effects and task intercepts at their mode for each) is within PROFILE_DROP of its
    peak, the chi-square(1) cut-off.

    Each end is found by the secant method on the signed root of twice the drop, which is
    nearly linear in log sd (exactly so where the likelihood is quadratic): three or four fits,
    each warm-started from the last. An end the likelihood does not drop by that much within
    the bounds the fit looks in is that bound (the lower one read as 0)."""
    target = math.sqrt(2 * PROFILE_DROP)  # the normal's 97.5% point

    def signed_root(x: float) -> float:
        return math.sqrt(max(2 * (peak - fit.evaluate(x)), 0.0))

    ends = []
    for bound in bounds:
        last, last_root = log_sd, 0.0
        x = log_sd + math.copysign(PROFILE_FIRST_STEP, bound - log_sd)
        for _ in range(PROFILE_STEPS):
            x = min(max(x, bounds[0]), bounds[1])
            root = signed_root(x)
            if abs(root - target) < PROFILE_TOLERANCE:
                break
            if x == bound and root < target:
                x = -math.inf if bound < log_sd else bound
                break
            if abs(root - last_root) > 1e-9:
                step = (target - root) * (x - last) / (root - last_root)
            else:  # flat so far: go twice as far out
                step = x - last
            last, last_root, x = x, root, x + step
        ends.append(math.exp(x))
    return ends[0], ends[1]


@dataclass(frozen=True)
class _CountGrid:
    """The cells as a dense (task, pair) grid of passes and trials (0 where a pair did not run
    a task), and the fixed design of each harness x model pair."""

    passes: Floats  # (task, pair)
    trials: Floats
    pair_design: Floats  # (pair, effect)

    @classmethod
    def of(cls, cells: Cells) -> _CountGrid:
        n_h, n_m = len(cells.harnesses), len(cells.models)
        harness, model = np.divmod(np.arange(n_h * n_m), n_m)
        pair = cells.harness * n_m + cells.model
        passes = np.zeros((cells.n_tasks, n_h * n_m))
        trials = np.zeros((cells.n_tasks, n_h * n_m))
        passes[cells.task, pair] = cells.total
        trials[cells.task, pair] = cells.count
        return cls(passes, trials, fixed_design(cells, harness, model))


class _LaplaceFit:
    """The joint mode of the effects and task intercepts for a given task sd (penalised IRLS,
    warm-started from the last sd tried) and the Laplace log-likelihood there."""

    def __init__(self, grid: _CountGrid) -> None:
        self.grid = grid
        n_tasks, k = grid.trials.shape[0], grid.pair_design.shape[1]
        self.effects = np.zeros(k)
        self.intercepts = np.zeros(n_tasks)
        self.schur = np.eye(k)
        self.chance = np.full(grid.trials.shape, 0.5)

    def evaluate(self, log_sd: float) -> float:
        from scipy.special import expit

        grid, design = self.grid, self.grid.pair_design
        precision = math.exp(-2 * log_sd)  # 1 / s_task^2
        prior = np.eye(design.shape[1]) / PRIOR_SD_EFFECT**2
        effects, intercepts = self.effects, self.intercepts
        objective = self._penalised(effects, intercepts, precision)
        for _ in range(100):
            chance = expit(design @ effects + intercepts[:, None])
            weight = grid.trials * chance * (1 - chance)
            residual = grid.passes - grid.trials * chance
            task_weight = weight.sum(axis=1) + precision
            cross = weight @ design  # (task, effect)
            gradient = design.T @ residual.sum(axis=0) - prior @ effects
            task_gradient = residual.sum(axis=1) - precision * intercepts
            schur = design.T @ (weight.sum(axis=0)[:, None] * design) + prior
            schur -= (cross / task_weight[:, None]).T @ cross
            step = np.linalg.solve(schur, gradient - cross.T @ (task_gradient / task_weight))
            task_step = (task_gradient - cross @ step) / task_weight
            for _ in range(30):  # halve a step that overshoots
                trial = self._penalised(effects + step, intercepts + task_step, precision)
                if trial >= objective - 1e-9:
                    break
                step, task_step = step / 2, task_step / 2
            effects, intercepts = effects + step, intercepts + task_step
            gain, objective = trial - objective, trial
            if max(np.abs(step).max(), np.abs(task_step).max()) < 1e-8 or abs(gain) < 1e-10:
                break
        chance = expit(design @ effects + intercepts[:, None])
        task_weight = (grid.trials * chance * (1 - chance)).sum(axis=1)
        self.effects, self.intercepts, self.chance = effects, intercepts, chance
        weight = grid.trials * chance * (1 - chance)
        cross = weight @ design
        self.schur = design.T @ (weight.sum(axis=0)[:, None] * design) + prior
        self.schur -= (cross / (task_weight + precision)[:, None]).T @ cross
        # log of the integral over each task's intercept, by Laplace: the mode's value and
        # -1/2 log(1 + s^2 w) for the curvature against the prior's
        return objective - 0.5 * float(np.sum(np.log1p(task_weight / precision)))

    def _penalised(self, effects: Floats, intercepts: Floats, precision: float) -> float:
        grid = self.grid
        eta = grid.pair_design @ effects + intercepts[:, None]
        likelihood = float(np.sum(grid.passes * eta - grid.trials * np.logaddexp(0, eta)))
        penalty = precision * float(intercepts @ intercepts) + float(effects @ effects) / (
            PRIOR_SD_EFFECT**2
        )
        return likelihood - 0.5 * penalty
