"""Judges: named rubrics that score a trial after its verifier, by a model or by a program.

A model judge is sent the rubric, the task's instruction, the agent's diff and the end of its
output through the gateway, on its own token: its calls are attributed to the trial but
counted apart from the harness's (`role = judge:NAME`). It answers with a rationale and a
line `SCORE: x`, x in [0, 1]. A program judge is run on the host with the same material in
files and prints a score (or JSON `{"score": x, "rationale": "..."}`) as its last line.
On the scripted model a judge is played offline: it scores 1 when the agent changed files
and 0 when it changed none, so judges are testable without a key.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from pytest_hemra.core.environment import snapshot
from pytest_hemra.core.trial import Judgment, TrialUsage
from pytest_hemra.execute.gateway.ledger import CallPolicy
from pytest_hemra.execute.gateway.scripted import TextStep
from pytest_hemra.execute.gateway.server import Gateway
from pytest_hemra.resolve.judges import Judge
from pytest_hemra.resolve.upstreams import SCRIPTED_MODEL

SCORE = re.compile(r"SCORE:\s*([0-9]*\.?[0-9]+)", re.IGNORECASE)
MAX_MATERIAL_CHARS = 60_000  # of the diff and of the agent's output, each
JUDGE_TIMEOUT_SECS = 300.0
MAX_TOKENS = 1024


@dataclass(frozen=True)
class Material:
    """What a judge sees of a trial."""

    instruction: str
    diff: str
    output: str
    reward: float | None
    trial_dir: Path
    scripted_reply: str | None = None  # what the scripted model answers (calibration anchors)


def material(instruction: str, reward: float | None, trial_dir: Path) -> Material:
    diff = _tail(trial_dir / "diff.patch")
    output = _tail(trial_dir / "agent" / "stdout.txt")
    return Material(instruction, diff, output, reward, trial_dir)


def _tail(path: Path) -> str:
    if not path.is_file():
        return ""
    text = path.read_text(errors="replace")
    return text if len(text) <= MAX_MATERIAL_CHARS else "[...]\n" + text[-MAX_MATERIAL_CHARS:]


def run_judge(
    judge: Judge,
    seen: Material,
    *,
    gateway: Gateway | None,
    trial_id: str,
    run_id: str,
    keys: dict[str, str],
    run_model: str | None,
) -> Judgment:
    """Score one trial; a judge that fails says so in its judgment, never raises."""
    started = time.monotonic()
    if judge.command is not None:
        judgment = _program_judgment(judge, seen)
    elif gateway is None:
        judgment = Judgment(judge.name, None, "", "no gateway in this session")
    else:
        judgment = _model_judgment(judge, seen, gateway, trial_id, run_id, keys, run_model)
    return Judgment(**{**asdict(judgment), "duration": round(time.monotonic() - started, 4)})


def prompt(judge: Judge, seen: Material) -> str:
    return (
        f"{judge.rubric.strip()}\n\n## The task\n\n{seen.instruction.strip()}\n\n"
        f"## The agent's changes (unified diff)\n\n```diff\n{seen.diff}\n```\n\n"
        f"## The end of the agent's output\n\n```\n{seen.output}\n```\n\n"
        "Give a short rationale, then a last line `SCORE: x` with x between 0 and 1."
    )


def scripted_verdict(seen: Material) -> str:
    """The scripted model's judgment: 1 when the agent changed files, 0 when it did not."""
    if seen.diff.strip():
        return "The agent changed files in the workspace.\nSCORE: 1"
    return "The agent changed nothing.\nSCORE: 0"


def _model_judgment(
    judge: Judge,
    seen: Material,
    gateway: Gateway,
    trial_id: str,
    run_id: str,
    keys: dict[str, str],
    run_model: str | None,
) -> Judgment:
    text, error, usage = ask_model(
        gateway,
        JudgeCall(
            trial_id,
            run_id,
            judge.model or "",
            prompt(judge, seen),
            role=f"judge:{judge.name}",
            calls_dir=seen.trial_dir / "judges" / judge.name,
            scripted_reply=seen.scripted_reply or scripted_verdict(seen),
        ),
        keys,
        run_model,
    )
    score = _score(text) if error is None else None
    if error is None and score is None:
        error = "the judge's reply has no 'SCORE: x' line with x in [0, 1]"
    return with_usage(Judgment(judge.name, score, text.strip(), error), usage)


@dataclass(frozen=True)
class JudgeCall:
    """One question to a model, on its own gateway token attributed to a trial."""

    trial_id: str
    run_id: str
    model: str
    prompt: str
    role: str
    calls_dir: Path
    scripted_reply: str  # what the scripted model answers, when the model is scripted


def ask_model(
    gateway: Gateway, call: JudgeCall, keys: dict[str, str], run_model: str | None
) -> tuple[str, str | None, TrialUsage]:
    """Ask, and return (reply text, error or None, the call's usage)."""
    is_scripted = call.model.startswith(SCRIPTED_MODEL) or (run_model or "").startswith(
        SCRIPTED_MODEL
    )
    access = gateway.open_trial(
        call.trial_id,
        call.run_id,
        keys=keys,
        script=(TextStep(call.scripted_reply),) if is_scripted else None,
        policy=CallPolicy(model=SCRIPTED_MODEL if is_scripted else None),
        calls_dir=call.calls_dir,
        role=call.role,
    )
    text, error = "", None
    try:
        text = _ask(access.base_url("127.0.0.1"), access.token, call.model, call.prompt)
    except (OSError, ValueError, KeyError, IndexError, TypeError) as failure:
        error = f"judge call failed: {failure}"
    finally:
        usage = gateway.close_trial(access.token)
    return text, error, usage


# The gateway is on loopback: no proxy, and none looked up (urllib's default opener reads every
# environment variable at each call, which fails while pytest changes PYTEST_CURRENT_TEST on the
# thread that reports items as trials run on others: `run/lanes.py`).
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _ask(base_url: str, token: str, model: str, text: str) -> str:
    """One non-streamed call: the Messages API for Claude models, Chat Completions otherwise."""
    if model.startswith("claude"):
        url, headers = f"{base_url}/v1/messages", {"x-api-key": token}
        headers["anthropic-version"] = "2023-06-01"
    else:
        url, headers = f"{base_url}/v1/chat/completions", {"authorization": f"Bearer {token}"}
    body = {
        "model": model,
        "max_tokens": MAX_TOKENS,
        "messages": [{"role": "user", "content": text}],
    }
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={**headers, "content-type": "application/json"},
        method="POST",
    )
    try:
        with DIRECT.open(request, timeout=JUDGE_TIMEOUT_SECS) as response:
            reply = json.loads(response.read())
    except urllib.error.HTTPError as failure:
        raise ValueError(f"HTTP {failure.code}: {failure.read()[:300]!r}") from None
    if "choices" in reply:
        return str(reply["choices"][0]["message"]["content"] or "")
    return "".join(
        block.get("text", "") for block in reply["content"] if block.get("type") == "text"
    )


def _score(text: str) -> float | None:
    found = SCORE.findall(text)
    if not found:
        return None
    score = float(found[-1])
    return score if 0.0 <= score <= 1.0 else None


def with_usage(judgment: Judgment, usage: TrialUsage) -> Judgment:
    return Judgment(
        judgment.judge,
        judgment.score,
        judgment.rationale,
        judgment.error,
        calls=usage.calls,
        input_tokens=usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens,
        output_tokens=usage.output_tokens,
        cost=usage.known_cost,
    )


def _program_judgment(judge: Judge, seen: Material) -> Judgment:
    folder = seen.trial_dir / "judges" / judge.name
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "instruction_file": folder / "instruction.md",
        "diff_file": folder / "diff.patch",
        "output_file": folder / "agent-output.txt",
        "rubric_file": folder / "rubric.md",
    }
    files["instruction_file"].write_text(seen.instruction)
    files["diff_file"].write_text(seen.diff)
    files["output_file"].write_text(seen.output)
    files["rubric_file"].write_text(judge.rubric)
    values = {name: str(path) for name, path in files.items()}
    values |= {
        "trial_dir": str(seen.trial_dir),
        "reward": "" if seen.reward is None else f"{seen.reward:g}",
    }
    argv = [
        re.sub(r"\{([a-z_]+)\}", lambda m: values.get(m[1], m[0]), part)
        for part in judge.command or ()
    ]
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=JUDGE_TIMEOUT_SECS,
            stdin=subprocess.DEVNULL,
            cwd=folder,
            env={**snapshot(), "HEMRA_JUDGE": judge.name},
        )
    except (OSError, subprocess.TimeoutExpired) as failure:
        return Judgment(judge.name, None, "", f"judge command failed: {failure}")
    (folder / "stdout.txt").write_text(done.stdout)
    (folder / "stderr.txt").write_text(done.stderr)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return Judgment(
            judge.name, None, "", f"judge command exited {done.returncode} with no score"
        )
    return _parse_program_line(judge.name, lines[-1])


def _parse_program_line(name: str, line: str) -> Judgment:
    try:
        data = json.loads(line)
    except ValueError:
        data = line
    if isinstance(data, dict):
        score, rationale = data.get("score"), str(data.get("rationale") or "")
    else:
        score, rationale = data, ""
    try:
        value = float(score)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return Judgment(name, None, rationale, f"judge printed no score: {line[:200]!r}")
    if not 0.0 <= value <= 1.0:
        return Judgment(name, None, rationale, f"judge score {value} is outside [0, 1]")
    return Judgment(name, value, rationale, None)
