"""The scripted offline model, served by a real aiohttp server and driven by the official SDKs."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from aiohttp import web

from conftest import TaskMaker
from pytest_hemra.core.errors import SpecError
from pytest_hemra.execute.gateway.replies import respond
from pytest_hemra.execute.gateway.scripted import (
    NO_EDITS,
    SCRIPTED_USAGE,
    EditsStep,
    Script,
    ShellStep,
    TextStep,
    WriteStep,
    default_script,
    load_edits,
    load_script,
    scripted_usage,
    whole_files,
)
from pytest_hemra.execute.gateway.usage import UsageReader, is_streaming
from pytest_hemra.execute.gateway.wire import CallUsage as Usage
from pytest_hemra.execute.gateway.wire import Wire, wire_of
from pytest_hemra.resolve.datasets import bundled_dir, load_task, task_dirs
from pytest_hemra.resolve.harness_spec import HarnessSpec
from pytest_hemra.run.turn import script_for

COMMAND = "echo hi > hello.txt"
SCRIPTS: dict[str, Script] = {
    "solve": default_script(COMMAND),
    "write": (WriteStep("notes/hello.txt", "hi\nthere 'quoted' $HOME\n"), TextStep("Wrote it.")),
    "refuse": (TextStep("I will not do that.", is_refusal=True),),
    "edits": (
        EditsStep((WriteStep("hello.txt", "hi\n"), WriteStep("pkg/empty.py", "")), "Two files."),
    ),
}
USER = {"role": "user", "content": "Write hi to hello.txt."}

# Tools as the real harnesses declare them (schemas trimmed to what matters)
CLAUDE_CODE_TOOLS = [
    {
        "name": "Bash",
        "description": "Run a command",
        "input_schema": {
            "type": "object",
            "properties": {
                "command": {"type": "string"},
                "timeout": {"type": "number", "maximum": 600000},
                "description": {"type": "string"},
            },
            "required": ["command"],
        },
    },
    {
        "name": "Write",
        "description": "Write a file",
        "input_schema": {
            "type": "object",
            "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["file_path", "content"],
        },
    },
]
ACP_TOOLS = [
    {
        "name": "mcp__acp__Bash",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}},
            "required": ["command", "timeout"],
        },
    },
    {
        "name": "mcp__acp__Write",
        "input_schema": {
            "type": "object",
            "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["file_path", "content"],
        },
    },
]
PI_SCHEMA_BASH = {
    "type": "object",
    "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}},
    "required": ["command"],
}
PI_SCHEMA_WRITE = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
    "required": ["path", "content"],
}
PI_ANTHROPIC_TOOLS = [
    {"name": "bash", "input_schema": PI_SCHEMA_BASH},
    {"name": "write", "input_schema": PI_SCHEMA_WRITE},
]
PI_CHAT_TOOLS = [
    {"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "bash", "parameters": PI_SCHEMA_BASH}},
    {"type": "function", "function": {"name": "write", "parameters": PI_SCHEMA_WRITE}},
]
CODEX_TOOLS = [
    {
        "type": "function",
        "name": "exec_command",
        "parameters": {
            "type": "object",
            "properties": {
                "cmd": {"type": "string"},
                "workdir": {"type": "string"},
                "yield_time_ms": {"type": "number"},
            },
            "required": ["cmd"],
        },
    },
    {"type": "function", "name": "update_plan", "parameters": {"type": "object"}},
]
CODEX_ADDITIONAL_TOOLS = {
    "type": "additional_tools",
    "role": "developer",
    "tools": [
        {
            "type": "namespace",
            "name": "functions",
            "description": "",
            "tools": [
                {
                    "type": "custom",
                    "name": "exec",
                    "description": "Run JavaScript code",
                    "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"},
                },
                {
                    "type": "function",
                    "name": "wait",
                    "parameters": {"type": "object", "properties": {"cell_id": {"type": "string"}}},
                },
            ],
        }
    ],
}


async def handle(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    script = SCRIPTS[request.match_info["script"]]
    return await respond(request, wire_of(request.path), body, script)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """`http://127.0.0.1:<port>`: script `name` answers under `/<name>/v1/...`."""
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/{script}/{path:.*}", handle)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def claude(server: str, script: str = "solve") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=f"{server}/{script}", api_key="dummy", max_retries=0)


def gpt(server: str, script: str = "solve") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/{script}/v1", api_key="dummy", max_retries=0)


def post(server: str, path: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
    """A raw call: (status, content type, body bytes exactly as sent)."""
    request = urllib.request.Request(
        server + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Content-Type", ""), error.read()


def sse_events(raw: bytes) -> list[dict[str, Any]]:
    events = []
    for line in raw.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            events.append(json.loads(line[6:]))
    return events


def usage_read(
    wire: Wire, body: dict[str, Any], content_type: str, raw: bytes
) -> list[Usage | None]:
    """What the gateway would count, fed whole and one byte at a time."""
    results = []
    for size in (len(raw), 1):
        reader = UsageReader(wire, is_streaming(wire, body, content_type))
        for start in range(0, len(raw), size):
            reader.feed(raw[start : start + size])
        results.append(reader.result())
    return results


# ---- Anthropic Messages -------------------------------------------------------------------------


def test_anthropic_plays_the_shell_step_then_the_text_then_done(server: str) -> None:
    client = claude(server)
    first = client.messages.create(
        model="any-model", max_tokens=100, messages=[USER], tools=CLAUDE_CODE_TOOLS
    )
    (call,) = first.content
    assert call.type == "tool_use"
    assert (call.name, call.input) == ("Bash", {"command": COMMAND, "timeout": 600000})
    assert first.stop_reason == "tool_use"
    assert first.model == "hemra/scripted"
    usage = first.usage
    assert (usage.input_tokens, usage.output_tokens) == (100, 50)
    assert (usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == (20, 10)

    result = {"type": "tool_result", "tool_use_id": call.id, "content": "ok"}
    history = [
        USER,
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [result]},
    ]
    second = client.messages.create(
        model="any-model", max_tokens=100, messages=history, tools=CLAUDE_CODE_TOOLS
    )
    assert second.content[0].type == "text"
    assert second.content[0].text == "Done: ran the solution."
    assert second.stop_reason == "end_turn"

    history += [{"role": "assistant", "content": second.content}, USER]
    third = client.messages.create(
        model="m", max_tokens=100, messages=history, tools=CLAUDE_CODE_TOOLS
    )
    assert third.content[0].type == "text"
    assert third.content[0].text == "Done."


def test_anthropic_stream_is_the_full_event_sequence_the_sdk_assembles(server: str) -> None:
    client = claude(server)
    with client.messages.stream(
        model="m", max_tokens=100, messages=[USER], tools=CLAUDE_CODE_TOOLS
    ) as stream:
        kinds = [event.type for event in stream]
        message = stream.get_final_message()
    assert kinds[0] == "message_start"
    assert "content_block_stop" in kinds and "message_delta" in kinds
    assert kinds[-1] == "message_stop"
    (call,) = message.content
    assert call.type == "tool_use" and call.name == "Bash"
    assert call.input == {"command": COMMAND, "timeout": 600000}
    assert message.stop_reason == "tool_use"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (100, 50)

    result = {"type": "tool_result", "tool_use_id": call.id, "content": "ok"}
    history = [
        USER,
        {"role": "assistant", "content": message.content},
        {"role": "user", "content": [result]},
    ]
    with client.messages.stream(model="m", max_tokens=100, messages=history) as stream:
        assert "".join(stream.text_stream) == "Done: ran the solution."
        assert stream.get_final_message().stop_reason == "end_turn"


def test_anthropic_raw_sse_events_are_written_one_by_one_in_order(server: str) -> None:
    body = {
        "model": "m",
        "max_tokens": 9,
        "stream": True,
        "messages": [USER],
        "tools": CLAUDE_CODE_TOOLS,
    }
    status, content_type, raw = post(server, "/solve/v1/messages?beta=true", body)
    assert status == 200 and content_type.startswith("text/event-stream")
    names = re.findall(r"^event: (\S+)$", raw.decode(), re.MULTILINE)
    assert names == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    events = sse_events(raw)
    assert events[1]["content_block"]["input"] == {}
    assert events[2]["delta"]["type"] == "input_json_delta"
    assert json.loads(events[2]["delta"]["partial_json"])["command"] == COMMAND


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_usage_reads_back_as_scripted_usage(server: str, stream: bool) -> None:
    body = {
        "model": "m",
        "max_tokens": 9,
        "stream": stream,
        "messages": [USER],
        "tools": CLAUDE_CODE_TOOLS,
    }
    _, content_type, raw = post(server, "/solve/v1/messages", body)
    assert usage_read(Wire.ANTHROPIC, body, content_type, raw) == [SCRIPTED_USAGE] * 2
    assert scripted_usage(Wire.ANTHROPIC) == Usage(100, 50, 20, 10, "hemra/scripted")


def test_count_tokens_answers_the_scripted_input_and_is_not_billed(server: str) -> None:
    count = claude(server).messages.count_tokens(model="m", messages=[USER])
    assert count.input_tokens == SCRIPTED_USAGE.input_tokens
    body = {"model": "m", "messages": [USER]}
    _, content_type, raw = post(server, "/solve/v1/messages/count_tokens", body)
    assert usage_read(Wire.COUNT_TOKENS, body, content_type, raw) == [None, None]


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_refusal_stops_with_refusal(server: str, stream: bool) -> None:
    client = claude(server, "refuse")
    if stream:
        with client.messages.stream(model="m", max_tokens=9, messages=[USER]) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(model="m", max_tokens=9, messages=[USER])
    assert message.stop_reason == "refusal"
    assert message.content[0].type == "text"
    assert message.content[0].text == "I will not do that."


def test_acp_tools_get_a_timeout_and_an_absolute_path(server: str) -> None:
    client = claude(server, "write")
    system = (
        "You are Claude Code.\n<env>\nWorking directory: /home/agent/task\nPlatform: linux\n</env>"
    )
    message = client.messages.create(
        model="m", max_tokens=9, system=system, messages=[USER], tools=ACP_TOOLS
    )
    (call,) = message.content
    assert call.type == "tool_use" and call.name == "mcp__acp__Write"
    assert call.input == {
        "file_path": "/home/agent/task/notes/hello.txt",
        "content": "hi\nthere 'quoted' $HOME\n",
    }
    shell = claude(server).messages.create(
        model="m", max_tokens=9, messages=[USER], tools=ACP_TOOLS
    )
    assert shell.content[0].type == "tool_use"
    assert shell.content[0].input == {"command": COMMAND, "timeout": 600000}


def test_pi_over_anthropic_writes_with_its_path_argument(server: str) -> None:
    message = claude(server, "write").messages.create(
        model="m", max_tokens=9, messages=[USER], tools=PI_ANTHROPIC_TOOLS
    )
    (call,) = message.content
    assert call.type == "tool_use" and call.name == "write"
    assert call.input == {"path": "notes/hello.txt", "content": "hi\nthere 'quoted' $HOME\n"}


def test_a_write_without_a_write_tool_goes_through_the_shell_exactly(
    server: str, tmp_path: Path
) -> None:
    message = claude(server, "write").messages.create(
        model="m", max_tokens=9, messages=[USER], tools=CLAUDE_CODE_TOOLS[:1]
    )
    (call,) = message.content
    assert call.type == "tool_use" and call.name == "Bash"
    assert isinstance(call.input, dict)
    subprocess.run(["bash", "-c", call.input["command"]], cwd=tmp_path, check=True, timeout=10)
    assert (tmp_path / "notes" / "hello.txt").read_text() == "hi\nthere 'quoted' $HOME\n"


def test_a_shell_step_without_a_shell_tool_falls_back_to_text(server: str) -> None:
    message = claude(server).messages.create(
        model="m", max_tokens=9, messages=[USER], tools=CLAUDE_CODE_TOOLS[1:]
    )
    assert message.content[0].type == "text"
    assert COMMAND in message.content[0].text
    assert message.stop_reason == "end_turn"


# ---- OpenAI Responses (Codex) -------------------------------------------------------------------


def test_responses_plays_codex_exec_command_then_the_text(server: str) -> None:
    client = gpt(server)
    first = client.responses.create(model="unknown-slug", input=[USER], tools=CODEX_TOOLS)
    (call,) = first.output
    assert call.type == "function_call"
    assert call.name == "exec_command"
    assert json.loads(call.arguments) == {"cmd": COMMAND, "yield_time_ms": 600000}
    assert first.usage is not None
    assert (first.usage.input_tokens, first.usage.output_tokens) == (120, 50)
    assert first.usage.input_tokens_details.cached_tokens == 20

    output = {"type": "function_call_output", "call_id": call.call_id, "output": "ok"}
    history = [USER, call.model_dump(exclude_none=True), output]
    second = client.responses.create(model="unknown-slug", input=history, tools=CODEX_TOOLS)
    assert second.output_text == "Done: ran the solution."


def test_responses_stream_is_the_full_event_sequence_the_sdk_assembles(server: str) -> None:
    client = gpt(server)
    with client.responses.stream(model="m", input=[USER], tools=CODEX_TOOLS) as stream:
        kinds = [event.type for event in stream]
        response = stream.get_final_response()
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    (call,) = response.output
    assert call.type == "function_call" and call.name == "exec_command"
    assert json.loads(call.arguments)["cmd"] == COMMAND

    output = {"type": "function_call_output", "call_id": call.call_id, "output": "ok"}
    history = [USER, call.model_dump(exclude_none=True), output]
    with client.responses.stream(model="m", input=history, tools=CODEX_TOOLS) as stream:
        kinds = [event.type for event in stream]
        assert stream.get_final_response().output_text == "Done: ran the solution."
    assert kinds[2:7] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
    ]


def test_codex_argv_shell_gets_bash_lc_and_a_required_workdir(server: str) -> None:
    shell = {
        "type": "function",
        "name": "shell",
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "array", "items": {"type": "string"}},
                "workdir": {"type": "string"},
                "timeout_ms": {"type": "number"},
            },
            "required": ["command", "workdir"],
        },
    }
    context = "<environment_context>\n  <cwd>/app</cwd>\n</environment_context>"
    response = gpt(server).responses.create(
        model="m", input=[{"role": "user", "content": context}, USER], tools=[shell]
    )
    (call,) = response.output
    assert call.type == "function_call"
    assert json.loads(call.arguments) == {
        "command": ["bash", "-lc", COMMAND],
        "timeout_ms": 600000,
        "workdir": "/app",
    }


def test_codex_additional_tools_get_a_javascript_exec_call(server: str) -> None:
    body = {
        "model": "gpt-5.5",
        "stream": True,
        "tools": [],
        "input": [CODEX_ADDITIONAL_TOOLS, {"type": "message", "role": "user", "content": "go"}],
    }
    status, content_type, raw = post(server, "/solve/v1/responses", body)
    assert status == 200 and content_type.startswith("text/event-stream")
    events = sse_events(raw)
    assert [event["type"] for event in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        "response.output_item.done",
        "response.completed",
    ]
    item = events[-2]["item"]
    assert (item["type"], item["name"]) == ("custom_tool_call", "exec")
    assert "namespace" not in item  # `functions` is Codex's reserved, unnamed namespace
    found = re.fullmatch(r"await tools\.exec_command\(\{cmd: (\".*\")\}\);", item["input"])
    assert found is not None and json.loads(found.group(1)) == COMMAND
    assert events[-1]["response"]["output"] == [item]
    assert [event["sequence_number"] for event in events] == list(range(len(events)))

    body["input"] += [
        {
            "type": "custom_tool_call",
            "call_id": item["call_id"],
            "name": "exec",
            "input": item["input"],
        },
        {"type": "custom_tool_call_output", "call_id": item["call_id"], "output": "ok"},
    ]
    _, _, raw = post(server, "/solve/v1/responses", body)
    final = sse_events(raw)[-1]["response"]["output"][0]
    assert final["type"] == "message"
    assert final["content"][0]["text"] == "Done: ran the solution."


def test_codex_known_slug_output_keeps_a_non_reserved_namespace(server: str) -> None:
    tools = [{"type": "namespace", "name": "mcp__box__", "tools": CODEX_TOOLS[:1]}]
    body = {"model": "m", "input": [{"type": "additional_tools", "tools": tools}, USER]}
    _, _, raw = post(server, "/solve/v1/responses", body)
    (item,) = json.loads(raw)["output"]
    assert (item["type"], item["name"], item["namespace"]) == (
        "function_call",
        "exec_command",
        "mcp__box__",
    )


@pytest.mark.parametrize("stream", [False, True])
def test_responses_usage_reads_back_with_cached_tokens_moved_out_of_input(
    server: str, stream: bool
) -> None:
    body = {"model": "m", "stream": stream, "input": [USER], "tools": CODEX_TOOLS}
    _, content_type, raw = post(server, "/solve/v1/responses", body)
    expected = Usage(100, 50, 20, 0, "hemra/scripted")
    assert scripted_usage(Wire.RESPONSES) == expected
    assert usage_read(Wire.RESPONSES, body, content_type, raw) == [expected] * 2


def test_responses_refusal_is_plain_text(server: str) -> None:
    response = gpt(server, "refuse").responses.create(model="m", input=[USER])
    assert response.output_text == "I will not do that."


# ---- OpenAI Chat Completions (pi, mini-swe-agent) -----------------------------------------------


def test_chat_plays_pi_bash_then_the_text(server: str) -> None:
    client = gpt(server)
    first = client.chat.completions.create(model="m", messages=[USER], tools=PI_CHAT_TOOLS)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    (call,) = choice.message.tool_calls
    assert call.type == "function"
    assert call.function.name == "bash"
    assert json.loads(call.function.arguments) == {"command": COMMAND, "timeout": 600000}
    assert first.usage is not None
    assert (first.usage.prompt_tokens, first.usage.completion_tokens) == (120, 50)
    assert first.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 20

    history = [
        USER,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "ok"},
    ]
    second = client.chat.completions.create(model="m", messages=history, tools=PI_CHAT_TOOLS)
    assert second.choices[0].message.content == "Done: ran the solution."
    assert second.choices[0].finish_reason == "stop"


def test_chat_stream_is_the_chunk_sequence_pi_accepts(server: str) -> None:
    client = gpt(server)
    chunks = list(
        client.chat.completions.create(
            model="m",
            messages=[USER],
            tools=PI_CHAT_TOOLS,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    first, arguments, finish, usage = chunks
    (named,) = first.choices[0].delta.tool_calls or []
    assert named.function is not None
    assert (named.function.name, named.function.arguments) == ("bash", "")
    assert named.id
    (more,) = arguments.choices[0].delta.tool_calls or []
    assert (
        more.function is not None
        and json.loads(more.function.arguments or "")["command"] == COMMAND
    )
    assert finish.choices[0].finish_reason == "tool_calls"
    assert usage.choices == [] and usage.usage is not None
    assert usage.usage.prompt_tokens == 120

    with client.chat.completions.stream(model="m", messages=[USER], tools=PI_CHAT_TOOLS) as stream:
        completion = stream.get_final_completion()
    (call,) = completion.choices[0].message.tool_calls or []
    assert call.function.name == "bash"
    assert json.loads(call.function.arguments)["command"] == COMMAND


def test_chat_stream_ends_with_done(server: str) -> None:
    body = {"model": "m", "stream": True, "messages": [USER], "tools": PI_CHAT_TOOLS}
    _, content_type, raw = post(server, "/solve/v1/chat/completions", body)
    assert content_type.startswith("text/event-stream")
    assert raw.endswith(b"data: [DONE]\n\n")
    assert b"event:" not in raw


@pytest.mark.parametrize("stream", [False, True])
def test_chat_usage_reads_back_with_cached_tokens_moved_out_of_input(
    server: str, stream: bool
) -> None:
    body = {"model": "m", "stream": stream, "messages": [USER], "tools": PI_CHAT_TOOLS}
    if stream:  # as OpenAI, a stream carries usage when asked (the gateway always asks)
        body["stream_options"] = {"include_usage": True}
    _, content_type, raw = post(server, "/solve/v1/chat/completions", body)
    expected = Usage(100, 50, 20, 0, "hemra/scripted")
    assert scripted_usage(Wire.CHAT) == expected
    assert usage_read(Wire.CHAT, body, content_type, raw) == [expected] * 2


def test_a_chat_stream_carries_usage_only_when_asked_as_openais_does(server: str) -> None:
    body = {"model": "m", "stream": True, "messages": [USER], "tools": PI_CHAT_TOOLS}
    _, _, raw = post(server, "/solve/v1/chat/completions", body)
    assert b"usage" not in raw and raw.endswith(b"data: [DONE]\n\n")
    asked = {**body, "stream_options": {"include_usage": True}}
    _, _, raw = post(server, "/solve/v1/chat/completions", asked)
    chunks = [json.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: {")]
    assert all(chunk["usage"] is None for chunk in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] == 120


@pytest.mark.parametrize("stream", [False, True])
def test_chat_refusal_is_plain_text(server: str, stream: bool) -> None:
    client = gpt(server, "refuse")
    if stream:
        with client.chat.completions.stream(model="m", messages=[USER]) as events:
            completion = events.get_final_completion()
    else:
        completion = client.chat.completions.create(model="m", messages=[USER])
    assert completion.choices[0].message.content == "I will not do that."


def test_other_paths_are_not_answered(server: str) -> None:
    status, _, raw = post(server, "/solve/v1/embeddings", {"input": "x"})
    assert status == 404
    assert "does not answer" in json.loads(raw)["error"]["message"]


# ---- edit formats (aider) ----------------------------------------------------------------------

# aider's whole-format prompt: a system message, then example exchanges, then the instruction
AIDER_MESSAGES = [
    {"role": "system", "content": "Act as an expert software developer."},
    {"role": "user", "content": "Change the greeting to be more casual"},
    {"role": "assistant", "content": "Ok, I will:\n\nshow_greeting.py\n```\nprint('Hey')\n```\n"},
    {"role": "user", "content": "I switched to a new code base."},
    {"role": "assistant", "content": "Ok."},
    USER,
]
WHOLE_REPLY = "Two files.\n\nhello.txt\n```\nhi\n```\n\npkg/empty.py\n```\n```\n"


def test_whole_files_is_the_text_then_each_path_and_its_content_fenced() -> None:
    assert whole_files(SCRIPTS["edits"][0]) == WHOLE_REPLY  # type: ignore[arg-type]
    assert whole_files(EditsStep((), "Nothing to change.")) == "Nothing to change.\n"


@pytest.mark.parametrize("stream", [False, True])
def test_chat_plays_aider_every_edit_in_one_text_reply_despite_its_example_turns(
    server: str, stream: bool
) -> None:
    client = gpt(server, "edits")
    if stream:
        with client.chat.completions.stream(model="m", messages=AIDER_MESSAGES) as events:
            completion = events.get_final_completion()
    else:
        completion = client.chat.completions.create(model="m", messages=AIDER_MESSAGES)
    assert completion.choices[0].message.content == WHOLE_REPLY
    assert completion.choices[0].finish_reason == "stop"


def test_once_the_edits_are_in_the_conversation_the_model_is_done(server: str) -> None:
    history = [
        *AIDER_MESSAGES,
        {"role": "assistant", "content": WHOLE_REPLY},
        {"role": "user", "content": "Fix the lint errors."},
    ]
    completion = gpt(server, "edits").chat.completions.create(model="m", messages=history)
    assert completion.choices[0].message.content == "Done."


def test_an_edits_file_becomes_one_step_with_every_write_and_the_text(tmp_path: Path) -> None:
    path = tmp_path / "edits.toml"
    path.write_text(
        "[[step]]\nkind = 'write'\npath = 'a.py'\ncontent = \"x = 1\\n\"\n"
        "[[step]]\nkind = 'text'\ntext = 'Set x.'\n"
        "[[step]]\nkind = 'write'\npath = 'b/c.txt'\ncontent = ''\n"
    )
    assert load_edits(path) == (
        EditsStep((WriteStep("a.py", "x = 1\n"), WriteStep("b/c.txt", "")), "Set x."),
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "[[step]]\nkind = 'shell'\ncommand = 'ls'\n",
            "key 'step[0].kind': an edit-format harness runs no commands and refuses nothing "
            "(expected 'write' or 'text', got 'shell')",
        ),
        ("[[step]]\nkind = 'refusal'\ntext = 'No.'\n", "got 'refusal'"),
        (
            "[[step]]\nkind = 'write'\npath = 'a'\ncontent = 'no newline'\n",
            "key 'step[0].content': expected a final newline",
        ),
        (
            "[[step]]\nkind = 'write'\npath = 'a.md'\ncontent = \"```\\nx\\n```\\n\"\n",
            "key 'step[0].content': a line starts with ```",
        ),
    ],
)
def test_edits_a_whole_file_block_cannot_carry_are_refused(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "edits.toml"
    path.write_text(text)
    with pytest.raises(SpecError) as raised:
        load_edits(path)
    assert str(raised.value).startswith(f"{path}: ")
    assert message in str(raised.value)


def test_an_edit_format_harness_gets_the_tasks_edits_or_a_reply_without_any(
    make_task: TaskMaker,
) -> None:
    aider = HarnessSpec(kind="cli", command=["aider"], edit_format="whole")
    shell = HarnessSpec(kind="cli", command=["pi"])
    folder = make_task("with-edits")
    (folder / "solution" / "edits.toml").write_text(
        "[[step]]\nkind = 'write'\npath = 'out.txt'\ncontent = \"hi\\n\"\n"
    )
    task = load_task(folder)
    assert script_for(task, aider) == (EditsStep((WriteStep("out.txt", "hi\n"),), ""),)
    assert script_for(task, shell) == default_script("echo hi > /app/out.txt\n")
    assert script_for(load_task(make_task("without")), aider) == (NO_EDITS,)


def test_every_bundled_offline_task_has_edits_for_an_edit_format_harness() -> None:
    for folder in task_dirs(bundled_dir("datasets") / "hemra-offline"):
        (step,) = load_edits(folder / "solution" / "edits.toml")
        assert isinstance(step, EditsStep) and step.writes and step.text, folder.name


# ---- scripts ------------------------------------------------------------------------------------


def test_a_transcript_file_loads_every_kind_of_step(tmp_path: Path) -> None:
    path = tmp_path / "script.toml"
    path.write_text(
        """
[[step]]
kind = "shell"
command = "bash /solution/solve.sh"

[[step]]
kind = "write"
path = "/app/out.txt"
content = "hi\\n"

[[step]]
kind = "refusal"
text = "No."

[[step]]
kind = "text"
text = "Done."
"""
    )
    assert load_script(path) == (
        ShellStep("bash /solution/solve.sh"),
        WriteStep("/app/out.txt", "hi\n"),
        TextStep("No.", is_refusal=True),
        TextStep("Done."),
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "key 'step' is required"),
        ("steps = 1\n", "key 'steps' is not a script setting"),
        ("step = 'x'\n", "key 'step': expected [[step]] tables"),
        ("[[step]]\ncommand = 'ls'\n", "key 'step[0].kind' is required"),
        (
            "[[step]]\nkind = 'bash'\n",
            "key 'step[0].kind': expected one of 'shell', 'write', 'text', 'refusal', got 'bash'",
        ),
        (
            "[[step]]\nkind = 'text'\ntext = 'a'\n[[step]]\nkind = 'shell'\n",
            "key 'step[1].command' is required",
        ),
        (
            "[[step]]\nkind = 'shell'\ncomand = 'ls'\n",
            "key 'step[0].comand' is not a shell step setting (did you mean 'step[0].command'?)",
        ),
        (
            "[[step]]\nkind = 'write'\npath = 'a'\ncontent = 3\n",
            "key 'step[0].content': expected a string, got 3",
        ),
        ("[[step]\n", "not valid TOML"),
    ],
)
def test_a_malformed_transcript_names_the_file_and_the_key(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "script.toml"
    path.write_text(text)
    with pytest.raises(SpecError) as raised:
        load_script(path)
    assert str(raised.value).startswith(f"{path}: ")
    assert message in str(raised.value)


def test_a_missing_transcript_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="file not found"):
        load_script(tmp_path / "absent.toml")
