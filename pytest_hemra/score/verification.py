"""Scoring a trial in its sandbox, by the task's track: the verifier's reward file, the SWE
track's hidden tests, the open-ended track's checks and rubric judge, one step of a multi-step
task. Each returns (reward, every reward key) and notes on the trial's progress what it learned
(an error class, a pass threshold, a judgment)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from pytest_hemra.core.errors import VerifierError
from pytest_hemra.core.reward import parse_reward
from pytest_hemra.execute.context import Progress, TrialContext
from pytest_hemra.execute.gateway.ledger import TrialUsage
from pytest_hemra.execute.sandbox import ROOT_USER, Sandbox
from pytest_hemra.resolve.judges import Judgment
from pytest_hemra.score import openended, swe
from pytest_hemra.score.judges import JudgeCall, ask_model, with_usage


def verify_reward(context: TrialContext, sandbox: Sandbox) -> tuple[float, dict[str, float]]:
    settings = context.spec.verifier
    sandbox.put_dir(context.task.path / "tests", "/tests")
    if settings.network == "none":
        sandbox.disconnect_network()
    env = {"HOME": "/root", **{name: runner_env(name) for name in settings.env}}
    folder = context.trial_dir / "verifier"
    result = sandbox.exec(
        ["bash", "/tests/test.sh"],
        user=ROOT_USER,
        env=env,
        timeout=context.task.config.verifier.timeout_sec,
        stdout=folder / "stdout.txt",
        stderr=folder / "stderr.txt",
    )
    logs = sandbox.read_tree("/logs/verifier")
    for name, content in logs.items():
        if "/" not in name:
            (folder / name).write_bytes(content)
    if result.timed_out:
        raise VerifierError(
            f"verifier ran past its {context.task.config.verifier.timeout_sec:g}s timeout"
        )
    return parse_reward(logs)


def verify_step(
    context: TrialContext, sandbox: Sandbox, task_path: Path, step_path: Path, step_dir: Path
) -> tuple[float, dict[str, float]]:
    """One step's verifier: the task's tests/, the step's over them, the network cut meanwhile."""
    settings = context.spec.verifier
    sandbox.exec(
        ["bash", "-c", "rm -rf /tests /logs/verifier/* 2>/dev/null; true"],
        user=ROOT_USER,
        env={"HOME": "/root"},
        timeout=30,
        stdout=step_dir / "verifier" / "clear.txt",
        stderr=step_dir / "verifier" / "clear.txt",
    )
    if (task_path / "tests").is_dir():
        sandbox.put_dir(task_path / "tests", "/tests")
    if (step_path / "tests").is_dir():
        sandbox.put_dir(step_path / "tests", "/tests")
    if settings.network == "none":
        sandbox.disconnect_network()
    try:
        result = sandbox.exec(
            ["bash", "/tests/test.sh"],
            user=ROOT_USER,
            env={"HOME": "/root", **{name: runner_env(name) for name in settings.env}},
            timeout=context.task.config.verifier.timeout_sec,
            stdout=step_dir / "verifier" / "stdout.txt",
            stderr=step_dir / "verifier" / "stderr.txt",
        )
    finally:
        if settings.network == "none":
            sandbox.reconnect_network()
    logs = sandbox.read_tree("/logs/verifier")
    for name, content in logs.items():
        if "/" not in name:
            (step_dir / "verifier" / name).write_bytes(content)
    if result.timed_out:
        raise VerifierError("the step's verifier ran past its timeout")
    return parse_reward(logs)


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
    if context.spec.verifier.network == "none":
        sandbox.disconnect_network()
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
    progress.error_class = result.error_class
    (folder / "verifier" / "swe.txt").write_text(f"{result.error_class}: {result.detail}\n")
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
    if context.spec.verifier.network == "none":
        sandbox.disconnect_network()
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
