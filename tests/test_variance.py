"""Where the variance comes from (report/variance.py), on data simulated from known components.

Every dataset is drawn from a seeded generator, so each test sees the same numbers every run.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse
from scipy.special import expit
from statsmodels.genmod.bayes_mixed_glm import BinomialBayesMixedGLM
from statsmodels.regression.mixed_linear_model import MixedLM, VCSpec

from pytest_hemra.report.mixed_models import PRIOR_SD_EFFECT
from pytest_hemra.report.stats import paired_difference
from pytest_hemra.report.variance import (
    Observation,
    VarianceReport,
    decompose,
    render_variance,
)

HARNESSES = ("base", "fast", "slow")
MODELS = ("small", "large")
HARNESS_EFFECT = {"base": 0.0, "fast": 0.15, "slow": -0.1}
MODEL_EFFECT = {"small": 0.0, "large": 0.1}


def simulate(
    *,
    tasks: int,
    attempts: int,
    pass_fail: bool,
    task_sd: float,
    cell_sd: float = 0.0,
    noise_sd: float = 0.0,
    scale: float = 1.0,
    interaction: float = 0.0,
    seed: int = 0,
) -> list[Observation]:
    """Rewards from intercept + harness + model (+ `interaction` for fast on large) + task +
    task x cell + noise: the reward itself (linear) or the log-odds of a pass (pass/fail).
    `scale` multiplies the harness and model effects."""
    rng = np.random.default_rng(seed)
    observations = []
    for t in range(tasks):
        task_effect = rng.normal(0, task_sd)
        for harness in HARNESSES:
            for model in MODELS:
                mean = (
                    (-0.3 if pass_fail else 0.5)
                    + scale * (HARNESS_EFFECT[harness] + MODEL_EFFECT[model])
                    + interaction * (harness == "fast" and model == "large")
                    + task_effect
                    + rng.normal(0, cell_sd)
                )
                if pass_fail:
                    rewards = (rng.random(attempts) < expit(mean)).astype(float)
                else:
                    rewards = mean + rng.normal(0, noise_sd, attempts)
                observations += [Observation(f"t{t}", harness, model, float(r)) for r in rewards]
    return observations


def fixed_variance(scale: float = 1.0, interaction: float = 0.0) -> float:
    """The variance of the true fixed part over the harness x model grid, each pair once."""
    grid = np.array(
        [
            [
                scale * (HARNESS_EFFECT[h] + MODEL_EFFECT[m])
                + interaction * (h == "fast" and m == "large")
                for m in MODELS
            ]
            for h in HARNESSES
        ]
    )
    return float(grid.var())


def coefficient(report: VarianceReport, term: str) -> tuple[float, float, float]:
    (found,) = [c for c in report.coefficients if c.term == term]
    return found.estimate, found.low, found.high


def test_linear_fit_recovers_the_harness_model_and_interaction_effects_within_intervals() -> None:
    interaction = 0.08
    report = decompose(
        simulate(
            tasks=30,
            attempts=4,
            pass_fail=False,
            task_sd=0.2,
            cell_sd=0.1,
            noise_sd=0.15,
            interaction=interaction,
        ),
        "base",
        "small",
    )

    assert report.note is None
    assert report.method.startswith("linear mixed model")
    assert (report.n_trials, report.n_tasks) == (30 * 6 * 4, 30)
    # a main effect is averaged over the other axis: fast gains its interaction on half the models
    truths = {
        "harness[fast]": 0.15 + interaction / 2,
        "harness[slow]": -0.1,
        "model[large]": 0.1 + interaction / 3,
        "harness[fast]:model[large]": interaction,
        "harness[slow]:model[large]": 0.0,
    }
    assert [c.term for c in report.coefficients] == list(truths)
    for term, truth in truths.items():
        _, low, high = coefficient(report, term)
        assert low <= truth <= high, term
    assert coefficient(report, "harness[fast]")[1] > 0  # an effect this size is found

    shares = report.shares
    assert list(shares) == [
        "harness", "model", "harness:model", "task", "task:harness:model", "residual"
    ]  # fmt: skip
    assert report.too_few_levels == ("model",)  # two models: one difference
    assert sum(shares.values()) == pytest.approx(1)
    variances = {"task": 0.2**2, "task:harness:model": 0.1**2, "residual": 0.15**2}
    total = sum(variances.values()) + fixed_variance(interaction=interaction)
    for name, variance in variances.items():  # 30 tasks estimate a variance to about 25%
        assert shares[name] == pytest.approx(variance / total, rel=0.5), name
    assert shares["task"] > shares["residual"] > shares["harness"] > shares["harness:model"]


def test_binomial_fit_recovers_the_log_odds_effects_within_intervals() -> None:
    report = decompose(
        simulate(tasks=30, attempts=4, pass_fail=True, task_sd=1.2, scale=5), "base", "small"
    )

    assert report.note is None
    assert report.method.startswith("binomial mixed model")
    truths = {"harness[fast]": 0.75, "harness[slow]": -0.5, "model[large]": 0.5}
    for term, truth in truths.items():
        estimate, low, high = coefficient(report, term)
        assert low <= truth <= high, term
        assert estimate * truth > 0, term
    assert coefficient(report, "harness[fast]:model[large]")[1] < 0  # no interaction: 0 inside
    # on the latent scale: task 1.2**2 = 1.44 against the logistic residual pi**2 / 3 = 3.29
    total = 1.44 + np.pi**2 / 3 + fixed_variance(scale=5)
    assert report.shares["task"] == pytest.approx(1.44 / total, rel=0.5)
    assert report.shares["residual"] > report.shares["task"] > report.shares["harness"]
    assert sum(report.shares.values()) == pytest.approx(1)


def test_linear_fit_on_cell_means_is_the_reml_fit_on_every_trial() -> None:
    """With the same attempts in every cell, fitting the cells' means loses nothing."""
    observations = simulate(
        tasks=12, attempts=3, pass_fail=False, task_sd=0.2, cell_sd=0.1, noise_sd=0.1, seed=3
    )
    report = decompose(observations, "base", "small")

    tasks = np.array([int(o.task[1:]) for o in observations])
    harness = np.array([HARNESSES.index(o.harness) for o in observations])
    model = np.array([MODELS.index(o.model) for o in observations])
    exog = np.column_stack(
        [np.ones(tasks.size), harness == 1, harness == 2, model == 1, (harness > 0) & (model == 1)]
    ).astype(float)
    exog[:, 4] = ((harness == 1) & (model == 1)).astype(float)
    exog = np.column_stack([exog, ((harness == 2) & (model == 1)).astype(float)])
    cell = harness * 2 + model
    rows = [np.flatnonzero(tasks == t) for t in range(12)]
    cells = VCSpec(["cell"], [list(range(12))], [[np.eye(6)[cell[r]] for r in rows]])
    full = MixedLM(
        np.array([o.reward for o in observations]),
        exog,
        groups=tasks,
        exog_re=np.ones((tasks.size, 1)),
        exog_vc=cells,
    ).fit(reml=True)

    assert report.note is None
    assert coefficient(report, "harness[slow]:model[large]")[0] == pytest.approx(
        full.fe_params[5], abs=1e-6
    )
    total = 1 / sum(report.shares.values())
    variances = [full.cov_re[0, 0], full.vcomp[0], full.scale]
    shares = [report.shares[k] for k in ("task", "task:harness:model", "residual")]
    fixed = sum(report.shares[k] for k in ("harness", "model", "harness:model"))
    # the same variances, up to one common factor (the total) and the optimizer's tolerance
    ratio = np.array(shares) / np.array(variances)
    assert ratio == pytest.approx(np.full(3, ratio[0]), rel=2e-3)
    assert total == pytest.approx(1)
    assert 0 < fixed < 1


def test_binomial_fit_on_cell_counts_agrees_with_statsmodels_on_one_row_per_trial() -> None:
    """The Laplace fit on each cell's counts lands where statsmodels' variational fit of the
    same model on one 0/1 row per trial does."""
    observations = simulate(tasks=12, attempts=5, pass_fail=True, task_sd=1.0, scale=5, seed=4)
    report = decompose(observations, "base", "small")

    tasks = np.array([int(o.task[1:]) for o in observations])
    harness = np.array([HARNESSES.index(o.harness) for o in observations])
    model = np.array([MODELS.index(o.model) for o in observations])
    exog = np.column_stack(
        [np.ones(tasks.size), harness == 1, harness == 2, model == 1]
        + [(harness == a) & (model == 1) for a in (1, 2)]
    ).astype(float)
    rows = scipy.sparse.csr_array(
        (np.ones(tasks.size), (np.arange(tasks.size), tasks)), shape=(tasks.size, 12)
    )
    stock = BinomialBayesMixedGLM(
        np.array([o.reward for o in observations]),
        exog,
        rows,
        np.zeros(12, dtype=int),
        vcp_p=1.0,
        fe_p=PRIOR_SD_EFFECT,
    ).fit_vb(fit_method="L-BFGS-B", rng=0)

    assert report.note is None
    slow = coefficient(report, "harness[slow]:model[large]")[0]
    assert slow == pytest.approx(stock.fe_mean[5], abs=0.02)
    task_variance = np.exp(2 * stock.vcp_mean[0])
    latent_total = (np.pi**2 / 3) / report.shares["residual"]
    assert report.shares["task"] * latent_total == pytest.approx(task_variance, rel=0.05)


def test_two_harnesses_under_one_model_get_the_paired_t_test_of_the_comparison_table() -> None:
    """Equal attempts everywhere: the linear model's harness interval is the paired t-test's."""
    rng = np.random.default_rng(5)
    difficulty = rng.uniform(0.1, 0.8, 15)
    observations = [
        Observation(f"t{t}", h, "m", float(rng.uniform(0, 0.2) + difficulty[t] + 0.04 * (h == "b")))
        for t in range(15)
        for h in ("a", "b")
        for _ in range(3)
    ]
    by_task = {
        h: {f"t{t}": [o.reward for o in observations if (o.harness, o.task) == (h, f"t{t}")]
            for t in range(15)}
        for h in ("a", "b")
    }  # fmt: skip

    report = decompose(observations, "a", "m")
    paired = paired_difference(by_task["b"], by_task["a"])

    (effect,) = report.coefficients
    assert (effect.estimate, effect.low, effect.high, effect.p_value) == pytest.approx(
        (paired.diff, paired.low, paired.high, paired.p_value), rel=1e-3
    )


def test_a_pair_that_passed_every_trial_leaves_out_the_interaction_not_the_fit() -> None:
    observations = [
        o if (o.harness, o.model) != ("slow", "large") else Observation(o.task, "slow", "large", 1)
        for o in simulate(tasks=12, attempts=3, pass_fail=True, task_sd=1.0, scale=5)
    ]
    report = decompose(observations, "base", "small")

    assert report.note is None
    assert list(report.shares) == ["harness", "model", "task", "task:harness:model", "residual"]
    assert report.too_few_levels == ("model",)


def flat(reward: float = 1.0) -> list[Observation]:
    return [Observation(f"t{t}", h, "m", reward) for t in range(12) for h in ("a", "b")]


@pytest.mark.parametrize(
    ("observations", "note"),
    [
        pytest.param([], "no scored trial", id="nothing"),
        pytest.param(
            simulate(tasks=9, attempts=2, pass_fail=False, task_sd=0.2, noise_sd=0.1),
            "9 tasks, fewer than the 10 a fit needs",
            id="too-few-tasks",
        ),
        pytest.param(flat(1.0), "every trial scored 1: no variation to decompose", id="all-pass"),
        pytest.param(
            flat(0.4), "every trial scored 0.4: no variation to decompose", id="all-equal"
        ),
        pytest.param(
            [Observation(f"t{t}", "a", "m", t % 2) for t in range(20)],
            "one harness and one model: nothing to compare",
            id="one-harness-one-model",
        ),
        pytest.param(
            [Observation(f"t{t}", h, "m", float(h == "a")) for t in range(12) for h in "ab"],
            "harness 'a' passed every trial: its log-odds are unbounded (separation)",
            id="perfect-separation",
        ),
        pytest.param(
            [
                Observation(f"t{t}", h, m, float(h == "a" and t % 2 == 0))
                for t in range(12)
                for h in "ab"
                for m in ("m", "n")
            ],
            "harness 'b' failed every trial: its log-odds are unbounded (separation)",
            id="a-harness-that-never-passes",
        ),
        pytest.param(
            [*flat(0.0)[:-1], Observation("t11", "b", "m", float("nan"))],
            "task 't11': reward nan is not a finite number",
            id="not-finite",
        ),
        pytest.param(
            [Observation(f"t{t}", h, "m", t % 3 / 2) for t in range(12) for h in ("x", "y")],
            "the baseline harness 'a' has no scored trial",
            id="no-baseline",
        ),
    ],
)
def test_a_model_that_cannot_be_fitted_gives_a_one_line_note(
    observations: list[Observation], note: str
) -> None:
    report = decompose(observations, "a", "m")

    assert report.note == note
    assert (report.coefficients, report.shares) == ((), {})
    assert render_variance(report) == [
        f"Where the variance comes from ({len(observations)} trials,"
        f" {len({o.task for o in observations})} tasks): not fitted: {note}"
    ]


def test_a_singular_fit_is_a_note_and_its_warnings_do_not_leak() -> None:
    """Every task has the same mean reward: the task variance's estimate sits at 0."""
    observations = [
        Observation(f"t{t}", h, "m", 0.5 + side * (0.1 + 0.05 * (-1) ** t) + noise)
        for t in range(12)
        for h, side in (("a", -1), ("b", 1))
        for noise in (-0.02, 0.02)
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = decompose(observations, "a", "m")

    assert report.note is not None
    assert report.note.startswith("the linear mixed model did not fit cleanly: ")
    assert "\n" not in report.note


def test_a_pair_without_enough_tasks_leaves_out_the_interaction_not_the_fit() -> None:
    observations = simulate(tasks=12, attempts=2, pass_fail=False, task_sd=0.2, noise_sd=0.1)
    thin = [o for o in observations if (o.harness, o.model) != ("slow", "large") or o.task < "t5"]
    report = decompose(thin, "base", "small")

    assert report.note is None
    assert "harness:model" not in report.shares
    assert [c.term for c in report.coefficients] == [
        "harness[fast]", "harness[slow]", "model[large]"
    ]  # fmt: skip


def test_the_rendering_names_method_each_source_and_each_coefficient() -> None:
    report = decompose(
        simulate(tasks=12, attempts=2, pass_fail=False, task_sd=0.2, noise_sd=0.1),
        "base",
        "small",
    )

    lines = render_variance(report)

    assert lines[0] == f"Where the variance comes from (144 trials, 12 tasks): {report.method}"
    assert lines[1] == "  source               share  variance  95% interval"
    sources = lines[2 : 2 + len(report.shares)]
    assert [line.split()[0] for line in sources] == list(report.shares)
    assert all(line.split()[1].endswith("%") for line in sources)
    # the linear model's fixed sources have intervals (from the effects' covariance), its
    # random ones none
    assert sources[0].split()[3].startswith("[")
    assert sources[-1].endswith("  none")
    assert lines[2 + len(report.shares)] == (
        "  too few levels to estimate a variance beyond those run: model (its share describes"
        " them only)"
    )
    assert len(lines) == 3 + len(report.shares) + len(report.coefficients)
    assert lines[-len(report.coefficients)].split()[0] == "harness[fast]"
    assert lines[-len(report.coefficients)].split()[2].startswith("[")


def test_the_binomial_rendering_gives_every_component_its_interval_within_100_columns() -> None:
    report = decompose(
        simulate(tasks=30, attempts=3, pass_fail=True, task_sd=1.0, cell_sd=0.5, scale=5),
        "base",
        "small",
    )

    lines = render_variance(report)

    rows = {line.split()[0]: line for line in lines[2 : 2 + len(report.shares)]}
    for name in ("harness", "model", "harness:model", "task", "task:harness:model"):
        low, high = report.intervals[name]
        assert rows[name].endswith(f"  [{low:.3g}, {high:.3g}]"), name
        assert f"  {report.variances[name]:.3g}  " in rows[name], name
    assert rows["residual"].endswith("  none: the logistic's pi^2/3")
    assert max(len(line) for line in lines[1:]) < 100


def test_binomial_intervals_hold_the_true_components_of_seeded_runs() -> None:
    """Twelve seeded runs of known components (3 harnesses x 2 models, 60 tasks, 4 attempts):
    a 95% interval holds its truth in about 11.4 of them, so at least 10 (the chance of 9 or
    fewer is 3%), and each interval brackets its own estimate."""
    truths = {
        "harness": float(np.var([0.0, 0.75, -0.5])),  # 5 x HARNESS_EFFECT
        "model": float(np.var([0.0, 0.5])),
        "task": 1.0,
        "task:harness:model": 0.25,
    }
    held = dict.fromkeys(truths, 0)
    for seed in range(12):
        observations = simulate(
            tasks=60, attempts=4, pass_fail=True, task_sd=1.0, cell_sd=0.5, scale=5, seed=seed
        )
        report = decompose(observations, "base", "small")

        assert report.note is None
        for name, truth in truths.items():
            low, high = report.intervals[name]
            assert low <= report.variances[name] <= high, (seed, name)
            held[name] += low <= truth <= high
    assert min(held.values()) >= 10, held


def test_one_pass_fail_attempt_per_cell_is_fitted_without_a_task_by_cell_component() -> None:
    """One attempt a cell cannot tell a cell term from chance: no such component, no interval."""
    report = decompose(
        simulate(tasks=40, attempts=1, pass_fail=True, task_sd=1.0, scale=5, seed=2),
        "base",
        "small",
    )

    assert report.note is None
    assert list(report.shares) == [
        "harness", "model", "harness:model", "task", "residual"
    ]  # fmt: skip
    assert set(report.intervals) == {"harness", "model", "harness:model", "task"}
    low, high = report.intervals["task"]
    assert 0 < low < report.variances["task"] < high


def test_tasks_passed_or_failed_throughout_leave_a_fit_with_intervals() -> None:
    """Tasks every harness passes (or fails) on every attempt: their intercepts run far out,
    in the fit and in the draws that calibrate the task x cell term alike."""
    rng = np.random.default_rng(0)
    chances = rng.choice([0.0, 1.0, 0.5, 0.02, 0.98], size=30)
    observations = [
        Observation(f"t{t}", h, m, float(rng.random() < chance))
        for t, chance in enumerate(chances)
        for h in HARNESSES
        for m in MODELS
        for _ in range(3)
    ]

    report = decompose(observations, "base", "small")

    assert report.note is None
    low, high = report.intervals["task:harness:model"]
    assert 0 <= low <= report.variances["task:harness:model"] <= high < np.inf


def test_the_harness_variance_is_the_plug_in_one_less_the_noise_of_its_estimates() -> None:
    """With every harness the same, the variance of the estimated harness effects (the plug-in
    estimate) is their noise alone: the reported variance takes it off."""
    plug_ins, reported = [], []
    for seed in range(8):
        report = decompose(
            simulate(tasks=20, attempts=2, pass_fail=True, task_sd=1.0, scale=0.0, seed=seed),
            "base",
            "small",
        )
        estimates = [0.0] + [
            c.estimate for c in report.coefficients if c.term in ("harness[fast]", "harness[slow]")
        ]
        plug_ins.append(float(np.var(estimates)))
        reported.append(report.variances["harness"])
        assert report.intervals["harness"][0] == 0.0  # a harness variance of 0 is not ruled out

    assert all(r < p for r, p in zip(reported, plug_ins, strict=True))
    assert np.mean(reported) < 0.6 * np.mean(plug_ins)  # 0.031 against 0.058


def test_binomial_fit_reports_the_task_by_cell_component_it_was_given() -> None:
    """Repeated attempts of one cell agreeing more than chance: the cell term, in log-odds."""
    report = decompose(
        simulate(tasks=40, attempts=8, pass_fail=True, task_sd=1.0, cell_sd=0.8, scale=5, seed=6),
        "base",
        "small",
    )

    latent_total = (np.pi**2 / 3) / report.shares["residual"]
    assert report.shares["task:harness:model"] * latent_total == pytest.approx(0.8**2, rel=0.5)
    # 40 tasks estimate their variance loosely: their own draw's variance varies by 20-30%
    assert report.shares["task"] * latent_total == pytest.approx(1.0, rel=0.6)


@pytest.mark.parametrize("pass_fail", [True, False])
def test_harnesses_that_do_not_differ_get_a_harness_share_near_zero(pass_fail: bool) -> None:
    """The plug-in variance of estimated effects is their noise when they are all equal; the
    noise is taken off, so no harness difference reads as (almost) no harness share."""
    reports = [
        decompose(
            simulate(
                tasks=20, attempts=2, pass_fail=pass_fail, task_sd=1.0 if pass_fail else 0.2,
                noise_sd=0.15, scale=0.0, seed=seed,
            ),
            "base",
            "small",
        )
        for seed in range(8)
    ]  # fmt: skip

    shares = [report.shares["harness"] for report in reports]
    assert np.mean(shares) < 0.01
    assert min(shares) == 0.0  # clipped at 0 where the noise exceeds the spread
