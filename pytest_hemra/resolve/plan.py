"""Resolve: run file + flags -> a Plan of every trial, or a one-line error and nothing recorded.

The recorded form of a plan (`Plan.record`) is what workers collect from: the controller
resolves once, the store holds the result, every process reads the same trials in order.
"""

from __future__ import annotations

import fnmatch
import os
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_hemra.core import registry
from pytest_hemra.core.errors import SpecError, StoreError
from pytest_hemra.core.lifecycle import RunStatus
from pytest_hemra.core.records import PlannedTrial, TrialRecord
from pytest_hemra.core.store_location import TRIALS_DIR_VARIABLE
from pytest_hemra.core.words import plural
from pytest_hemra.resolve.datasets import Dataset, Task, load_task, resolve_dataset
from pytest_hemra.resolve.harness_spec import HarnessSpec
from pytest_hemra.resolve.harnesses import Harness, is_isolated, resolve_harness
from pytest_hemra.resolve.judges import Judge, resolve_judges
from pytest_hemra.resolve.limits import check_limits
from pytest_hemra.resolve.overrides import Overrides
from pytest_hemra.resolve.prices import load_price_dataset, price_source, use_run_prices
from pytest_hemra.resolve.processes import check_kept, unknown_entries
from pytest_hemra.resolve.spec import RunSpec, load_run_spec
from pytest_hemra.resolve.templates import check_pass_env, check_task_templates, provider_keys
from pytest_hemra.resolve.upstreams import (
    SCRIPTED,
    SCRIPTED_MODEL,
    ModelApi,
    configured_upstreams,
    key_variables,
)
from pytest_hemra.resolve.verifier_environment import check_verifier_environment, verifier_task
from pytest_hemra.store import Store

PLAN_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Plan:
    spec: RunSpec
    source: str
    base_dir: Path
    harnesses: tuple[Harness, ...]
    datasets: tuple[Dataset, ...]
    trials: tuple[PlannedTrial, ...]
    judges: tuple[Judge, ...] = ()
    # "dataset/task" -> seconds its image took to build at resolve (none: it was cached)
    build_secs: dict[str, float] = field(default_factory=dict)

    @property
    def warnings(self) -> list[str]:
        """What the run goes ahead with but says: task keys HEMRA does not know, and harnesses
        that cannot be handed the MCP servers or skills a task has, by name."""
        found = [w for dataset in self.datasets for task in dataset.tasks for w in task.warnings]
        found += self._left_without(
            "MCP servers",
            lambda task: bool(task.config.environment.mcp_servers),
            takes_mcp_servers,
            "its file uses no {mcp_servers_json} or {mcp_servers_toml}",
        )
        found += self._left_without(
            "skills",
            lambda task: task.config.environment.skills_dir is not None,
            loads_skills,
            "no skills_dir in its file",
        )
        return found + self._unproxied() + self._unguarded()

    def _unguarded(self) -> list[str]:
        """A pool's engines get neither HEMRA's own networks nor its host firewall: a task with
        internet runs on Docker's default bridge there, guarded as that engine's host has it."""
        tasks = [
            t.name for d in self.datasets for t in d.tasks if t.config.agent_network == "public"
        ]
        if not self.spec.sandbox.engines or not tasks:
            return []
        return [
            f"{self.source}: [sandbox] engines: a pool's engines get neither HEMRA's isolated"
            f" networks nor its host firewall: {plural(len(tasks), 'task')} with internet run on"
            " Docker's default bridge there, where sandboxes may reach each other and the host"
            " unless the engine's machine turns that off (dockerd --icc=false, a firewall on the"
            " bridge); `hemra worker` beside each engine gives every sandbox HEMRA's isolation"
            " (docs/scaling.md)"
        ]

    def _unproxied(self) -> list[str]:
        """A pool's engines keep Docker's default bridge, where no egress proxy is reached: a
        phase with a host allowlist runs there with its network cut (none of its hosts)."""
        tasks = [t.name for d in self.datasets for t in d.tasks if t.config.uses_proxy]
        if not self.spec.sandbox.engines or not tasks:
            return []
        shown = ", ".join(tasks[:3]) + (", ..." if len(tasks) > 3 else "")
        return [
            f"{self.source}: [sandbox] engines: a pool's engines reach no egress proxy, so the"
            f" allowed_hosts of {plural(len(tasks), 'task')} are reached by none of their phases"
            f" (the network is cut): {shown}"
        ]

    def _left_without(
        self,
        what: str,
        has: Callable[[Task], bool],
        serves: Callable[[HarnessSpec], bool],
        why: str,
    ) -> list[str]:
        tasks = [task.name for dataset in self.datasets for task in dataset.tasks if has(task)]
        shown = ", ".join(tasks[:3]) + (", ..." if len(tasks) > 3 else "")
        return [
            f"{harness.path}: harness {harness.name!r} is not handed {what} ({why}); it runs"
            f" without those of {plural(len(tasks), 'task')}: {shown}"
            for harness in self.harnesses
            if tasks and not serves(harness.spec)
        ]

    def record(self) -> dict[str, Any]:
        """The resolved spec with digests, as stored with the run."""
        return {
            "schema_version": PLAN_SCHEMA_VERSION,
            "source": self.source,
            "spec": self.spec.model_dump(mode="json"),
            "prices": price_source(self.spec.prices),  # where its costs come from, and version
            "harnesses": {
                h.name: {
                    "path": str(h.path),
                    "digest": h.digest,
                    "spec": h.spec.model_dump(mode="json"),
                    # read by reports, which never load harness kinds (core/stored.py)
                    "metered": bool(registry.harness_kinds()[h.spec.kind].is_metered),
                    "isolated": is_isolated(h.spec),
                }
                for h in self.harnesses
            },
            "datasets": {
                d.name: {
                    "path": str(d.path),
                    "digest": d.digest,
                    "tasks": [t.name for t in d.tasks],
                    # each task's headline key, for reports (core/reward.py)
                    "reward_keys": {
                        t.name: t.config.hemra.reward_key
                        for t in d.tasks
                        if t.config.hemra.reward_key is not None
                    },
                    "build_secs": {
                        t.name: self.build_secs[f"{d.name}/{t.name}"]
                        for t in d.tasks
                        if f"{d.name}/{t.name}" in self.build_secs
                    },
                }
                for d in self.datasets
            },
            "judges": [judge.record() for judge in self.judges],
        }


def resolve_plan(run_file: Path | None, overrides: Overrides, cwd: Path) -> Plan:
    """Phase 1 from the files alone: the spec, harness files, judges, datasets and every trial.
    What needs the machine (the sandbox, installs) is `execute.provisioning.provision`."""
    spec = load_run_spec(run_file, overrides)
    use_run_prices(spec.prices)
    if len(spec.models) == 1:  # `models = ["x"]` is the one-model form
        spec = spec.model_copy(update={"model": spec.models[0], "models": []})
    source = str(run_file) if run_file is not None else "command line"
    base_dir = run_file.resolve().parent if run_file is not None else cwd
    _check_baseline(spec, source)
    judges = resolve_judges(spec.judge, base_dir, source, spec.model)
    harnesses = tuple(
        resolve_harness(name, base_dir, source, spec.model) for name in spec.harnesses
    )
    _check_pins(spec, harnesses, source)
    _check_trust(spec, harnesses, source)
    known_providers = configured_upstreams(spec.providers)
    _check_providers(known_providers, source)
    for harness in harnesses:
        _check_provider(harness, known_providers)
        missing = missing_variables(harness, spec)
        if missing:
            raise SpecError(
                f"{harness.path}: key 'provider': calls to {harness.spec.provider!r} need "
                f"environment variable {missing[0]} (the provider's key), which is not set"
            )
    _check_no_keys_in_sandboxes(harnesses, known_providers)
    keys = provider_keys(harnesses, known_providers)
    check_pass_env(spec.sandbox.pass_env, keys, source)
    check_pass_env(spec.verifier.env, keys, source, "verifier.env")
    for name in spec.verifier.env:
        if name not in os.environ:
            raise SpecError(f"{source}: key 'verifier.env': environment variable {name} is not set")
    datasets = _datasets(spec, base_dir, source)
    tasks = [task for dataset in datasets for task in dataset.tasks]
    rooms = [room for task in tasks if (room := verifier_task(task)) is not None]
    check_limits(spec, [*tasks, *rooms], source)
    for dataset in datasets:
        for task in dataset.tasks:
            check_task_templates(task, spec.sandbox.pass_env, keys, source)
            check_kept(spec, dataset.name, task, source)
            check_verifier_environment(task)
    selected = {d.name for d in datasets} | {
        f"{d.name}::{t.name}" for d in datasets for t in d.tasks
    }
    unknown_entries(spec, selected, source)
    for harness in harnesses:
        if harness.spec.uses_solution:
            for dataset in datasets:
                for task in dataset.tasks:
                    if not task.has_solution:
                        raise SpecError(
                            f"{task.path}: harness {harness.name!r} needs "
                            "solution/solve.sh, which this task lacks"
                        )
    trials = tuple(
        PlannedTrial(dataset.name, task.name, harness.name, attempt, model)
        for dataset in datasets
        for task in dataset.tasks
        for harness in harnesses
        for model in cell_models(spec, harness.spec)
        for attempt in range(1, spec.attempts + 1)
    )
    return Plan(spec, source, base_dir, harnesses, datasets, trials, judges)


def cell_models(spec: RunSpec, harness: HarnessSpec) -> list[str | None]:
    """The models a harness runs under: in a matrix run each of `models` (only its own when it
    pins one); else None, the run's one model."""
    if not spec.is_matrix:
        return [None]
    return [harness.model] if harness.model is not None else list(spec.models)


def _check_baseline(spec: RunSpec, source: str) -> None:
    """`baseline` names a harness, a `harness@model` pair of the run's, or in a matrix run a
    model."""
    baseline = spec.baseline
    if baseline is None or baseline in spec.harnesses:
        return
    harness, at, model = baseline.partition("@")
    models = spec.models if spec.is_matrix else [spec.model]
    if (at and harness in spec.harnesses and model in models) or (
        spec.is_matrix and baseline in spec.models
    ):
        return
    expected = f"one of the run's harnesses ({', '.join(spec.harnesses)})"
    if spec.is_matrix:
        expected += f", models ({', '.join(spec.models)}) or a harness@model pair"
    raise SpecError(f"{source}: key 'baseline': {baseline!r} is not {expected}")


def _check_pins(spec: RunSpec, harnesses: tuple[Harness, ...], source: str) -> None:
    """In a matrix run a harness that pins a model joins that model's cells: it must be one of
    the run's models."""
    if not spec.is_matrix:
        return
    for harness in harnesses:
        pinned = harness.spec.model
        if pinned is not None and pinned not in spec.models:
            raise SpecError(
                f"{harness.path}: key 'model': harness pins model {pinned!r}, which is not one"
                f" of the run's models ({', '.join(spec.models)}; {source})"
            )


def loads_skills(spec: HarnessSpec) -> bool:
    """Whether a harness loads a task's skills (its `skills_dir`), or needs none (no model, or
    the solution)."""
    return spec.skills_dir is not None or spec.provider is None or spec.uses_solution


def takes_mcp_servers(spec: HarnessSpec) -> bool:
    """Whether a harness hands a task's MCP servers to its agent (or needs none): an ACP agent
    gets them in its session, another through `{mcp_servers_json}` / `{mcp_servers_toml}` in its
    file."""
    if spec.kind == "acp" or spec.provider is None or spec.uses_solution:
        return True  # (no model, or the solution: an MCP server is nothing to it)
    texts = [*spec.command, *spec.environment.values(), *spec.files.keys(), *spec.files.values()]
    return any("{mcp_servers_" in text for text in texts)


def _check_provider(harness: Harness, known: Mapping[str, ModelApi]) -> None:
    spec = harness.spec
    if spec.provider is not None and spec.provider not in known:
        raise SpecError(
            f"{harness.path}: key 'provider': no provider named {spec.provider!r} "
            f"(known: {', '.join(sorted(known))})"
        )
    if spec.key_env is not None:
        if spec.provider is None:
            raise SpecError(f"{harness.path}: key 'key_env' needs a 'provider' to send it to")
        if spec.key_env not in os.environ:
            raise SpecError(
                f"{harness.path}: key 'key_env': environment variable {spec.key_env} is not set"
            )


def harness_variables(harness: Harness, spec: RunSpec) -> list[str]:
    """The runner's environment variables a harness's trials need: its `env`, its `key_env`,
    else the key variable of the provider it names (none when it calls the scripted model).
    Checked at resolve, and by every process before it claims one of the harness's trials."""
    names = list(harness.spec.env)
    provider = harness.spec.provider
    models = [m or harness.spec.model or spec.model for m in cell_models(spec, harness.spec)]
    if harness.spec.key_env is not None:
        names.append(harness.spec.key_env)
    elif provider is not None and any(not (m or "").startswith(SCRIPTED_MODEL) for m in models):
        upstream = configured_upstreams(spec.providers).get(provider)
        if upstream is not None and upstream.key_env is not None:
            names.append(upstream.key_env)
    return list(dict.fromkeys(names))


def missing_variables(harness: Harness, spec: RunSpec) -> list[str]:
    """`harness_variables` this process's environment lacks."""
    return [name for name in harness_variables(harness, spec) if name not in os.environ]


def _check_trust(spec: RunSpec, harnesses: tuple[Harness, ...], source: str) -> None:
    """A harness that runs outside HEMRA's sandbox (a harbor harness) runs only in a run that
    names it in `trust_unisolated`: the run's author vouches for it, not the harness file."""
    for name in spec.trust_unisolated:
        if name not in spec.harnesses:
            raise SpecError(
                f"{source}: key 'trust_unisolated': {name!r} is not one of the run's harnesses "
                f"({', '.join(spec.harnesses)})"
            )
    for harness in harnesses:
        if not is_isolated(harness.spec) and harness.name not in spec.trust_unisolated:
            raise SpecError(
                f"{harness.path}: a {harness.spec.kind} harness runs outside HEMRA's sandbox"
                " (no isolation, hardening or gateway); to run it, the run file must trust it:"
                f' trust_unisolated = ["{harness.name}"] ({source})'
            )


def _check_no_keys_in_sandboxes(
    harnesses: tuple[Harness, ...], known: Mapping[str, ModelApi]
) -> None:
    """A harness reaches models through the gateway, with its trial token: its `env` never
    carries a key the gateway holds into the sandbox (`[verifier] env` may: verifiers are not the
    agent). The harbor kind, trusted-only and unmetered, runs its own agents outside the gateway."""
    keys = key_variables(known) | {h.spec.key_env for h in harnesses if h.spec.key_env}
    for harness in harnesses:
        if not registry.harness_kinds()[harness.spec.kind].is_metered:
            continue
        for name in harness.spec.env:
            if name in keys:
                raise SpecError(
                    f"{harness.path}: key 'env': {name} holds a model provider's key, which never "
                    "enters a sandbox (the harness gets its trial token as its key from the "
                    "gateway: '{api_key}')"
                )


def _check_providers(known: Mapping[str, ModelApi], source: str) -> None:
    for name, provider in known.items():
        if provider.base_url is None and name != SCRIPTED:
            raise SpecError(f"{source}: key 'providers.{name}.base_url' is required")


def _datasets(spec: RunSpec, base_dir: Path, source: str) -> tuple[Dataset, ...]:
    datasets = tuple(
        resolve_dataset(ref, base_dir, source, spec.tasks, spec.exclude) for ref in spec.datasets
    )
    names = [d.name for d in datasets]
    if len(set(names)) != len(names):
        raise SpecError(f"{source}: key 'datasets': two entries name the same dataset")
    every_task = [t.name for d in datasets for t in d.tasks]
    for pattern in spec.tasks:
        if not any(fnmatch.fnmatchcase(name, pattern) for name in every_task):
            raise SpecError(f"{source}: key 'tasks': pattern {pattern!r} matches no task")
    if not every_task:
        raise SpecError(f"{source}: the run selects no tasks")
    return datasets


@dataclass(frozen=True)
class RecordedRun:
    """A run read back from the store: what every process collects and runs from."""

    id: str
    spec: RunSpec
    harnesses: dict[str, Harness]
    dataset_paths: dict[str, Path]
    trials: list[TrialRecord]
    trials_dir: Path
    judges: tuple[Judge, ...] = ()

    def task(self, trial: TrialRecord) -> Task:
        return load_task(self.dataset_paths[trial.dataset] / trial.task)


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def record_plan(plan: Plan, store: Store, status: RunStatus = RunStatus.RECORDED) -> str:
    """Phase 2: the run, its spec and every trial and job in one transaction; the run's id."""
    run_id = new_run_id()
    trials_dir = trials_folder(plan, store) / run_id
    store.record_plan(run_id, plan.spec.name, plan.record(), trials_dir, plan.trials, status)
    return run_id


def trials_folder(plan: Plan, store: Store) -> Path:
    """Where a run's trial folders go (`<folder>/RUN_ID/...`): the run file's `trials_dir`
    (relative to the run file's folder), else `$HEMRA_TRIALS_DIR`, else `runs/` beside a
    SQLite store. A PostgreSQL store has no folder: it is refused without one of the first
    two, since trial folders must be where every machine sharing the store reads them."""
    if plan.spec.trials_dir is not None:
        return (plan.base_dir / plan.spec.trials_dir).resolve()
    named = os.environ.get(TRIALS_DIR_VARIABLE, "").strip()
    if named:
        return Path(named).resolve()
    if store.path is None:
        raise SpecError(
            f"{plan.source}: key 'trials_dir' is required with a PostgreSQL store"
            f" ({store.name}): expected a folder every machine sharing the store reads at the"
            f" same path (or set {TRIALS_DIR_VARIABLE})"
        )
    return store.path.parent / "runs"


def load_recorded(store: Store, run_id: str) -> RecordedRun:
    run = store.run(run_id)
    stored = run.plan
    if stored.schema_version != PLAN_SCHEMA_VERSION:
        raise StoreError(f"{store.name}: run {run_id} was recorded by another HEMRA version")
    missing = [h.name for h in stored.harnesses.values() if h.path is None]
    missing += [d.name for d in stored.datasets.values() if d.path is None]
    if missing:
        raise StoreError(f"{store.name}: run {run_id} has no recorded path for {missing}")
    harnesses = {
        name: Harness(name, Path(h.path or ""), HarnessSpec.model_validate(h.settings))
        for name, h in stored.harnesses.items()
    }
    spec = RunSpec.model_validate(stored.settings)
    use_run_prices(spec.prices)
    load_price_dataset()  # here, not in the run's first call
    return RecordedRun(
        id=run.id,
        spec=spec,
        harnesses=harnesses,
        dataset_paths={name: Path(d.path or "") for name, d in stored.datasets.items()},
        trials=store.trials(run_id),
        trials_dir=run.trials_dir,
        judges=tuple(Judge(j.name, j.rubric, j.model, j.command) for j in stored.judges),
    )
