"""The scripted offline model: a provider the gateway answers in-process, with no network.

Real harness CLIs (Claude Code, Codex, pi, mini-swe-agent) "solve" a task offline by replaying a
script: run a command through the harness's own shell tool, write a file through its write tool,
then say they are done. A harness with no tools (aider) gets every write of the script in one
text reply, in its edit format. The model is stateless: the step it plays is the number of
assistant turns already in the request. Its event sequences are the full ones the real CLIs were
measured to accept (a shorter one can make a CLI drop the tool call and retry, or exit 0 having
done nothing), and every response reports the same documented `SCRIPTED_USAGE`.
"""

from __future__ import annotations

import difflib
import json
import re
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

from pytest_hemra.core.errors import SpecError
from pytest_hemra.execute.gateway.wire import CallUsage, Wire
from pytest_hemra.resolve.validation import read_toml


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


@dataclass(frozen=True)
class EditsStep:
    """Every file write of a script in one text reply, in an edit format: for a harness with no
    tools (aider), which sends one message and applies the edits it finds in the reply."""

    writes: tuple[WriteStep, ...]
    text: str


Step = ShellStep | WriteStep | TextStep | EditsStep
Script = tuple[Step, ...]

MODEL = "hemra/scripted"
# Every scripted response reports these. Anthropic carries them as they are. OpenAI wires have no
# cache writes (reported 0) and count cached input inside the input: `input_tokens`/`prompt_tokens`
# 120 of which `cached_tokens` 20, which the gateway normalizes back to input 100 + cache read 20.
SCRIPTED_USAGE = CallUsage(
    input_tokens=100, output_tokens=50, cache_read_tokens=20, cache_write_tokens=10, model=MODEL
)
FINAL_STEP = TextStep("Done.")
NO_EDITS = TextStep("I have no edits for this task.")
FENCE = "```"
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


def scripted_usage(wire: Wire) -> CallUsage:
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


def load_edits(path: Path) -> Script:
    """Read a task's `solution/edits.toml` (write and text steps, paths relative to /app) as the
    one reply an edit-format harness gets: its text, then every write as a whole file."""
    writes: list[WriteStep] = []
    texts: list[str] = []
    for index, step in enumerate(load_script(path)):
        if isinstance(step, WriteStep):
            _check_whole_content(path, index, step.content)
            writes.append(step)
        elif isinstance(step, TextStep) and not step.is_refusal:
            texts.append(step.text)
        else:
            kind = "refusal" if isinstance(step, TextStep) else "shell"
            raise SpecError(
                f"{path}: key 'step[{index}].kind': an edit-format harness runs no commands "
                f"and refuses nothing (expected 'write' or 'text', got '{kind}')"
            )
    return (EditsStep(tuple(writes), "\n\n".join(texts)),)


def _check_whole_content(path: Path, index: int, content: str) -> None:
    """A whole-file block ends at a line starting with a fence, and its last line ends with a
    newline: content that breaks either cannot be written through the format exactly."""
    if content and not content.endswith("\n"):
        raise SpecError(
            f"{path}: key 'step[{index}].content': expected a final newline "
            "(a whole-file block cannot express a file without one)"
        )
    if any(line.startswith(FENCE) for line in content.splitlines()):
        raise SpecError(
            f"{path}: key 'step[{index}].content': a line starts with {FENCE}, "
            "which would end the whole-file block"
        )


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
    """The step to play: one per assistant turn already in the request, then `FINAL_STEP`.

    An edits step is played until an assistant turn holds it: an edit-format harness's prompt
    opens with example exchanges (aider's few-shot turns), so its turns cannot be counted."""
    if script and isinstance(script[0], EditsStep):
        return FINAL_STEP if whole_files(script[0]) in _assistant_texts(wire, body) else script[0]
    played = _played_turns(wire, body)
    return script[played] if played < len(script) else FINAL_STEP


def _assistant_texts(wire: Wire, body: dict[str, Any]) -> list[str]:
    """The text of each assistant message in the request (its text parts joined)."""
    key = "input" if wire is Wire.RESPONSES else "messages"
    texts = []
    for message in _dicts(body.get(key)):
        if message.get("role") != "assistant":
            continue
        content = message.get("content")
        parts = [content] if isinstance(content, str) else _dicts(content)
        texts.append("".join(p if isinstance(p, str) else str(p.get("text", "")) for p in parts))
    return texts


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
    if isinstance(step, EditsStep):  # its harness offers no tools: the edits are the text
        return TextStep(whole_files(step))
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


def whole_files(step: EditsStep) -> str:
    """aider's `whole` edit format: the explanation, then each file's path on a line of its own
    followed by its full content in a fenced block."""
    blocks = [step.text] if step.text else []
    blocks += [f"{write.path}\n{FENCE}\n{write.content}{FENCE}" for write in step.writes]
    return "\n\n".join(blocks) + "\n"


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


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [item for item in _list(value) if isinstance(item, dict)]
