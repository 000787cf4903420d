"""The scripted model's replies in each wire format: JSON bodies and full SSE event sequences.

The sequences are the full ones the real CLIs accept (see shared/notes/harness-cli.md): Anthropic
`message_start` ... `message_stop`; Responses `response.created` ... `response.completed` (with
`output_item.added` before `.done`, which pi needs); Chat chunks, a usage chunk when asked, and
`[DONE]`.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from aiohttp import web

from pytest_hemra.execute.gateway.scripted import (
    MODEL,
    RESERVED_NAMESPACE,
    SCRIPTED_USAGE,
    Reply,
    Script,
    TextStep,
    ToolCall,
    next_step,
    offered_tools,
    plan_reply,
)
from pytest_hemra.execute.gateway.wire import Wire

# ---- answering ----------------------------------------------------------------------------------


async def respond(
    request: web.Request, wire: Wire, body: dict[str, Any], script: Script
) -> web.StreamResponse:
    """Answer one model call with the script's next step, streamed when the request asks."""
    if wire is Wire.COUNT_TOKENS:
        return web.json_response({"input_tokens": SCRIPTED_USAGE.input_tokens})
    if wire not in (Wire.ANTHROPIC, Wire.RESPONSES, Wire.CHAT):
        message = f"the scripted model does not answer {request.path}"
        return web.json_response(
            {"error": {"type": "not_found_error", "message": message}}, status=404
        )
    reply = plan_reply(next_step(wire, body, script), offered_tools(wire, body), body)
    if body.get("stream") is not True:
        if wire is Wire.ANTHROPIC:
            return web.json_response(_anthropic_message(reply))
        if wire is Wire.RESPONSES:
            return web.json_response(_response_object(_response_item(reply), "completed"))
        return web.json_response(_chat_completion(reply))
    if wire is Wire.ANTHROPIC:
        events = _anthropic_events(reply)
    elif wire is Wire.RESPONSES:
        events = _responses_events(reply)
    else:
        options = body.get("stream_options")
        asked = isinstance(options, dict) and options.get("include_usage") is True
        events = _chat_events(reply, with_usage=asked)
    return await _stream(request, events)


async def _stream(request: web.Request, events: Iterator[bytes]) -> web.StreamResponse:
    """Each event is its own write, so a proxy in between sees a real stream."""
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    for event in events:
        await response.write(event)
    await response.write_eof()
    return response


def _sse(name: str | None, payload: dict[str, Any]) -> bytes:
    data = f"data: {json.dumps(payload)}\n\n"
    return (f"event: {name}\n{data}" if name else data).encode()


def _new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


# Anthropic Messages


def _anthropic_usage(output_tokens: int) -> dict[str, int]:
    return {
        "input_tokens": SCRIPTED_USAGE.input_tokens,
        "cache_creation_input_tokens": SCRIPTED_USAGE.cache_write_tokens,
        "cache_read_input_tokens": SCRIPTED_USAGE.cache_read_tokens,
        "output_tokens": output_tokens,
    }


def _anthropic_message(reply: Reply) -> dict[str, Any]:
    if isinstance(reply, ToolCall):
        arguments = json.loads(reply.arguments)
        block = {
            "type": "tool_use",
            "id": _new_id("toolu_"),
            "name": reply.tool.name,
            "input": arguments,
        }
        stop_reason = "tool_use"
    else:
        block = {"type": "text", "text": reply.text}
        stop_reason = "refusal" if reply.is_refusal else "end_turn"
    return {
        "id": _new_id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": [block],
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": _anthropic_usage(SCRIPTED_USAGE.output_tokens),
    }


def _anthropic_events(reply: Reply) -> Iterator[bytes]:
    """Claude Code loses a tool call whose `content_block_stop` is missing, and retries."""
    message = _anthropic_message(reply)
    block = message["content"][0]
    start = {**message, "content": [], "stop_reason": None, "usage": _anthropic_usage(1)}
    yield _sse("message_start", {"type": "message_start", "message": start})
    if isinstance(reply, ToolCall):
        opened = {**block, "input": {}}
        delta = {"type": "input_json_delta", "partial_json": reply.arguments}
    else:
        opened = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": reply.text}
    yield _sse(
        "content_block_start", {"type": "content_block_start", "index": 0, "content_block": opened}
    )
    yield _sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
    yield _sse("content_block_stop", {"type": "content_block_stop", "index": 0})
    yield _sse(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": SCRIPTED_USAGE.output_tokens},
        },
    )
    yield _sse("message_stop", {"type": "message_stop"})


# OpenAI Responses


def _openai_usage() -> tuple[int, int, int]:
    """(input including cached, cached, output): OpenAI counts cached input inside the input."""
    cached = SCRIPTED_USAGE.cache_read_tokens
    return SCRIPTED_USAGE.input_tokens + cached, cached, SCRIPTED_USAGE.output_tokens


def _response_usage() -> dict[str, Any]:
    total_input, cached, output = _openai_usage()
    return {
        "input_tokens": total_input,
        # current SDKs require `cache_write_tokens`; the scripted model reports none on OpenAI wires
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": total_input + output,
    }


def _response_item(reply: Reply) -> dict[str, Any]:
    if isinstance(reply, TextStep):
        text = {"type": "output_text", "text": reply.text, "annotations": [], "logprobs": []}
        return {
            "type": "message",
            "id": _new_id("msg_"),
            "status": "completed",
            "role": "assistant",
            "content": [text],
        }
    tool = reply.tool
    if tool.is_freeform:
        item = {"type": "custom_tool_call", "id": _new_id("ctc_"), "input": reply.arguments}
    else:
        item = {"type": "function_call", "id": _new_id("fc_"), "arguments": reply.arguments}
    item.update(call_id=_new_id("call_"), name=tool.name, status="completed")
    if tool.namespace and tool.namespace != RESERVED_NAMESPACE:
        item["namespace"] = tool.namespace
    return item


def _response_object(item: dict[str, Any] | None, status: str) -> dict[str, Any]:
    """A Responses `response`; in progress, it has no output and no usage yet."""
    return {
        "id": _new_id("resp_"),
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "model": MODEL,
        "output": [item] if item else [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "text": {"format": {"type": "text"}},
        "usage": _response_usage() if status == "completed" else None,
    }


def _responses_events(reply: Reply) -> Iterator[bytes]:
    """pi silently does nothing unless `output_item.added` precedes `output_item.done`."""
    item = _response_item(reply)
    response = _response_object(None, "in_progress")
    sequence = itertools.count()

    def event(kind: str, **fields: Any) -> bytes:
        return _sse(kind, {"type": kind, "sequence_number": next(sequence), **fields})

    yield event("response.created", response=response)
    yield event("response.in_progress", response=response)
    at = {"output_index": 0}
    on_item = {"item_id": item["id"], **at}
    empty: dict[str, dict[str, Any]] = {
        "message": {"content": []},
        "custom_tool_call": {"input": ""},
    }
    added = {**item, "status": "in_progress", **empty.get(item["type"], {"arguments": ""})}
    yield event("response.output_item.added", item=added, **at)
    if item["type"] == "message":
        part = item["content"][0]
        on_part = {**on_item, "content_index": 0}
        yield event("response.content_part.added", part={**part, "text": ""}, **on_part)
        yield event("response.output_text.delta", delta=part["text"], logprobs=[], **on_part)
        yield event("response.output_text.done", text=part["text"], logprobs=[], **on_part)
        yield event("response.content_part.done", part=part, **on_part)
    elif item["type"] == "custom_tool_call":
        yield event("response.custom_tool_call_input.delta", delta=item["input"], **on_item)
        yield event("response.custom_tool_call_input.done", input=item["input"], **on_item)
    else:
        yield event("response.function_call_arguments.delta", delta=item["arguments"], **on_item)
        done = {"arguments": item["arguments"], "name": item["name"]}
        yield event("response.function_call_arguments.done", **done, **on_item)
    yield event("response.output_item.done", item=item, **at)
    completed = {**response, "status": "completed", "output": [item], "usage": _response_usage()}
    yield event("response.completed", response=completed)


# OpenAI Chat Completions


def _chat_usage() -> dict[str, Any]:
    total_input, cached, output = _openai_usage()
    return {
        "prompt_tokens": total_input,
        "completion_tokens": output,
        "total_tokens": total_input + output,
        "prompt_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
    }


def _chat_tool_call(reply: ToolCall, arguments: str) -> dict[str, Any]:
    return {
        "id": _new_id("call_"),
        "type": "function",
        "function": {"name": reply.tool.name, "arguments": arguments},
    }


def _chat_completion(reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None}
    if isinstance(reply, ToolCall):
        message["tool_calls"] = [_chat_tool_call(reply, reply.arguments)]
        finish_reason = "tool_calls"
    else:
        message["content"] = reply.text  # a refusal is plain text: what a harness shows
        finish_reason = "stop"
    choice = {"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}
    return {
        "id": _new_id("chatcmpl-"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": MODEL,
        "choices": [choice],
        "usage": _chat_usage(),
    }


def _chat_events(reply: Reply, *, with_usage: bool) -> Iterator[bytes]:
    """Tool name first with empty arguments, then the arguments, then the finish; usage as
    OpenAI sends it, only when the request asks (`stream_options.include_usage`): `null` on
    every chunk, then a chunk of its own (the gateway always asks)."""
    head: dict[str, Any] = {
        "id": _new_id("chatcmpl-"),
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": MODEL,
    }

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
        usage = {"usage": None} if with_usage else {}
        return _sse(None, {**head, "choices": [choice], **usage})

    if isinstance(reply, ToolCall):
        call = {"index": 0, **_chat_tool_call(reply, "")}
        yield chunk({"role": "assistant", "content": None, "tool_calls": [call]})
        arguments = {"index": 0, "function": {"arguments": reply.arguments}}
        yield chunk({"tool_calls": [arguments]})
        yield chunk({}, "tool_calls")
    else:
        yield chunk({"role": "assistant", "content": ""})
        yield chunk({"content": reply.text})
        yield chunk({}, "stop")
    if with_usage:
        yield _sse(None, {**head, "choices": [], "usage": _chat_usage()})
    yield b"data: [DONE]\n\n"


# ---- plain JSON at the edge ---------------------------------------------------------------------
