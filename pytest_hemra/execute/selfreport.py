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
from dataclasses import dataclass
from typing import Any

AGREEMENT_TOLERANCE = 0.05  # relative difference in total tokens before a trial is flagged


@dataclass
class SelfReport:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float | None = None
    turns: int | None = None
    final_message: str | None = None
    is_error: bool | None = None

    @property
    def total_tokens(self) -> int:
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_read_tokens
            + self.cache_write_tokens
        )


def disagrees(own: SelfReport | None, gateway_tokens: int) -> bool:
    """Whether the harness's own token total is off the gateway's by more than the tolerance."""
    if own is None:
        return False
    largest = max(own.total_tokens, gateway_tokens)
    return largest > 0 and abs(own.total_tokens - gateway_tokens) / largest > AGREEMENT_TOLERANCE


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
    report, seen = SelfReport(turns=0), False
    for event in _events(text):
        kind = event.get("type")
        if kind == "turn.completed":
            seen = True
            usage = event.get("usage") or {}
            cached = _int(usage.get("cached_input_tokens"))
            report.input_tokens += _int(usage.get("input_tokens")) - cached
            report.cache_read_tokens += cached
            report.output_tokens += _int(usage.get("output_tokens"))
            report.turns = (report.turns or 0) + 1
        elif kind == "item.completed":
            item = event.get("item") or {}
            if item.get("type") == "agent_message" and isinstance(item.get("text"), str):
                report.final_message = item["text"]
        elif kind == "turn.failed":
            report.is_error = True
    return report if seen else None


def _pi(text: str) -> SelfReport | None:
    report, seen = SelfReport(turns=0), False
    for event in _events(text):
        message = event.get("message") or {}
        if event.get("type") != "message_end" or message.get("role") != "assistant":
            continue
        seen = True
        usage = message.get("usage") or {}
        report.input_tokens += _int(usage.get("input"))
        report.output_tokens += _int(usage.get("output"))
        report.cache_read_tokens += _int(usage.get("cacheRead"))
        report.cache_write_tokens += _int(usage.get("cacheWrite"))
        cost = usage.get("cost")
        total = cost.get("total") if isinstance(cost, dict) else cost
        if isinstance(total, int | float):
            report.cost_usd = (report.cost_usd or 0.0) + float(total)
        report.turns = (report.turns or 0) + 1
        texts = [
            str(c["text"])
            for c in message.get("content") or []
            if isinstance(c, dict) and c.get("type") == "text" and isinstance(c.get("text"), str)
        ]
        if texts:
            report.final_message = "\n".join(texts)
        if message.get("stopReason") == "error":
            report.is_error = True
    return report if seen else None


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
    report, seen = SelfReport(turns=0), False
    for line in text.splitlines():
        tokens, cost = AIDER_TOKENS.match(line), AIDER_COST.search(line)
        if tokens:
            seen = True
            sent, hit = _aider_count(tokens["sent"]), _aider_count(tokens["hit"])
            written = _aider_count(tokens["write"])
            report.input_tokens += max(sent - hit - written, 0)
            report.cache_read_tokens += hit
            report.cache_write_tokens += written
            report.output_tokens += _aider_count(tokens["received"])
            report.turns = (report.turns or 0) + 1
        if cost:
            report.cost_usd = float(cost["session"])  # the session's running total
    return report if seen else None


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
    report, seen = SelfReport(turns=0), False
    for message in data["messages"]:
        if not isinstance(message, dict):
            continue
        extra = _mapping(message.get("extra"))
        usage = _mapping(_mapping(extra.get("response")).get("usage"))
        if message.get("role") == "assistant" and usage:
            seen = True
            cached = _int(_mapping(usage.get("prompt_tokens_details")).get("cached_tokens"))
            report.input_tokens += max(_int(usage.get("prompt_tokens")) - cached, 0)
            report.cache_read_tokens += cached
            report.output_tokens += _int(usage.get("completion_tokens"))
        if message.get("role") == "exit":
            status = extra.get("exit_status")
            report.final_message = str(extra.get("submission") or status or "")
            report.is_error = status not in ("Submitted", None)
    stats = _mapping(_mapping(data.get("info")).get("model_stats"))
    if isinstance(stats.get("instance_cost"), int | float):
        report.cost_usd = float(stats["instance_cost"])
    report.turns = _int(stats.get("api_calls")) or None
    return report if seen else None


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
