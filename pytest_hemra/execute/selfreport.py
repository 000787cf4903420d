"""What a harness says about itself, parsed from its own output (`output = "..."` in its file).

Kept beside the gateway's count, never instead of it: the report flags a trial where the two
disagree. Claude Code reports totals in its `result` event; Codex per turn in `turn.completed`;
pi per model call in each assistant `message_end`; aider per model call in a printed `Tokens:`
line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from pytest_hemra.core.trial import SelfReport
from pytest_hemra.core.usage import Usage


def _with_tokens(report: SelfReport, tokens: Usage) -> SelfReport:
    return replace(
        report,
        input_tokens=tokens.input_tokens,
        output_tokens=tokens.output_tokens,
        cache_read_tokens=tokens.cache_read_tokens,
        cache_write_tokens=tokens.cache_write_tokens,
    )


def _events(text: str) -> Iterator[dict[str, Any]]:
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                yield event


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _claude_code(text: str) -> SelfReport | None:
    result = None
    for event in _events(text):
        if event.get("type") == "result":
            result = event
    if result is None:
        return None
    usage = result.get("usage") or {}
    cost = result.get("total_cost_usd")
    return SelfReport(
        input_tokens=_int(usage.get("input_tokens")),
        output_tokens=_int(usage.get("output_tokens")),
        cache_read_tokens=_int(usage.get("cache_read_input_tokens")),
        cache_write_tokens=_int(usage.get("cache_creation_input_tokens")),
        cost_usd=float(cost) if isinstance(cost, int | float) else None,
        turns=result.get("num_turns") if isinstance(result.get("num_turns"), int) else None,
        final_message=result.get("result") if isinstance(result.get("result"), str) else None,
        is_error=bool(result.get("is_error")),
    )


def _codex(text: str) -> SelfReport | None:
    tokens, turns, final, is_error = Usage(), 0, None, None
    for event in _events(text):
        kind = event.get("type")
        if kind == "turn.completed":
            usage = event.get("usage") or {}
            cached = _int(usage.get("cached_input_tokens"))
            tokens += Usage(
                input_tokens=_int(usage.get("input_tokens")) - cached,
                output_tokens=_int(usage.get("output_tokens")),
                cache_read_tokens=cached,
            )
            turns += 1
        elif kind == "item.completed":
            item = event.get("item") or {}
            if item.get("type") == "agent_message" and isinstance(item.get("text"), str):
                final = item["text"]
        elif kind == "turn.failed":
            is_error = True
    if not turns:
        return None
    report = SelfReport(turns=turns, final_message=final, is_error=is_error)
    return _with_tokens(report, tokens)


def _pi(text: str) -> SelfReport | None:
    tokens, turns, cost_usd, final, is_error = Usage(), 0, None, None, None
    for event in _events(text):
        message = event.get("message") or {}
        if event.get("type") != "message_end" or message.get("role") != "assistant":
            continue
        usage = message.get("usage") or {}
        tokens += Usage(
            _int(usage.get("input")),
            _int(usage.get("output")),
            _int(usage.get("cacheRead")),
            _int(usage.get("cacheWrite")),
        )
        cost = usage.get("cost")
        total = cost.get("total") if isinstance(cost, dict) else cost
        if isinstance(total, int | float):
            cost_usd = (cost_usd or 0.0) + float(total)
        turns += 1
        texts = [
            str(c["text"])
            for c in message.get("content") or []
            if isinstance(c, dict) and c.get("type") == "text" and isinstance(c.get("text"), str)
        ]
        if texts:
            final = "\n".join(texts)
        if message.get("stopReason") == "error":
            is_error = True
    if not turns:
        return None
    report = SelfReport(cost_usd=cost_usd, turns=turns, final_message=final, is_error=is_error)
    return _with_tokens(report, tokens)


# `Tokens: 1.2k sent, 20 cache write, 5 cache hit, 50 received.`: "sent" holds the cached and
# cache-written input too. Past 999 aider rounds (`1.2k`, `12k`), so large counts are approximate.
AIDER_TOKENS = re.compile(
    r"^Tokens: (?P<sent>[\d.]+k?) sent"
    r"(?:, (?P<write>[\d.]+k?) cache write)?(?:, (?P<hit>[\d.]+k?) cache hit)?"
    r", (?P<received>[\d.]+k?) received\."
)
AIDER_COST = re.compile(r"Cost: \$[\d.]+ message, \$(?P<session>[\d.]+) session\.")


def _aider_count(text: str | None) -> int:
    if not text:
        return 0
    return round(float(text[:-1]) * 1000) if text.endswith("k") else int(text)


def _aider(text: str) -> SelfReport | None:
    """aider prints a `Tokens:` line per message it sends (and a `Cost:` one when it knows the
    price). No final message: it prints replies re-wrapped, with diffs in place of files."""
    tokens, turns, cost_usd = Usage(), 0, None
    for line in text.splitlines():
        counts, cost = AIDER_TOKENS.match(line), AIDER_COST.search(line)
        if counts:
            sent, hit = _aider_count(counts["sent"]), _aider_count(counts["hit"])
            written = _aider_count(counts["write"])
            tokens += Usage(
                input_tokens=max(sent - hit - written, 0),
                output_tokens=_aider_count(counts["received"]),
                cache_read_tokens=hit,
                cache_write_tokens=written,
            )
            turns += 1
        if cost:
            cost_usd = float(cost["session"])  # the session's running total
    report = SelfReport(cost_usd=cost_usd, turns=turns, is_estimate=True)
    return _with_tokens(report, tokens) if turns else None


def _mini_swe_agent(text: str) -> SelfReport | None:
    """mini-swe-agent's trajectory file (`-o`): each assistant message keeps the raw response
    (`extra.response.usage`, Chat Completions counts: cached input inside `prompt_tokens`), and
    `info.model_stats` its cost and calls; the exit message says how it ended."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
        return None
    tokens, seen, final, is_error = Usage(), False, None, None
    for message in data["messages"]:
        if not isinstance(message, dict):
            continue
        extra = _mapping(message.get("extra"))
        usage = _mapping(_mapping(extra.get("response")).get("usage"))
        if message.get("role") == "assistant" and usage:
            seen = True
            cached = _int(_mapping(usage.get("prompt_tokens_details")).get("cached_tokens"))
            tokens += Usage(
                input_tokens=max(_int(usage.get("prompt_tokens")) - cached, 0),
                output_tokens=_int(usage.get("completion_tokens")),
                cache_read_tokens=cached,
            )
        if message.get("role") == "exit":
            status = extra.get("exit_status")
            final = str(extra.get("submission") or status or "")
            is_error = status not in ("Submitted", None)
    if not seen:
        return None
    stats = _mapping(_mapping(data.get("info")).get("model_stats"))
    cost = stats.get("instance_cost")
    report = SelfReport(
        cost_usd=float(cost) if isinstance(cost, int | float) else None,
        turns=_int(stats.get("api_calls")) or None,
        final_message=final,
        is_error=is_error,
    )
    return _with_tokens(report, tokens)


PARSERS: dict[str, Callable[[str], SelfReport | None]] = {
    "claude-code": _claude_code,
    "codex": _codex,
    "pi": _pi,
    "aider": _aider,
    "mini-swe-agent": _mini_swe_agent,
}


def parse_output(kind: str | None, stdout: str) -> SelfReport | None:
    """The harness's own numbers from its stdout; None when it printed none we can read."""
    parser = PARSERS.get(kind or "")
    return parser(stdout) if parser else None
