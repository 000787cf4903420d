"""A trial's normalized transcript, built from the model calls the gateway kept.

Whatever the harness and its API (Anthropic Messages, OpenAI Responses, Chat Completions,
streamed or not), `trajectory.json` holds one documented shape (docs/trajectories.md):

    {"schema_version": 1, "format": "hemra-trajectory/1", "wire": "...", "main_call": 3,
     "messages": [{"role": "system|user|assistant|tool", "text": "...",
                   "tool_calls": [{"id": "...", "name": "...", "arguments": "..."}],
                   "tool_call_id": "...", "output": "..."}],
     "calls": [{"seq": 1, "model": "...", "status": 200, "input_tokens": ..., ...}]}

The conversation is the longest one any call carried (its request's messages plus its answer):
harnesses resend the whole history each turn, and side calls (titles, summaries) are short.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pytest_hemra.core.records import CallRow
from pytest_hemra.execute.gateway.wire import Wire

SCHEMA_VERSION = 1
Message = dict[str, Any]


def build_trajectory(calls_dir: Path, calls: Sequence[CallRow]) -> dict[str, Any]:
    """The trajectory of one trial from `calls/NNNN.request.json` and `.response` files."""
    best: tuple[int, int, str, list[Message]] = (-1, 0, "", [])
    for seq, row in enumerate(calls, start=1):
        request_file = calls_dir / f"{seq:04d}.request.json"
        if row.refused or not request_file.is_file():
            continue
        wire = Wire(row.wire)
        if wire not in (Wire.ANTHROPIC, Wire.RESPONSES, Wire.CHAT):
            continue
        request = _json(request_file.read_bytes())
        answer = _answer(wire, (calls_dir / f"{seq:04d}.response").read_bytes())
        messages = [*_conversation(wire, request), *answer]
        if len(messages) >= best[0]:
            best = (len(messages), seq, wire.value, messages)
    return {
        "schema_version": SCHEMA_VERSION,
        "format": "hemra-trajectory/1",
        "wire": best[2] or None,
        "main_call": best[1] or None,
        "messages": best[3],
        "calls": [
            {
                "seq": seq,
                "model": row.model or row.model_requested,
                "status": row.status,
                **{
                    name: count if row.is_usage_known else None  # unknown, never 0
                    for name, count in row.counts().items()
                },
                "cost": row.cost,
                "latency": row.latency,
                "refused": row.refused,
            }
            for seq, row in enumerate(calls, start=1)
        ],
    }


def _json(raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _events(raw: bytes) -> Iterator[dict[str, Any]]:
    for line in raw.decode(errors="replace").splitlines():
        if line.startswith("data:"):
            payload = line[5:].strip()
            if payload and payload != "[DONE]":
                event = _json(payload.encode())
                if event:
                    yield event


def _is_stream(raw: bytes) -> bool:
    head = raw.lstrip()[:64]
    return head.startswith((b"event:", b"data:"))


def _text(content: Any) -> str | None:
    """Text out of a string or a list of text blocks, whatever each API calls them."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            str(block.get("text"))
            for block in content
            if isinstance(block, dict) and isinstance(block.get("text"), str)
        ]
        return "\n".join(parts) if parts else None
    return None


def _message(role: str, text: str | None = None, **extra: Any) -> Message:
    message: Message = {"role": role}
    if text:
        message["text"] = text
    message.update({key: value for key, value in extra.items() if value})
    return message


# -- the conversation a request carries ------------------------------------------------------


def _conversation(wire: Wire, request: dict[str, Any]) -> list[Message]:
    if wire is Wire.ANTHROPIC:
        return _anthropic_conversation(request)
    if wire is Wire.CHAT:
        return _chat_conversation(request)
    return _responses_conversation(request)


def _anthropic_conversation(request: dict[str, Any]) -> list[Message]:
    messages = [_message("system", _text(request.get("system")))] if request.get("system") else []
    for entry in request.get("messages") or []:
        content = entry.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        results = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"]
        for result in results:
            messages.append(
                _message(
                    "tool",
                    tool_call_id=result.get("tool_use_id"),
                    output=_text(result.get("content")),
                )
            )
        rest = [b for b in blocks if b not in results]
        if rest:
            messages.append(_anthropic_turn(str(entry.get("role")), rest))
    return messages


def _anthropic_turn(role: str, blocks: list[Any]) -> Message:
    calls = [
        {"id": b.get("id"), "name": b.get("name"), "arguments": json.dumps(b.get("input"))}
        for b in blocks
        if isinstance(b, dict) and b.get("type") == "tool_use"
    ]
    return _message(role, _text(blocks), tool_calls=calls)


def _chat_conversation(request: dict[str, Any]) -> list[Message]:
    messages = []
    for entry in request.get("messages") or []:
        role = str(entry.get("role"))
        if role == "tool":
            messages.append(
                _message(
                    "tool",
                    tool_call_id=entry.get("tool_call_id"),
                    output=_text(entry.get("content")),
                )
            )
            continue
        calls = [
            {
                "id": c.get("id"),
                "name": (c.get("function") or {}).get("name"),
                "arguments": (c.get("function") or {}).get("arguments"),
            }
            for c in entry.get("tool_calls") or []
        ]
        messages.append(_message(role, _text(entry.get("content")), tool_calls=calls))
    return messages


def _responses_conversation(request: dict[str, Any]) -> list[Message]:
    messages = (
        [_message("system", _text(request.get("instructions")))]
        if request.get("instructions")
        else []
    )
    items = request.get("input")
    if isinstance(items, str):
        return [*messages, _message("user", items)]
    for item in items or []:
        if isinstance(item, dict):
            messages.extend(_responses_item(item))
    return messages


def _responses_item(item: dict[str, Any]) -> list[Message]:
    kind = item.get("type", "message")
    if kind == "message":
        return [_message(str(item.get("role")), _text(item.get("content")))]
    if kind in ("function_call", "custom_tool_call"):
        arguments = item.get("arguments", item.get("input"))
        call = {"id": item.get("call_id"), "name": item.get("name"), "arguments": arguments}
        return [_message("assistant", tool_calls=[call])]
    if kind in ("function_call_output", "custom_tool_call_output"):
        return [
            _message("tool", tool_call_id=item.get("call_id"), output=_text(item.get("output")))
        ]
    return []


# -- the answer a response carries -----------------------------------------------------------


def _answer(wire: Wire, raw: bytes) -> list[Message]:
    stream = _is_stream(raw)
    if wire is Wire.ANTHROPIC:
        blocks = _anthropic_stream(raw) if stream else _json(raw).get("content") or []
        return [_anthropic_turn("assistant", blocks)] if blocks else []
    if wire is Wire.CHAT:
        message = (
            _chat_stream(raw)
            if stream
            else ((_json(raw).get("choices") or [{}])[0].get("message") or {})
        )
        return _chat_conversation({"messages": [message]}) if message else []
    output = _responses_stream(raw) if stream else _json(raw).get("output") or []
    return [m for item in output if isinstance(item, dict) for m in _responses_item(item)]


def _anthropic_stream(raw: bytes) -> list[dict[str, Any]]:
    blocks: dict[int, dict[str, Any]] = {}
    partial: dict[int, str] = {}
    for event in _events(raw):
        index = event.get("index", 0)
        if event.get("type") == "content_block_start":
            blocks[index] = dict(event.get("content_block") or {})
        elif event.get("type") == "content_block_delta":
            delta = event.get("delta") or {}
            block = blocks.setdefault(index, {"type": "text", "text": ""})
            if delta.get("type") == "text_delta":
                block["text"] = block.get("text", "") + str(delta.get("text", ""))
            elif delta.get("type") == "input_json_delta":
                partial[index] = partial.get(index, "") + str(delta.get("partial_json", ""))
    for index, text in partial.items():
        blocks[index]["input"] = _json(text.encode()) if text else {}
    return [blocks[i] for i in sorted(blocks)]


def _chat_stream(raw: bytes) -> dict[str, Any]:
    text = ""
    calls: dict[int, dict[str, Any]] = {}
    for event in _events(raw):
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            text += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                slot = calls.setdefault(call.get("index", 0), {"function": {"arguments": ""}})
                slot["id"] = call.get("id") or slot.get("id")
                function = call.get("function") or {}
                if function.get("name"):
                    slot["function"]["name"] = function["name"]
                slot["function"]["arguments"] += function.get("arguments") or ""
    return {
        "role": "assistant",
        "content": text or None,
        "tool_calls": [calls[i] for i in sorted(calls)],
    }


def _responses_stream(raw: bytes) -> list[Any]:
    done: list[Any] = []
    for event in _events(raw):
        kind = event.get("type")
        if kind in ("response.completed", "response.incomplete", "response.failed"):
            output = (event.get("response") or {}).get("output")
            if output:
                return list(output)
        if kind == "response.output_item.done":
            done.append(event.get("item"))
    return done
