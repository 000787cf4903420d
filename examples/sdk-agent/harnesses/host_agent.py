"""A host-side agent for HEMRA's `sdk` harness kind: a minimal Anthropic Messages tool loop.

HEMRA calls `solve(agent)`. The model is reached through the gateway (`agent.base_url`, with
`agent.api_key` as the key); the one tool, bash, runs in the sandbox through `agent.run`.
Plain urllib keeps it dependency-free; an SDK client works the same way.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

TOOLS = [
    {
        "name": "bash",
        "description": "Run a shell command in the task's working directory",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    }
]


def ask(agent: Any, messages: list[dict[str, Any]]) -> dict[str, Any]:
    body = {
        "model": agent.model or "hemra/scripted",
        "max_tokens": 2048,
        "tools": TOOLS,
        "messages": messages,
    }
    request = urllib.request.Request(
        agent.base_url + "/v1/messages",
        data=json.dumps(body).encode(),
        headers={
            "content-type": "application/json",
            "x-api-key": agent.api_key,
            "anthropic-version": "2023-06-01",
        },
    )
    with urllib.request.urlopen(request, timeout=max(agent.seconds_left, 1)) as response:
        return dict(json.load(response))


def solve(agent: Any) -> str:
    messages: list[dict[str, Any]] = [{"role": "user", "content": agent.instruction}]
    for _ in range(20):
        reply = ask(agent, messages)
        messages.append({"role": "assistant", "content": reply["content"]})
        uses = [block for block in reply["content"] if block["type"] == "tool_use"]
        if not uses:
            return " ".join(b["text"] for b in reply["content"] if b["type"] == "text")
        results = []
        for use in uses:
            done = agent.run(use["input"]["command"])
            output = (done.stdout + done.stderr)[-10_000:] or "(no output)"
            results.append({"type": "tool_result", "tool_use_id": use["id"], "content": output})
        messages.append({"role": "user", "content": results})
    return "gave up after 20 turns"
