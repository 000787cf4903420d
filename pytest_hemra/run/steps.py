"""A multi-step task (Harbor's `[[steps]]`): each step's files, setup, instruction, agent turn
and verifier in one sandbox, later steps skipped below a `min_reward`, the reward rolled up.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from pytest_hemra.core.errors import VerifierError
from pytest_hemra.core.reward import trial_reward
from pytest_hemra.core.trial import StepResult
from pytest_hemra.execute.artifacts import collect as collect_artifacts
from pytest_hemra.execute.context import Progress, TrialContext
from pytest_hemra.execute.diff import tree_diff
from pytest_hemra.execute.identity import agent_identity
from pytest_hemra.execute.installs import Installed
from pytest_hemra.execute.sandbox import (
    ROOT_USER,
    Sandbox,
    SandboxRequest,
)
from pytest_hemra.run.turn import (
    healthy,
    keep_tree_notes,
    model_access,
    put_instruction,
    run_agent,
)
from pytest_hemra.score.room import verifier_room
from pytest_hemra.score.tamper import raise_tampered, tampering
from pytest_hemra.score.verification import verify_step


def run_steps(
    context: TrialContext,
    sandbox: Sandbox,
    progress: Progress,
    installed: Installed | None,
    request: SandboxRequest,
) -> tuple[float, dict[str, float]]:
    """A multi-step task: each step's files (`workdir/` into the work folder, the agent's; its
    `setup.sh` run as root), its healthcheck, its instruction and agent turn in the same
    sandbox, then its verifier (the task's tests/ with the step's over them, the step's
    `[steps.verifier]` settings) and its artifacts. A step whose rewards miss its `min_reward`
    ends the task: the later steps are skipped, recorded as such (no reward), and left out of
    the roll-up, as Harbor leaves them out. The rewards roll up by the task's
    `multi_step_reward_strategy` (`rolled_up`)."""
    task, folder, workdir = context.task, context.trial_dir, context.workdir
    before_all = sandbox.read_start_tree(workdir)
    gate: str | None = None
    for index, step in enumerate(task.config.steps):
        step_dir = folder / "steps" / f"{index + 1:02d}-{step.name}"
        if gate is not None:
            progress.steps.append(StepResult(step.name, None, {}, None, False, 0.0, gate, True))
            continue
        started = time.monotonic()
        step_path = task.path / "steps" / step.name
        (step_dir / "agent").mkdir(parents=True, exist_ok=True)
        (step_dir / "verifier").mkdir(exist_ok=True)
        instruction = (step_path / "instruction.md").read_text(encoding="utf-8")
        step_task = replace(task, path=step_path, instruction=instruction)
        step_context = replace(
            context, task=step_task, trial_dir=step_dir, step_timeout=step.agent.timeout_sec
        )
        with progress.phase(f"step {step.name}"):
            _prepare_step(context, sandbox, step_path, step_dir)
            healthy(step_context, sandbox, step.healthcheck, f"steps {step.name} healthcheck")
            put_instruction(context, sandbox, step_path, instruction)
            before = sandbox.read_tree(workdir)
            turn = Progress()
            with model_access(step_context, turn) as access:
                run_agent(step_context, sandbox, turn, access, installed)
            progress.usage = progress.usage.combined(turn.usage)
            progress.agent_user = turn.agent_user
            after = sandbox.read_tree(workdir)
            (step_dir / "diff.patch").write_text(tree_diff(before, after))
            keep_tree_notes(after, workdir, step_dir)
            raise_tampered(tampering(context, sandbox))  # the next verifier runs in it
            reward: float | None = None
            rewards: dict[str, float] = {}
            error: str | None = None
            try:
                with verifier_room(context, sandbox, request) as room:
                    reward, rewards = verify_step(
                        context, room, task.path, step_path, step_dir, step.verifier
                    )
            except VerifierError as failure:
                error = str(failure)
            collect_artifacts(
                sandbox, [*task.config.artifacts, *step.artifacts], step_dir / "artifacts"
            )
        progress.steps.append(
            StepResult(
                step.name,
                reward,
                rewards,
                turn.exit_code,
                turn.timed_out,
                round(time.monotonic() - started, 4),
                error,
            )
        )
        if error is None and step.falls_short(rewards, reward):
            gate = f"skipped: step {step.name} scored below its min_reward {step.min_reward}"
        progress.timed_out = progress.timed_out or turn.timed_out
        if progress.exit_code in (None, 0):
            progress.exit_code = turn.exit_code
    (folder / "diff.patch").write_text(tree_diff(before_all, sandbox.read_tree(workdir)))
    failed = [s for s in progress.steps if s.reward is None and not s.skipped]
    if failed:
        raise VerifierError(f"step {failed[0].name}: {failed[0].error}")
    return rolled_up(progress.steps, task.config.multi_step_reward_strategy, context.reward_keys)


def rolled_up(
    steps: Sequence[StepResult], strategy: str, named: Sequence[str] = ()
) -> tuple[float, dict[str, float]]:
    """The trial's (reward, rewards) from its steps, as Harbor rolls them up: a skipped step
    has no result and is left out. "mean": each key's mean over the steps that ran (a key a
    step lacks counts 0 for it); "final": the last step that ran, every key as it gave them.
    The reward is the headline of those rewards (`core.reward.trial_reward`)."""
    ran = [s for s in steps if not s.skipped]
    if strategy == "final":
        rewards = dict(ran[-1].rewards)
    else:
        keys = dict.fromkeys(key for s in ran for key in s.rewards)
        rewards = {key: math.fsum(s.rewards.get(key, 0.0) for s in ran) / len(ran) for key in keys}
    return trial_reward(rewards, named), rewards


def _prepare_step(context: TrialContext, sandbox: Sandbox, step_path: Path, step_dir: Path) -> None:
    """A step's `workdir/` copied into the work folder (the agent's to change), then its
    `setup.sh` run as root in the work folder; a setup that fails is the task's fault (a
    verifier_error), not the agent's."""
    files = step_path / "workdir"
    if files.is_dir():
        log = step_dir / "agent" / "user.txt"
        identity = agent_identity(context.task, context.spec.sandbox.agent_user, sandbox, log)
        sandbox.put({}, {context.workdir: files}, owner=identity.user)
    setup = step_path / "setup.sh"
    if setup.is_file():
        log = step_dir / "setup.txt"
        result = sandbox.exec(
            ["bash", "-c", setup.read_text(encoding="utf-8")],
            user=ROOT_USER,
            env={"HOME": "/root", **context.task_env()},
            timeout=context.spec.sandbox.verifier_timeout_sec,
            stdout=log,
            stderr=log,
            workdir=context.workdir,
        )
        if result.timed_out or result.exit_code != 0:
            tail = log.read_text(errors="replace").strip()[-200:] if log.is_file() else ""
            ended = "timed out" if result.timed_out else f"exit {result.exit_code}"
            raise VerifierError(f"{setup}: failed ({ended}){': ' + tail if tail else ''}")
