"""A task's sandbox limits under its run's `[sandbox]` defaults and ceilings.

A task that sets no cpus or memory gets the run's defaults; a task value above the run's
ceiling, below what Docker can apply, non-finite or non-positive is refused at resolve, naming
the task and the key, before anything is recorded. So every sandbox has a memory, cpu and pids
limit, and every timeout is a finite number of seconds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from pytest_hemra.core.errors import SpecError
from pytest_hemra.resolve.datasets import Task
from pytest_hemra.resolve.spec import RunSpec, SandboxSettings

MIN_CPUS = 0.01  # Docker's smallest cpu quota: below it `nano_cpus` would round to unlimited
MIN_MEMORY_MB = 6  # Docker's smallest memory limit


@dataclass(frozen=True)
class TaskLimits:
    """What a task's sandbox runs with, the run's defaults filled in."""

    cpus: float
    memory_mb: int
    pids: int
    disk_mb: int | None  # the run's [sandbox] disk_mb: every sandbox, refused where unsupported
    storage_mb: int | None = None  # the task's: applied where the engine can (`disk_limit`)


def task_limits(settings: SandboxSettings, task: Task) -> TaskLimits:
    environment = task.config.environment
    pids_set = "pids_limit" in environment.model_fields_set
    return TaskLimits(
        cpus=environment.cpus or settings.cpus,
        memory_mb=environment.memory_mb or settings.memory_mb,
        pids=environment.pids_limit if pids_set else settings.pids,
        disk_mb=settings.disk_mb,
        storage_mb=environment.storage_mb,
    )


def with_run_defaults(settings: SandboxSettings, task: Task) -> Task:
    """The task as its trials run it: a verifier timeout it leaves unset (its own, a step's)
    is the run's `verifier_timeout_sec`. (Agent timeouts: `TrialContext.agent_timeout`.)"""
    default = {"timeout_sec": settings.verifier_timeout_sec}
    config = task.config
    verifier = config.verifier
    if "timeout_sec" not in verifier.model_fields_set:
        verifier = verifier.model_copy(update=default)
    steps = [
        step
        if "timeout_sec" in step.verifier.model_fields_set
        else step.model_copy(update={"verifier": step.verifier.model_copy(update=default)})
        for step in config.steps
    ]
    return replace(task, config=config.model_copy(update={"verifier": verifier, "steps": steps}))


def check_limits(spec: RunSpec, tasks: Iterable[Task], source: str) -> None:
    """Refuse the first value the run's `[sandbox]` does not allow: the run's own `timeout_secs`
    (naming `source`), else a task's (a SpecError naming the task's path and its key)."""
    ceiling = spec.sandbox.max_agent_timeout_sec
    if spec.timeout_secs is not None and spec.timeout_secs > ceiling:
        raise SpecError(
            f"{source}: key 'timeout_secs': {spec.timeout_secs:g} is over the run's ceiling "
            f"{ceiling:g} (its [sandbox] max_agent_timeout_sec)"
        )
    for task in tasks:
        for key, value, floor, ceiling, ceiling_key in _values(spec.sandbox, task):
            where = f"{task.path / 'task.toml'}: key '{key}'"
            if isinstance(value, float) and not math.isfinite(value):
                raise SpecError(f"{where}: expected a finite number, got {value!r}")
            if value <= 0:
                raise SpecError(f"{where}: expected a number greater than 0, got {value!r}")
            if value < floor:
                raise SpecError(
                    f"{where}: {value!r} is below {floor:g}, the smallest a sandbox can apply"
                )
            if value > ceiling:
                raise SpecError(
                    f"{where}: {value!r} is over the run's ceiling {ceiling:g} "
                    f"(its [sandbox] {ceiling_key})"
                )


def _values(
    settings: SandboxSettings, task: Task
) -> Iterable[tuple[str, float, float, float, str]]:
    """(task key, value, floor, ceiling, the run's ceiling key) of every value a task sets
    (one it leaves unset takes the run's default, which is under its ceiling)."""
    config = task.config
    environment = config.environment
    if environment.cpus is not None:
        yield "environment.cpus", environment.cpus, MIN_CPUS, settings.max_cpus, "max_cpus"
    if environment.memory_mb is not None:
        yield (
            "environment.memory_mb",
            environment.memory_mb,
            MIN_MEMORY_MB,
            settings.max_memory_mb,
            "max_memory_mb",
        )
    if "pids_limit" in environment.model_fields_set:
        yield "environment.pids_limit", environment.pids_limit, 1, settings.max_pids, "max_pids"
    agent_max, verifier_max = settings.max_agent_timeout_sec, settings.max_verifier_timeout_sec
    if config.agent.timeout_sec is not None:
        yield "agent.timeout_sec", config.agent.timeout_sec, 0, agent_max, "max_agent_timeout_sec"
    if "timeout_sec" in config.verifier.model_fields_set:
        yield (
            "verifier.timeout_sec",
            config.verifier.timeout_sec,
            0,
            verifier_max,
            "max_verifier_timeout_sec",
        )
    if "test_timeout_sec" in config.hemra.model_fields_set:
        yield (
            "hemra.test_timeout_sec",
            config.hemra.test_timeout_sec,
            0,
            verifier_max,
            "max_verifier_timeout_sec",
        )
    for index, step in enumerate(config.steps):
        if step.agent.timeout_sec is not None:
            yield (
                f"steps[{index}].agent.timeout_sec",
                step.agent.timeout_sec,
                0,
                agent_max,
                "max_agent_timeout_sec",
            )
        if "timeout_sec" in step.verifier.model_fields_set:
            yield (
                f"steps[{index}].verifier.timeout_sec",
                step.verifier.timeout_sec,
                0,
                verifier_max,
                "max_verifier_timeout_sec",
            )
