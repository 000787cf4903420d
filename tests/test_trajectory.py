"""Normalized trajectories from the bodies the gateway kept: one shape for every API."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest

from pytest_hemra.execute.gateway.scripted import ShellStep, TextStep
from pytest_hemra.execute.gateway.server import Gateway
from pytest_hemra.execute.trajectory import build_trajectory
from pytest_hemra.resolve.upstreams import BUILTIN_UPSTREAMS
from pytest_hemra.store import Store

SCRIPT = (ShellStep("echo hi > out.txt"), TextStep("All done."))
SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Gateway]:
    store = Store(tmp_path / "s.db")
    with Gateway(BUILTIN_UPSTREAMS, store.record_call) as running:
        yield running


def two_turns_anthropic(base: str, key: str, stream: bool) -> None:
    client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
    tools = [{"name": "bash", "description": "run", "input_schema": SCHEMA}]
    messages: list[dict[str, object]] = [{"role": "user", "content": "make out.txt"}]
    for _ in range(2):
        request = {
            "model": "hemra/scripted",
            "max_tokens": 100,
            "tools": tools,
            "messages": messages,
            "system": "You are terse.",
        }
        if stream:
            with client.messages.stream(**request) as live:  # type: ignore[arg-type]
                reply = live.get_final_message()
        else:
            reply = client.messages.create(**request)  # type: ignore[arg-type]
        messages.append({"role": "assistant", "content": [b.model_dump() for b in reply.content]})
        uses = [b for b in reply.content if b.type == "tool_use"]
        if uses:
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": uses[0].id, "content": "ok"}
                    ],
                }
            )


def two_turns_chat(base: str, key: str, stream: bool) -> None:
    client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
    tools = [{"type": "function", "function": {"name": "bash", "parameters": SCHEMA}}]
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "make out.txt"},
    ]
    for _ in range(2):
        if stream:
            pieces = list(
                client.chat.completions.create(  # type: ignore[call-overload]
                    model="hemra/scripted", tools=tools, messages=messages, stream=True
                )
            )
            calls = [c for p in pieces if p.choices for c in p.choices[0].delta.tool_calls or []]
            call_id = next((c.id for c in calls if c.id), None)
            name = next((c.function.name for c in calls if c.function and c.function.name), "")
            arguments = "".join(c.function.arguments or "" for c in calls if c.function)
        else:
            message = (
                client.chat.completions.create(  # type: ignore[call-overload]
                    model="hemra/scripted", tools=tools, messages=messages
                )
                .choices[0]
                .message
            )
            call = (message.tool_calls or [None])[0]
            call_id = call.id if call else None
            name = call.function.name if call else ""
            arguments = call.function.arguments if call else ""
        if call_id is None:
            break
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": arguments},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": "ok"})


def two_turns_responses(base: str, key: str, stream: bool) -> None:
    client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
    tools = [{"type": "function", "name": "bash", "parameters": SCHEMA}]
    items: list[object] = [{"role": "user", "content": "make out.txt"}]
    for _ in range(2):
        request = {
            "model": "hemra/scripted",
            "input": items,
            "tools": tools,
            "instructions": "You are terse.",
        }
        if stream:
            with client.responses.stream(**request) as live:  # type: ignore[arg-type]
                response = live.get_final_response()
        else:
            response = client.responses.create(**request)  # type: ignore[arg-type]
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            break
        items += [
            calls[0].model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "ok"},
        ]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("conversation", [two_turns_anthropic, two_turns_chat, two_turns_responses])
def test_every_api_gives_the_same_trajectory(
    gateway: Gateway, tmp_path: Path, conversation: object, stream: bool
) -> None:
    calls_dir = tmp_path / "calls"
    access = gateway.open_trial("r.1", "r", script=SCRIPT, calls_dir=calls_dir)
    conversation(access.base_url("127.0.0.1"), access.token, stream)  # type: ignore[operator]
    gateway.close_trial(access.token)

    trajectory = build_trajectory(calls_dir, gateway.calls(access.token))

    roles = [m["role"] for m in trajectory["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    system, user, tool_turn, result, final = trajectory["messages"]
    assert system["text"] == "You are terse." and user["text"] == "make out.txt"
    (call,) = tool_turn["tool_calls"]
    assert call["name"] == "bash" and "echo hi" in json.loads(call["arguments"])["command"]
    assert result == {"role": "tool", "tool_call_id": call["id"], "output": "ok"}
    assert final["text"] == "All done." and "tool_calls" not in final
    assert trajectory["main_call"] == 2 and len(trajectory["calls"]) == 2
    assert all(c["status"] == 200 and c["output_tokens"] == 50 for c in trajectory["calls"])
