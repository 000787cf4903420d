"""Provisioning: what a resolved plan needs of this machine, checked before anything is recorded.

Resolve (resolve/plan.py) reads files; this step meets the machine: the sandbox provider the run
names (or its pool of engines) with the capabilities it requires, every harness installed (or,
for an `sdk` harness, its entry loaded) and every task image built (`builds.py`), so a broken
harness, a missing capability or a Dockerfile that fails refuses the run before the store hears
of it. `hemra run --dry-run` describes it all, building nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from pytest_hemra.core.errors import CapabilityError, InfraError, SpecError
from pytest_hemra.core.words import plural
from pytest_hemra.execute.builds import build_images, tasks_to_build
from pytest_hemra.execute.gateway.prices import price_table
from pytest_hemra.execute.installs import ensure_installed
from pytest_hemra.execute.kinds import kind_of
from pytest_hemra.execute.sandbox import SandboxProvider
from pytest_hemra.execute.sandbox.providers import ProviderFactory as ProviderFactory
from pytest_hemra.execute.sandbox.providers import sandbox_provider
from pytest_hemra.resolve.harnesses import Harness
from pytest_hemra.resolve.plan import Plan
from pytest_hemra.resolve.spec import RunSpec
from pytest_hemra.resolve.upstreams import SCRIPTED_MODEL


def provision(
    plan: Plan,
    providers: Mapping[str, ProviderFactory],
    check_sandbox: bool = True,
    note: Callable[[str], None] = lambda line: None,
) -> SandboxProvider:
    """The run's sandbox provider, checked against `require`; with `check_sandbox`, the
    sandbox answers, every harness is installed and every task image built (what is built is
    `note`d). Any problem is a one-line error."""
    spec = plan.spec
    provider = _provider(spec, plan.source, providers)
    for harness in plan.harnesses:
        kind_of(harness).check_run(harness, spec, plan.source, provider)
    if check_sandbox:
        provider.check()
        for harness in plan.harnesses:
            _install(harness)
        build_images(plan, provider, note)
    return provider


def _install(harness: Harness) -> None:
    """Install (or load) at resolve, so a broken harness refuses the run before anything is
    recorded."""
    try:
        ensure_installed(harness)  # its kind's install: an sdk harness's entry is loaded too
    except InfraError as error:
        raise SpecError(str(error)) from None


def _provider(
    spec: RunSpec, source: str, providers: Mapping[str, ProviderFactory]
) -> SandboxProvider:
    provider = sandbox_provider(spec.sandbox, providers, source=source)
    missing = [need for need in spec.require if need not in provider.capabilities]
    if missing:
        raise CapabilityError(
            f"{source}: key 'require': sandbox {provider.name!r} cannot provide "
            f"{missing[0]!r} (it provides: {', '.join(sorted(provider.capabilities))})"
        )
    return provider


def describe(plan: Plan, provider: SandboxProvider | None) -> str:
    """`hemra run --dry-run`: the resolved plan, what it would build, and nothing recorded."""
    spec = plan.spec
    lines = [f"run {spec.name!r} from {plan.source} (nothing recorded)", "", "harnesses:"]
    for harness in plan.harnesses:
        version = f" {harness.spec.version}" if harness.spec.version else ""
        baseline = " (baseline)" if harness.name == spec.baseline_harness else ""
        lines.append(
            f"  {harness.name}{baseline}: {harness.spec.kind}{version},"
            f" digest {harness.digest[:12]} ({harness.path})"
        )
    lines += ["", "datasets:"]
    for dataset in plan.datasets:
        counted = plural(len(dataset.tasks), "task")
        lines.append(f"  {dataset.name}@{dataset.digest[:12]}: {counted} ({dataset.path})")
    tasks = sum(len(dataset.tasks) for dataset in plan.datasets)
    cells = sorted({trial.cell for trial in plan.trials})
    if spec.is_matrix:
        shown = [f"{m} (baseline)" if m == spec.baseline_model else m for m in spec.models]
        lines += ["", "models: " + ", ".join(shown)]
    lines += [
        "",
        f"cells: {len(cells)} ({'harness x model' if spec.is_matrix else 'harnesses'})",
        f"trials: {plural(tasks, 'task')} x {plural(len(cells), 'cell')} x"
        f" {plural(spec.attempts, 'attempt')}"
        f" = {len(plan.trials)}",
        cost_bound(plan),
    ]
    if plan.judges:
        lines.append("judges: " + ", ".join(j.name for j in plan.judges))
    missing = getattr(provider, "missing_images", None)
    named = getattr(provider, "task_image", None)
    if missing is not None and named is not None:
        to_build: set[str] = set()
        cached: dict[str, str] = {}
        for task in tasks_to_build(plan):
            needs = missing(task, spec.sandbox.image)
            to_build.update(needs)
            if not needs:
                cached.setdefault(named(task, spec.sandbox.image), str(task.path))
        at_once = f" ({spec.sandbox.image_builds} at once)" if to_build else ""
        lines.append(f"images to build: {len(to_build)}{at_once}")
        lines += [f"  {image}" for image in sorted(to_build)]
        lines.append(f"images cached: {len(cached)}")
        lines += [f"  {image} (for {where})" for image, where in sorted(cached.items())]
    return "\n".join(lines)


def cost_bound(plan: Plan) -> str:
    """The most the run can spend, from its caps: each trial's `trial_max_cost_usd`, or its
    `trial_max_tokens` at the cell model's dearest price per token (where the price is known),
    each cell's `cell_budget_usd`, and the run's `budget_usd`."""
    spec = plan.spec
    table = price_table()
    cells: dict[str, tuple[int, str | None, bool]] = {}
    for trial in plan.trials:
        count = cells.get(trial.cell, (0, None, False))[0]
        harness = next(h for h in plan.harnesses if h.name == trial.harness)
        model = trial.model or harness.spec.model or spec.model
        cells[trial.cell] = (count + 1, model, harness.spec.provider is None)
    total = 0.0
    for count, model, calls_none in cells.values():
        bounds = [0.0] if calls_none else []  # a harness that calls no model (oracle, nop)
        if spec.gateway.trial_max_cost_usd is not None:
            bounds.append(count * spec.gateway.trial_max_cost_usd)
        price = table.price_of(model)
        if spec.gateway.trial_max_tokens is not None and price is not None:
            dearest = max(price.input, price.output, price.cache_read, price.cache_write)
            bounds.append(count * spec.gateway.trial_max_tokens * dearest / 1_000_000)
        if spec.cell_budget_usd is not None:
            bounds.append(spec.cell_budget_usd)
        if (model or "").startswith(SCRIPTED_MODEL):
            bounds.append(0.0)  # the scripted model costs nothing
        if not bounds:
            total = math.inf
            break
        total += min(bounds)
    if spec.budget_usd is not None:
        total = min(total, spec.budget_usd)
    if math.isinf(total):
        return (
            "cost: no upper bound (set budget_usd, cell_budget_usd, or [gateway]"
            " trial_max_cost_usd or trial_max_tokens with a priced model)"
        )
    return f"cost: at most ${total:.2f} (from the caps)"
