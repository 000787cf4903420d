"""The variance decomposition on 150,000 trials: 89 tasks x 5 harnesses x 3 models x 112 attempts.

Draws one run of pass/fail rewards (a logit model: harness and model effects, a task intercept
with sd 1.5, a task x harness x model term with sd 0.3) and one of fractional rewards (the same
on the reward's scale, plus trial noise), then times `variance.decompose` on each as a report
calls it. Target: under 1 s for pass/fail (a Laplace fit on cell counts, numpy alone), under
10 s for fractional (statsmodels' MixedLM on cell means). Importing statsmodels is timed apart:
only the fractional fit needs it, and a report pays it once.

With `--coverage N` it checks the intervals instead: N small runs of each kind drawn from the
same models (a task x harness x model sd of `--cell-sd`, 0 by default), and the share of the
harness and model coefficients' 95% intervals that hold the true effect.

    python benchmarks/variance.py [--tasks 89] [--harnesses 5] [--models 3] [--attempts 112]
    python benchmarks/variance.py --coverage 200 --tasks 12 --harnesses 2 --models 2 --attempts 4
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy.special import expit

from pytest_hemra.report.variance import Observation, decompose, render_variance


def effects(harnesses: int, models: int) -> tuple[np.ndarray, np.ndarray]:
    """The true harness and model effects on the log-odds; a fifth of them on the reward."""
    return np.linspace(-0.5, 1.0, harnesses), np.linspace(-0.4, 0.6, models)


def simulate(
    pass_fail: bool,
    tasks: int,
    harnesses: int,
    models: int,
    attempts: int,
    cell_sd: float = 0.3,
    rng: np.random.Generator | None = None,
) -> list[Observation]:
    rng = rng or np.random.default_rng(0)
    harness_effect, model_effect = effects(harnesses, models)
    task_effect = rng.normal(0, 1.5, tasks)
    cell_effect = rng.normal(0, cell_sd, (tasks, harnesses, models))
    observations = []
    for t in range(tasks):
        for h in range(harnesses):
            for m in range(models):
                eta = harness_effect[h] + model_effect[m] + task_effect[t] + cell_effect[t, h, m]
                if pass_fail:
                    rewards = (rng.random(attempts) < expit(eta - 0.5)).astype(float)
                else:  # the same structure on the reward's scale, unclipped: a linear model
                    rewards = 0.5 + eta / 5 + rng.normal(0, 0.15, attempts)
                observations += [
                    Observation(f"task-{t:03d}", f"h{h}", f"m{m}", float(r)) for r in rewards
                ]
    return observations


def coverage(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(1)
    harness_effect, model_effect = effects(args.harnesses, args.models)
    truth = {
        f"harness[h{h}]": harness_effect[h] - harness_effect[0] for h in range(1, args.harnesses)
    }
    truth |= {f"model[m{m}]": model_effect[m] - model_effect[0] for m in range(1, args.models)}
    for pass_fail in (True, False):
        scale = 1.0 if pass_fail else 0.2
        held = total = notes = 0
        for _ in range(args.coverage):
            observations = simulate(
                pass_fail, args.tasks, args.harnesses, args.models, args.attempts,
                args.cell_sd, rng,
            )  # fmt: skip
            report = decompose(observations, "h0", "m0")
            notes += report.note is not None
            for c in report.coefficients:
                if c.term in truth:
                    held += c.low <= scale * truth[c.term] <= c.high
                    total += 1
        kind = "pass/fail" if pass_fail else "fractional"
        rate = held / max(total, 1)
        error = (rate * (1 - rate) / max(total, 1)) ** 0.5
        print(
            f"{kind}: {rate:.1%} ± {error:.1%} of {total} intervals hold the true effect"
            f" (nominal 95%); {notes} of {args.coverage} runs not fitted"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=89)
    parser.add_argument("--harnesses", type=int, default=5)
    parser.add_argument("--models", type=int, default=3)
    parser.add_argument("--attempts", type=int, default=112)
    parser.add_argument("--coverage", type=int, default=0, help="runs to check intervals on")
    parser.add_argument("--cell-sd", type=float, default=0.0, help="with --coverage")
    args = parser.parse_args()
    if args.coverage:
        coverage(args)
        return

    started = time.perf_counter()
    import statsmodels.genmod.bayes_mixed_glm
    import statsmodels.regression.mixed_linear_model  # noqa: F401

    print(f"importing statsmodels: {time.perf_counter() - started:.2f} s")
    for pass_fail in (True, False):
        observations = simulate(pass_fail, args.tasks, args.harnesses, args.models, args.attempts)
        started = time.perf_counter()
        report = decompose(observations, "h0", "m0")
        elapsed = time.perf_counter() - started
        kind = "pass/fail" if pass_fail else "fractional"
        target = 1 if pass_fail else 10
        print(f"\n{kind}: {len(observations):,} trials fitted in {elapsed:.2f} s", end="")
        print(f" (target {target} s)")
        print("\n".join(render_variance(report)))


if __name__ == "__main__":
    main()
