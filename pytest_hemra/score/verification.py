"""Scoring a trial in its sandbox, by the task's track: the verifier's reward file (test.sh run
in the clean room of `room.py`), the SWE track's hidden tests, the open-ended track's checks and
rubric judge, one step of a multi-step task. Each returns (reward, every reward key) and notes on
the trial's progress what it learned (an error class, a pass threshold, a judgment)."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from pytest_hemra.core.errors import Tampered, VerifierError
from pytest_hemra.core.outcome import SweClass
from pytest_hemra.core.reward import parse_reward
from pytest_hemra.core.trial import Judgment, TrialUsage
from pytest_hemra.execute.context import Progress, TrialContext
from pytest_hemra.execute.identity import verifier_identity
from pytest_hemra.execute.sandbox import Sandbox
from pytest_hemra.resolve.taskconfig import TaskVerifier
from pytest_hemra.resolve.verifier_environment import verifier_task
from pytest_hemra.score import openended, swe
from pytest_hemra.score.judges import JudgeCall, ask_model, with_usage
from pytest_hemra.score.model_access import verifier_model
from pytest_hemra.score.provenance import check_rewards, declared_kinds, refuse_planted
from pytest_hemra.score.room import (
    EMPTY_ROOM,
    ENTER_TESTS,
    HAND_OVER,
    TESTS_DIR,
    VERIFIER_LOGS,
    cut_network,
    end_around_keeper,
    is_separate,
    run_root,
    tests_archive,
    verifier_egress,
    verifier_network,
)


def verify_reward(context: TrialContext, sandbox: Sandbox) -> tuple[float, dict[str, float]]:
    folder = context.trial_dir / "verifier"
    tests, settings = [context.task.path / "tests"], context.task.config.verifier
    logs = _run_test_sh(context, sandbox, tests, folder, settings)
    check_rewards(logs, declared_kinds(tests, settings.env.values()))
    return parse_reward(logs, context.reward_keys)


def verify_step(
    context: TrialContext,
    sandbox: Sandbox,
    task_path: Path,
    step_path: Path,
    step_dir: Path,
    settings: TaskVerifier,
) -> tuple[float, dict[str, float]]:
    """One step's verifier (its `[steps.verifier]` settings): the task's tests/, the step's
    over them. The tests and the verifier's logs are removed after it, so the next step's agent
    never sees them."""
    tests = [path / "tests" for path in (task_path, step_path) if (path / "tests").is_dir()]
    env = {**context.task.config.verifier.env, **settings.env}
    user = settings.user if settings.user is not None else context.task.config.verifier.user
    try:
        logs = _run_test_sh(
            context,
            sandbox,
            tests,
            step_dir / "verifier",
            settings.model_copy(update={"env": env, "user": user}),
        )
    finally:  # test.sh's processes gone for the next step: killed around the keeper, the
        # sandbox running on, else (halted to read its rewards) it is started again
        if not end_around_keeper(context, sandbox, "after a step's verifier"):
            sandbox.empty()
        run_root(sandbox, EMPTY_ROOM, step_dir / "verifier" / "clear.txt")
        sandbox.reconnect_network()
    check_rewards(logs, declared_kinds(tests, env.values()))
    return parse_reward(logs, context.reward_keys)


def _run_test_sh(
    context: TrialContext,
    sandbox: Sandbox,
    tests: list[Path],
    folder: Path,
    task_settings: TaskVerifier,
) -> dict[str, bytes]:
    """The clean room, in this order: the agent's processes gone (the turn's `empty_room`; a
    separate room starts so), the verifier's network set, the tests in (root's, unreadable to
    others) under a name no one knows, then as root one command: /tests (whatever the agent
    left there) replaced by them, /logs/verifier made new, test.sh (ENTER_TESTS); then every
    process in it but PID 1 killed from this host where PID 1 is the keeper, else the sandbox
    halted (killed whole by the kernel), and what test.sh wrote to /logs/verifier returned (and
    kept in `folder`), read through the engine or its storage. The tests go in through the
    sandbox's storage on this host where they can (`put_local`), else as an archive."""
    settings = context.spec.verifier
    proxied = cut_network(context, sandbox, task_settings)
    staging = f"/.hemra-tests-{secrets.token_hex(12)}"
    archive = tests_archive(tests, staging)
    if sandbox.halted:  # left halted after the turn (`empty_room`): the tests in, then started
        placed = sandbox.put_local(archive)
        sandbox.empty()
    else:  # through its root on this host, where nothing of the agent's runs in it any more
        placed = not context.keeps_processes and sandbox.put_local(archive)
    if not placed:
        sandbox.import_tree(iter([archive]), "/")
    if is_separate(context):  # a declared artifact copied in there
        refuse_planted(sandbox.read_tree(VERIFIER_LOGS))
    identity = verifier_identity(context.task, task_settings.user, sandbox, folder / "user.txt")
    argv = ["/bin/sh", "-c", ENTER_TESTS, "sh", staging]
    if not identity.is_root:  # the room made as root first, then test.sh as its user
        log = folder / "hand-over.txt"
        run_root(sandbox, HAND_OVER, log, [staging, identity.user], VerifierError)
        log.unlink(missing_ok=True)
        argv = ["bash", f"{TESTS_DIR}/test.sh"]
    (folder / "user.txt").write_text(identity.describe() + "\n")
    with (
        verifier_egress(context, task_settings, folder, proxied) as proxy,
        verifier_model(
            context,
            sandbox,
            folder,
            provider_keys(context),
            public=verifier_network(context, task_settings) == "bridge",
        ) as model,
    ):
        result = sandbox.exec(
            argv,
            user=identity.user,
            env={
                "HOME": identity.home,
                **{name: runner_env(name) for name in settings.env},
                **_room_env(context),
                **context.render(task_settings.env),
                **proxy,
                **model,
            },
            timeout=task_settings.timeout_sec,
            stdout=folder / "stdout.txt",
            stderr=folder / "stderr.txt",
            workdir=context.workdir,
            exit_status=False,  # the reward files score it, as Harbor's do; not its exit code
        )
    # nothing test.sh left (an agent's program it ran) writes after it: every process but the
    # keeper killed from this host (no request), else the sandbox killed whole
    if not end_around_keeper(context, sandbox, "after the verifier"):
        sandbox.halt()
    logs = sandbox.read_tree(VERIFIER_LOGS)
    for name, content in logs.items():
        if "/" not in name:
            (folder / name).write_bytes(content)
    if result.timed_out:
        raise VerifierError(f"verifier ran past its {task_settings.timeout_sec:g}s timeout")
    return logs


def _room_env(context: TrialContext) -> dict[str, str]:
    """The environment's variables the verifier sees: its own `[verifier.environment] env` in
    a room of its own, else the task's `[environment] env`."""
    own = verifier_task(context.task) if is_separate(context) else None
    if own is None:
        return context.task_env()
    return context.render(own.config.environment.env)


def verify_swe(
    context: TrialContext,
    sandbox: Sandbox,
    progress: Progress,
    before: Mapping[str, bytes],
    after: Mapping[str, bytes],
) -> tuple[float, dict[str, float]]:
    """The SWE track: hidden tests on top of the agent's changes, passed / total, read from
    HEMRA's report file; `before` and `after` are /app around the agent's turn (swe.py)."""
    hemra = context.task.config.hemra
    folder = context.trial_dir
    if verifier_network(context, context.task.config.verifier) != "bridge":
        sandbox.disconnect_network()  # no proxy here: an allowlist reaches none of its hosts
    result = swe.score(
        sandbox,
        context.task.path,
        hemra.test_patch or "",
        hemra.test_command or [],
        hemra.test_timeout_sec,
        agent_diff=(folder / "diff.patch").read_text(errors="replace"),
        agent_output=text_of(folder / "agent" / "stdout.txt"),
        agent_timed_out=progress.timed_out,
        logs=folder / "verifier",
        before=before,
        after=after,
    )
    progress.swe_class = result.swe_class
    (folder / "verifier" / "swe.txt").write_text(f"{result.swe_class}: {result.detail}\n")
    if result.swe_class == SweClass.TAMPERED:  # the trial's outcome: tampered, reward 0
        raise Tampered(result.detail, evidence=result.evidence)
    rewards = {"reward": result.reward}
    if result.counts is not None:
        rewards |= {"tests_passed": result.counts.passed, "tests_total": result.counts.total}
    return result.reward, rewards


def verify_open(
    context: TrialContext, sandbox: Sandbox, progress: Progress, files: dict[str, bytes]
) -> tuple[float, dict[str, float]]:
    """The open-ended track: structural checks, then the frozen rubric prompt (openended.py)."""
    hemra, task = context.task.config.hemra, context.task
    folder = context.trial_dir
    if verifier_network(context, context.task.config.verifier) != "bridge":
        sandbox.disconnect_network()  # no proxy here: an allowlist reaches none of its hosts
    structure = openended.check_structure(sandbox, hemra, files, folder / "verifier")
    shown = {
        name: files[name.lstrip("/")][: openended.MAX_FILE_BYTES].decode(errors="replace")
        for name in hemra.expected_files
        if name.lstrip("/") in files
    }
    prompt = openended.judge_prompt(
        task.instruction, hemra.criteria, text_of(folder / "diff.patch"), shown
    )
    progress.pass_threshold = hemra.pass_threshold
    started = time.monotonic()
    text, usage = "", TrialUsage()
    error: str | None = "no gateway in this session"
    if context.gateway is not None:
        text, error, usage = ask_model(
            context.gateway,
            JudgeCall(
                context.trial_id,
                context.run_id,
                hemra.judge_model or context.spec.model or "",
                prompt,
                role=f"judge:{openended.JUDGE_NAME}",
                calls_dir=folder / "judges" / openended.JUDGE_NAME,
                scripted_reply=openended.scripted_reply(task.path, hemra.criteria),
            ),
            provider_keys(context),
            context.spec.model,
        )
    score: float | None = None
    rewards: dict[str, float] = {"structure_ok": float(structure.ok)}
    if error is None:
        try:
            verdict = openended.parse_verdict(text, hemra.criteria)
        except ValueError as failure:
            error = str(failure)
        else:
            score = openended.composite(verdict, hemra.criteria, structure)
            rewards |= {f"criterion:{name}": value for name, value in verdict.scores.items()}
    (folder / "verifier" / "open.txt").write_text(
        f"{openended.PROMPT_VERSION}: {structure.describe()}; "
        + (f"composite {score:.4f}\n" if score is not None else f"judge error: {error}\n")
    )
    judgment = Judgment(openended.JUDGE_NAME, score, text.strip(), error)
    progress.judgments.append(
        replace(with_usage(judgment, usage), duration=round(time.monotonic() - started, 4))
    )
    reward = score if score is not None else 0.0  # a judge error scores 0 (and is flagged)
    return reward, {"reward": reward, **rewards}


def provider_keys(context: TrialContext) -> dict[str, str]:
    """Real keys by provider, read from the runner's environment (kept in memory only)."""
    gateway = context.gateway
    if gateway is None:
        return {}
    keys = {
        name: os.environ[provider.key_env]
        for name, provider in gateway.providers.items()
        if provider.key_env and provider.key_env in os.environ
    }
    harness = context.harness.spec
    if harness.provider and harness.key_env and harness.key_env in os.environ:
        keys[harness.provider] = os.environ[harness.key_env]
    return keys


def text_of(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""


def runner_env(name: str) -> str:
    return os.environ.get(name, "")
