"""A task's `[verifier.environment]`: the separate verifier room's own environment, as Harbor
0.26 defines it. Its schema is `[environment]`'s; its image is built from the task's `tests/`
folder (`tests/Dockerfile`, Harbor's build context for a verifier environment) unless it names
a `docker_image`. Setting it implies `environment_mode = "separate"`. HEMRA's separate room
then starts from that image, with that environment's limits and variables, and receives the
agent's work folder and declared artifacts as any separate room does (`score/room.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pytest_hemra.core.errors import SpecError
from pytest_hemra.resolve.datasets import Task


@dataclass(frozen=True)
class VerifierTask(Task):
    """A task seen as its verifier's environment: `environment_dir` is its build context."""

    context_dir: Path = Path()

    @property
    def environment_dir(self) -> Path:
        return self.context_dir


def verifier_task(task: Task) -> VerifierTask | None:
    """`task` as its verifier environment builds and limits it, or None when it has none."""
    environment = task.config.verifier.environment
    if environment is None:
        return None
    config = task.config.model_copy(update={"environment": environment})
    return VerifierTask(
        name=f"{task.name} (verifier)",
        path=task.path,
        config=config,
        instruction="",
        context_dir=task.path / "tests",
    )


def check_verifier_environment(task: Task) -> None:
    """A verifier environment HEMRA can build: `tests/Dockerfile` or a `docker_image`; a step's
    own is refused (only the task's is built)."""
    toml = task.path / "task.toml"
    for step in task.config.steps:
        if step.verifier.environment is not None:
            raise SpecError(
                f"{toml}: key 'steps.verifier.environment' (step {step.name!r}): a step's own"
                " verifier environment is not built yet; give it the task's [verifier.environment]"
            )
    room = verifier_task(task)
    if room is None:
        return
    if not room.has_dockerfile and room.config.environment.docker_image is None:
        raise SpecError(
            f"{toml}: key 'verifier.environment': expected tests/Dockerfile (its build context is"
            " the tests folder, as in Harbor) or a docker_image"
        )
    if task.compose is not None:
        raise SpecError(
            f"{toml}: key 'verifier.environment': a task with compose services verifies in a room"
            " of its own image only; expected no [verifier.environment] beside docker-compose.yaml"
        )
