"""Whether a task's verifier finds the agent's processes still running.

By default the room is emptied after the agent's turn (the kernel kills every process the agent
left: docs/security.md). A task whose tests check a worker or server the agent was asked to
leave running asks to keep them with `[hemra] keep_agent_processes = true` in its task.toml; a
run file's `[verifier] keep_agent_processes` says otherwise for a whole run: `true` (every
task), `false` (none, whatever a task asks), or a list of dataset names and `dataset::task`
names (those, besides the tasks that ask). Only a shared room can keep them: a separate room
starts without the agent's processes, so such a task is refused there at resolve.
"""

from __future__ import annotations

from pytest_hemra.core.errors import SpecError
from pytest_hemra.resolve.datasets import Task
from pytest_hemra.resolve.spec import RunSpec


def keeps_agent_processes(spec: RunSpec, dataset: str, task: Task) -> bool:
    """Whether the agent's processes outlive its turn into the verifier's (see the module)."""
    setting = spec.verifier.keep_agent_processes
    if isinstance(setting, bool):
        return setting
    if setting is not None and (dataset in setting or f"{dataset}::{task.name}" in setting):
        return True
    return task.config.hemra.keep_agent_processes


def check_kept(spec: RunSpec, dataset: str, task: Task, source: str) -> None:
    """A task whose processes are kept must be verified in the shared room it ran in."""
    if not keeps_agent_processes(spec, dataset, task):
        return
    modes = {spec.verifier.environment_mode, task.config.verifier.environment_mode}
    modes |= {step.verifier.environment_mode for step in task.config.steps}
    if "separate" in modes:
        where = (
            f"{task.path / 'task.toml'}: key 'hemra.keep_agent_processes'"
            if task.config.hemra.keep_agent_processes
            else f"{source}: key 'verifier.keep_agent_processes'"
        )
        raise SpecError(
            f"{where}: task {dataset}::{task.name} keeps the agent's processes for its"
            " verifier, but is verified in a separate room, which starts without them: expected"
            " environment_mode = 'shared' for it"
        )


def unknown_entries(spec: RunSpec, names: set[str], source: str) -> None:
    """Every dataset or `dataset::task` the run's list names is one the run has."""
    setting = spec.verifier.keep_agent_processes
    if not isinstance(setting, list):
        return
    for entry in setting:
        if entry not in names:
            raise SpecError(
                f"{source}: key 'verifier.keep_agent_processes': {entry!r} is not a dataset or"
                " 'dataset::task' this run selects"
            )
