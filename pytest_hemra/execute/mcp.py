"""A task's MCP servers (`[[environment.mcp_servers]]`) in the formats harnesses read them:
Claude Code's `--mcp-config` JSON (`{mcp_servers_json}`), Codex's config.toml tables
(`{mcp_servers_toml}`) and ACP's `session/new` list. A harness whose file uses neither
placeholder (and is not an ACP agent) cannot be handed them: the run warns at resolve, naming
it (resolve/plan.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pytest_hemra.resolve.taskconfig import McpServer


def claude_json(servers: Sequence[McpServer]) -> str:
    """`{"mcpServers": {...}}`, as `claude --mcp-config FILE` reads it (empty: no servers)."""
    found: dict[str, Any] = {}
    for server in servers:
        if server.transport == "stdio":
            found[server.name] = {"command": server.command, "args": list(server.args)}
        else:
            kind = "sse" if server.transport == "sse" else "http"
            found[server.name] = {"type": kind, "url": server.url}
    return json.dumps({"mcpServers": found}, indent=1)


def codex_toml(servers: Sequence[McpServer]) -> str:
    """`[mcp_servers.NAME]` tables for Codex's config.toml (strings quoted as JSON does, which
    TOML's basic strings read the same)."""
    lines = []
    for server in servers:
        lines.append(f"[mcp_servers.{server.name}]")
        if server.transport == "stdio":
            lines.append(f"command = {json.dumps(server.command)}")
            lines.append(f"args = {json.dumps(list(server.args))}")
        else:
            lines.append(f"url = {json.dumps(server.url)}")
        lines.append("")
    return "\n".join(lines)


def acp_servers(servers: Sequence[McpServer]) -> list[dict[str, Any]]:
    """ACP's `mcpServers` for `session/new`."""
    found: list[dict[str, Any]] = []
    for server in servers:
        if server.transport == "stdio":
            entry = {"name": server.name, "command": server.command, "args": list(server.args)}
            found.append({**entry, "env": []})
        else:
            kind = "sse" if server.transport == "sse" else "http"
            found.append({"type": kind, "name": server.name, "url": server.url, "headers": []})
    return found
