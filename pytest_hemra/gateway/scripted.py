"""The scripted offline model: a provider the gateway answers in-process, with no network.

Real harness CLIs (Claude Code, Codex, pi, mini-swe-agent) "solve" a task offline by replaying a
script: run a command through the harness's own shell tool, write a file through its write tool,
then say they are done. The model is stateless: the step it plays is the number of assistant turns
already in the request. Its event sequences are the full ones the real CLIs were measured to accept
(a shorter one can make a CLI drop the tool call and retry, or exit 0 having done nothing), and
every response reports the same documented `SCRIPTED_USAGE`.
"""

from __future__ import annotations

import difflib
import itertools
import json
import re
import shlex
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

from aiohttp import web

from pytest_hemra.errors import SpecError
from pytest_hemra.gateway.wire import Usage, Wire
from pytest_hemra.spec import read_toml


@dataclass(frozen=True)
class ShellStep:
    """Run a shell command through the harness's shell tool."""

    command: str


@dataclass(frozen=True)
class WriteStep:
    """Write a file through the harness's write tool (or its shell, when it has no write tool)."""

    path: str
    content: str


@dataclass(frozen=True)
class TextStep:
    """A text-only reply, which ends the agent's turn; a refusal is answered as providers do."""

    text: str
    is_refusal: bool = False


Step = ShellStep | WriteStep | TextStep
Script = tuple[Step, ...]

MODEL = "hemra/scripted"
# Every scripted response reports these. Anthropic carries them as they are. OpenAI wires have no
# cache writes (reported 0) and count cached input inside the input: `input_tokens`/`prompt_tokens`
# 120 of which `cached_tokens` 20, which the gateway normalizes back to input 100 + cache read 20.
SCRIPTED_USAGE = Usage(
    input_tokens=100, output_tokens=50, cache_read_tokens=20, cache_write_tokens=10, model=MODEL
)
FINAL_STEP = TextStep("Done.")
SHELL_TIME_LIMIT_MS = 600_000  # asked of shell tools that take a time limit (Claude Code's maximum)
TIME_LIMIT_KEYS = ("timeout", "timeout_ms", "yield_time_ms")
SHELL_TOOL_NAMES = ("bash", "exec_command", "shell_command", "shell")
WRITE_TOOL_NAMES = ("write", "write_file", "create_file")
CODE_TOOL_NAME = "exec"  # Codex's freeform tool taking JavaScript that calls `tools.exec_command`
RESERVED_NAMESPACE = "functions"  # Codex's plain tools: calls to them name no namespace
ASSISTANT_ITEM_TYPES = frozenset({"function_call", "custom_tool_call", "local_shell_call"})
WORKING_DIRECTORY = re.compile(r'(?:<cwd>|[Ww]orking directory: )([^\s<"\\]+)')
STEP_KEYS = {
    "shell": ("command",),
    "write": ("path", "content"),
    "text": ("text",),
    "refusal": ("text",),
}


def scripted_usage(wire: Wire) -> Usage:
    """`SCRIPTED_USAGE` as read back from `wire`'s responses: OpenAI wires have no cache writes."""
    if wire in (Wire.RESPONSES, Wire.CHAT):
        return replace(SCRIPTED_USAGE, cache_write_tokens=0)
    return SCRIPTED_USAGE


def default_script(solve_sh: str) -> Script:
    """Run the task's solution, then say so: the oracle's work, done through a real harness."""
    return (ShellStep(solve_sh), TextStep("Done: ran the solution."))


def load_script(path: Path) -> Script:
    """Read a transcript file: `[[step]]` tables with `kind` = shell, write, text or refusal."""
    data = read_toml(path)
    unknown = sorted(set(data) - {"step"})
    if unknown:
        raise SpecError(f"{path}: key '{unknown[0]}' is not a script setting (expected [[step]])")
    steps = data.get("step")
    if not steps:
        raise SpecError(f"{path}: key 'step' is required (one [[step]] table per reply)")
    if not isinstance(steps, list) or not all(isinstance(step, dict) for step in steps):
        raise SpecError(f"{path}: key 'step': expected [[step]] tables")
    return tuple(_parse_step(path, index, step) for index, step in enumerate(steps))


def _parse_step(path: Path, index: int, table: dict[str, Any]) -> Step:
    where = f"step[{index}]"
    kind = table.get("kind")
    if kind is None:
        raise SpecError(f"{path}: key '{where}.kind' is required")
    if kind not in STEP_KEYS:
        kinds = ", ".join(f"'{name}'" for name in STEP_KEYS)
        raise SpecError(f"{path}: key '{where}.kind': expected one of {kinds}, got {kind!r}")
    allowed = STEP_KEYS[kind]
    for key, value in table.items():
        if key == "kind":
            continue
        if key not in allowed:
            hint = difflib.get_close_matches(key, allowed, n=1)
            suggestion = f" (did you mean '{where}.{hint[0]}'?)" if hint else ""
            raise SpecError(f"{path}: key '{where}.{key}' is not a {kind} step setting{suggestion}")
        if not isinstance(value, str):
            raise SpecError(f"{path}: key '{where}.{key}': expected a string, got {value!r}")
    for key in allowed:
        if key not in table:
            raise SpecError(f"{path}: key '{where}.{key}' is required")
    if kind == "shell":
        return ShellStep(table["command"])
    if kind == "write":
        return WriteStep(table["path"], table["content"])
    return TextStep(table["text"], is_refusal=kind == "refusal")


# ---- which step, and which tool call it becomes -------------------------------------------------


@dataclass(frozen=True)
class Tool:
    """A tool the harness offers, as much of it as a script needs."""

    name: str
    properties: dict[str, Any]  # its JSON schema's properties
    required: frozenset[str] = frozenset()
    namespace: str | None = None
    is_freeform: bool = False  # a Responses `custom` tool: raw text input, not JSON arguments


@dataclass(frozen=True)
class ToolCall:
    """A reply that calls `tool`: `arguments` is JSON for a function tool, raw text if freeform."""

    tool: Tool
    arguments: str


Reply = ToolCall | TextStep


def next_step(wire: Wire, body: dict[str, Any], script: Script) -> Step:
    """The step to play: one per assistant turn already in the request, then `FINAL_STEP`."""
    played = _played_turns(wire, body)
    return script[played] if played < len(script) else FINAL_STEP


def _played_turns(wire: Wire, body: dict[str, Any]) -> int:
    if wire is not Wire.RESPONSES:
        return sum(
            1 for message in _dicts(body.get("messages")) if message.get("role") == "assistant"
        )
    # Responses history is flat items: a run of consecutive assistant items is one turn
    turns, is_in_turn = 0, False
    for item in _dicts(body.get("input")):
        is_assistant = item.get("type") in ASSISTANT_ITEM_TYPES or item.get("role") == "assistant"
        if is_assistant and not is_in_turn:
            turns += 1
        is_in_turn = is_assistant
    return turns


def offered_tools(wire: Wire, body: dict[str, Any]) -> list[Tool]:
    """The tools a request offers, from wherever its wire (or Codex) declares them."""
    if wire is Wire.ANTHROPIC:
        return [
            _function_tool(tool.get("name"), tool.get("input_schema"), None)
            for tool in _dicts(body.get("tools"))
            if isinstance(tool.get("name"), str)
        ]
    if wire is Wire.CHAT:
        functions = [_dict(tool.get("function")) for tool in _dicts(body.get("tools"))]
        return [
            _function_tool(function.get("name"), function.get("parameters"), None)
            for function in functions
            if isinstance(function.get("name"), str)
        ]
    if wire is Wire.RESPONSES:
        declared = _dicts(body.get("tools"))
        for item in _dicts(body.get("input")):
            if item.get("type") == "additional_tools":  # Codex with a model slug it knows
                declared += _dicts(item.get("tools"))
        return list(_responses_tools(declared, None))
    return []


def _responses_tools(declared: list[dict[str, Any]], namespace: str | None) -> Iterator[Tool]:
    for tool in declared:
        name, kind = tool.get("name"), tool.get("type")
        if kind == "namespace":
            inner = name if isinstance(name, str) else namespace
            yield from _responses_tools(_dicts(tool.get("tools")), inner)
        elif kind == "function" and isinstance(name, str):
            yield _function_tool(name, tool.get("parameters"), namespace)
        elif kind == "custom" and isinstance(name, str):
            yield Tool(name, {}, namespace=namespace, is_freeform=True)


def _function_tool(name: Any, schema: Any, namespace: str | None) -> Tool:
    schema = _dict(schema)
    required = frozenset(key for key in _list(schema.get("required")) if isinstance(key, str))
    return Tool(str(name), _dict(schema.get("properties")), required, namespace)


def plan_reply(step: Step, tools: Sequence[Tool], body: dict[str, Any]) -> Reply:
    """How `step` is played with the tools offered: the shell tool is preferred for commands."""
    if isinstance(step, TextStep):
        return step
    if isinstance(step, WriteStep):
        writer = _write_tool(tools)
        if writer is not None:
            return ToolCall(writer, json.dumps(_write_arguments(writer, step, body)))
        step = ShellStep(_write_command(step))
    shell = _shell_tool(tools)
    if shell is None:
        return TextStep(f"No shell tool was offered to run: {step.command}")
    if shell.is_freeform:
        return ToolCall(shell, f"await tools.exec_command({{cmd: {json.dumps(step.command)}}});")
    return ToolCall(shell, json.dumps(_shell_arguments(shell, step.command, body)))


def _shell_tool(tools: Sequence[Tool]) -> Tool | None:
    for wanted in SHELL_TOOL_NAMES:
        for tool in tools:
            if _base_name(tool) == wanted and not tool.is_freeform and _command_key(tool):
                return tool
    return next((t for t in tools if t.is_freeform and t.name == CODE_TOOL_NAME), None)


def _write_tool(tools: Sequence[Tool]) -> Tool | None:
    for wanted in WRITE_TOOL_NAMES:
        for tool in tools:
            if _base_name(tool) == wanted and _takes_a_file(tool):
                return tool
    return None


def _takes_a_file(tool: Tool) -> bool:
    props = tool.properties
    return not tool.is_freeform and "content" in props and ("file_path" in props or "path" in props)


def _base_name(tool: Tool) -> str:
    """`mcp__acp__Bash` -> `bash`: ACP offers Claude Code's tools through an MCP server."""
    return tool.name.rsplit("__", 1)[-1].lower()


def _command_key(tool: Tool) -> str | None:
    if "command" in tool.properties:
        return "command"
    if "cmd" in tool.properties:
        return "cmd"
    if not tool.properties:  # a schema-less tool: guess from its name
        return "cmd" if _base_name(tool) == "exec_command" else "command"
    return None


def _shell_arguments(tool: Tool, command: str, body: dict[str, Any]) -> dict[str, Any]:
    key = _command_key(tool) or "command"
    is_argv = "array" in _types(tool.properties.get(key))
    arguments: dict[str, Any] = {key: ["bash", "-lc", command] if is_argv else command}
    for name in TIME_LIMIT_KEYS:  # a long solution must not be cut at the tool's default
        if name in tool.properties:
            maximum = _dict(tool.properties[name]).get("maximum")
            if isinstance(maximum, int | float) and not isinstance(maximum, bool):
                arguments[name] = min(SHELL_TIME_LIMIT_MS, int(maximum))
            else:
                arguments[name] = SHELL_TIME_LIMIT_MS
    if "workdir" in tool.required:
        arguments["workdir"] = _working_directory(body) or "."
    return arguments


def _write_arguments(tool: Tool, step: WriteStep, body: dict[str, Any]) -> dict[str, Any]:
    key = "file_path" if "file_path" in tool.properties else "path"
    path = step.path
    if not PurePosixPath(path).is_absolute():  # Claude Code's Write takes absolute paths only
        directory = _working_directory(body)
        path = str(PurePosixPath(directory) / path) if directory else path
    return {key: path, "content": step.content}


def _write_command(step: WriteStep) -> str:
    """A shell command writing exactly `step.content`, for a harness with no write tool."""
    target = shlex.quote(step.path)
    write = f"printf '%s' {shlex.quote(step.content)} > {target}"
    parent = str(PurePosixPath(step.path).parent)
    return write if parent in (".", "/") else f"mkdir -p {shlex.quote(parent)} && {write}"


def _working_directory(body: dict[str, Any]) -> str | None:
    """The harness's working directory as its prompt states it (Claude Code, Codex's `<cwd>`)."""
    found = WORKING_DIRECTORY.search(json.dumps(body))
    return found.group(1) if found else None


def _types(schema: Any) -> list[Any]:
    kind = _dict(schema).get("type")
    return kind if isinstance(kind, list) else [kind]


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
        events = _chat_events(reply)
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


def _chat_events(reply: Reply) -> Iterator[bytes]:
    """Tool name first with empty arguments, then the arguments, then the finish, then usage."""
    head = {
        "id": _new_id("chatcmpl-"),
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": MODEL,
    }

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
        return _sse(None, {**head, "choices": [choice]})

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
    yield _sse(None, {**head, "choices": [], "usage": _chat_usage()})
    yield b"data: [DONE]\n\n"


# ---- plain JSON at the edge ---------------------------------------------------------------------


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [item for item in _list(value) if isinstance(item, dict)]
