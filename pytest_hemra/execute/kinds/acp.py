"""The `acp` harness kind: HEMRA as the client of an Agent Client Protocol agent over stdio.

The agent (e.g. `claude-code-acp`) runs in the sandbox with its stdin open. HEMRA sends
`initialize` (offering file and terminal capabilities), `session/new` (cwd /app) and
`session/prompt` with the task's instruction, and answers the agent's own requests inside the
sandbox: permission requests are granted, `fs/read_text_file` and `fs/write_text_file` read and
write the sandbox's files as the sandbox user (by `head` and `cat` run as that user there, never
by the engine, which acts as root), `terminal/*` run commands there, none past the deadline.
Every message either way is recorded, one JSON object a line, in the trial's `agent/stdout.txt`.
The prompt's answer ends the session; an agent that does not exit on a closed stdin is killed.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pytest_hemra.execute.kinds import AgentTurn, SandboxKind
from pytest_hemra.execute.mcp import acp_servers
from pytest_hemra.execute.output import DEFAULT_OUTPUT_CAP, CappedOutput
from pytest_hemra.execute.sandbox import (
    AGENT_USER,
    WORKDIR,
    ExecResult,
    Sandbox,
    kill_agent_processes,
)

PROTOCOL_VERSION = 1
OUTPUT_LIMIT = 1 << 20
MAX_MESSAGE_BYTES = 64 << 20  # one line of the agent's stdout: longer is recorded cut, not read
# terminals an agent holds at once (not released): each one's output is a scratch file (up to
# the output cap), removed when it is released and when the session ends (the record keeps
# what the agent was shown of it)
MAX_TERMINALS = 64
RESOURCE_NOT_FOUND = -32002  # ACP's error code for a missing file
INTERNAL_ERROR = -32603


class AcpKind(SandboxKind):
    """`command` starts the ACP agent; HEMRA is its client for one prompt, the instruction."""

    def run_agent(self, turn: AgentTurn) -> ExecResult:
        return run_acp(
            turn.sandbox,
            turn.argv,
            turn.env,
            turn.instruction,
            turn.deadline,
            turn.stdout,
            turn.stderr,
            turn.workdir,
            turn.user,
            acp_servers(turn.mcp_servers),
        )


class Interactive(Protocol):
    def send(self, data: bytes) -> None: ...
    def close_stdin(self) -> None: ...
    def frames(self) -> Any: ...
    def close(self) -> None: ...


@dataclass
class Terminal:
    stdout: Path
    thread: threading.Thread
    result: list[ExecResult] = field(default_factory=list)
    released: bool = False


class AcpClient:
    """One ACP session with one agent, answering its requests in the sandbox."""

    def __init__(
        self,
        sandbox: Sandbox,
        process: Interactive,
        env: Mapping[str, str],
        log: Path,
        scratch: Path,
        user: str = AGENT_USER,
        errors: Path | None = None,
    ) -> None:
        self.sandbox, self.process, self.env = sandbox, process, dict(env)
        self.user = user  # the agent's: its file operations and terminals run as it
        self.log, self.scratch = log, scratch
        # the session's record and the agent's stderr, each up to the sandbox's output cap
        cap = int(getattr(sandbox, "output_cap", DEFAULT_OUTPUT_CAP))
        self.record = CappedOutput(log, cap)
        self.stderr = CappedOutput(errors or log.parent / "stderr.txt", cap)
        self._recording = threading.Lock()
        self.incoming: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.terminals: dict[str, Terminal] = {}
        self.next_id = 0
        self.deadline = float("inf")

    def pump(self) -> None:
        """Read the agent's stdout into messages (one JSON-RPC message a line)."""
        buffer = b""
        try:
            for stream, data in self.process.frames():
                if stream == 2:
                    self.stderr.write(data)
                    continue
                buffer += data
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        try:
                            self.incoming.put(json.loads(line))
                        except ValueError:
                            self._record({"unparsed": line.decode(errors="replace")})
                if len(buffer) > MAX_MESSAGE_BYTES:  # no line end in sight: not a message
                    self._record({"unparsed": buffer[:OUTPUT_LIMIT].decode(errors="replace")})
                    buffer = b""
        finally:
            self.incoming.put(None)

    def _record(self, message: dict[str, Any], direction: str = "agent") -> None:
        line = json.dumps({"from": direction, **message}) + "\n"
        with self._recording:
            self.record.write(line.encode())

    def _send(self, message: dict[str, Any]) -> None:
        self._record(message, "hemra")
        self.process.send((json.dumps(message) + "\n").encode())

    def call(self, method: str, params: dict[str, Any], deadline: float) -> dict[str, Any]:
        """Send a request and serve the agent's requests until its answer comes."""
        self.next_id += 1
        wanted = self.next_id
        self.deadline = deadline
        self._send({"jsonrpc": "2.0", "id": wanted, "method": method, "params": params})
        while True:
            try:
                message = self.incoming.get(timeout=max(deadline - time.time(), 0.01))
            except queue.Empty:
                raise TimeoutError(method) from None
            if message is None:
                raise EOFError(f"the agent closed its output during {method}")
            self._record(message)
            if "method" in message and "id" in message:
                self._answer(message)
            elif message.get("id") == wanted:
                if "error" in message:
                    raise RuntimeError(f"{method} failed: {message['error']}")
                return dict(message.get("result") or {})

    def _answer(self, request: dict[str, Any]) -> None:
        method, params = request["method"], request.get("params") or {}
        try:
            result = self._handle(method, params)
            reply: dict[str, Any] = {"jsonrpc": "2.0", "id": request["id"], "result": result}
        except TimeoutError:
            raise
        except Exception as error:  # the agent gets an error answer, as from any client
            code = RESOURCE_NOT_FOUND if isinstance(error, FileNotFoundError) else INTERNAL_ERROR
            reply = {
                "jsonrpc": "2.0",
                "id": request["id"],
                "error": {"code": code, "message": f"{type(error).__name__}: {error}"},
            }
        self._send(reply)

    def _handle(self, method: str, params: dict[str, Any]) -> Any:
        if method == "session/request_permission":
            options = params.get("options") or []
            allow = [o for o in options if str(o.get("kind", "")).startswith("allow")]
            chosen = (allow or options)[0]["optionId"]
            return {"outcome": {"outcome": "selected", "optionId": chosen}}
        if method == "fs/read_text_file":
            text = self.sandbox.read_file(str(params["path"]), user=self.user)
            lines = text.decode(errors="replace").splitlines(keepends=True)
            start = max(int(params.get("line") or 1) - 1, 0)
            limit = params.get("limit")
            return {"content": "".join(lines[start : start + limit if limit else None])}
        if method == "fs/write_text_file":
            content = str(params["content"]).encode()
            self.sandbox.write_file(str(params["path"]), content, user=self.user)
            return {}
        if method == "terminal/create":
            return {"terminalId": self._create_terminal(params)}
        if method == "terminal/output":
            terminal = self.terminals[params["terminalId"]]
            output = (
                terminal.stdout.read_bytes()[-OUTPUT_LIMIT:] if terminal.stdout.exists() else b""
            )
            status = self._exit_status(terminal) if terminal.result else None
            return {
                "output": output.decode(errors="replace"),
                "truncated": False,
                **({"exitStatus": status} if status else {}),
            }
        if method == "terminal/wait_for_exit":
            terminal = self.terminals[params["terminalId"]]
            terminal.thread.join(max(self.deadline - time.time(), 0.0))
            if terminal.thread.is_alive():  # the deadline ends the session, not the command
                raise TimeoutError(method)
            return self._exit_status(terminal)
        if method == "terminal/release":
            terminal = self.terminals[params["terminalId"]]
            terminal.released = True
            if not terminal.thread.is_alive():
                terminal.stdout.unlink(missing_ok=True)
            return {}
        if method == "terminal/kill":
            return {}
        raise NotImplementedError(f"HEMRA does not answer {method}")

    def _create_terminal(self, params: dict[str, Any]) -> str:
        if sum(not terminal.released for terminal in self.terminals.values()) >= MAX_TERMINALS:
            raise RuntimeError(f"more than {MAX_TERMINALS} terminals held at once")
        name = f"term-{len(self.terminals) + 1}"
        args = [str(a) for a in params.get("args") or []]
        # a command without args is a command line (claude-code-acp sends whole scripts)
        argv = [str(params["command"]), *args] if args else ["bash", "-c", str(params["command"])]
        env = {**self.env, **{e["name"]: e["value"] for e in params.get("env") or []}}
        out = self.scratch / f"{name}.out"
        terminal = Terminal(out, threading.Thread(daemon=True))
        timeout = max(self.deadline - time.time(), 0.001)

        def run() -> None:
            terminal.result.append(
                self.sandbox.exec(
                    argv,
                    user=self.user,
                    env=env,
                    timeout=min(float(params.get("timeout") or 600), timeout),
                    stdout=out,
                    stderr=out,
                    workdir=str(params.get("cwd") or WORKDIR),
                )
            )

        terminal.thread = threading.Thread(target=run, daemon=True, name=f"hemra-acp-{name}")
        terminal.thread.start()
        self.terminals[name] = terminal
        return name

    @staticmethod
    def _exit_status(terminal: Terminal) -> dict[str, Any]:
        result = terminal.result[0]
        return {"exitCode": result.exit_code, "signal": "SIGKILL" if result.timed_out else None}


def run_acp(
    sandbox: Sandbox,
    argv: Sequence[str],
    env: Mapping[str, str],
    instruction: str,
    deadline: float,
    stdout: Path,
    stderr: Path,
    workdir: str = WORKDIR,
    user: str = AGENT_USER,
    mcp_servers: Sequence[Mapping[str, Any]] = (),
) -> ExecResult:
    """One ACP session, start to the prompt's answer, within the deadline; `workdir` is the
    session's working folder."""
    started = time.monotonic()
    scratch = stdout.parent / "acp"
    scratch.mkdir(exist_ok=True)
    process = sandbox.start_interactive(argv, user=user, env=env, workdir=workdir)
    client = AcpClient(sandbox, process, env, stdout, scratch, user, stderr)
    reader = threading.Thread(target=client.pump, daemon=True, name="hemra-acp-reader")
    reader.start()
    exit_code: int | None = 0
    timed_out = False
    try:
        client.call(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "clientCapabilities": {
                    "fs": {"readTextFile": True, "writeTextFile": True},
                    "terminal": True,
                },
            },
            deadline,
        )
        session = client.call(
            "session/new", {"cwd": workdir, "mcpServers": list(mcp_servers)}, deadline
        )
        answer = client.call(
            "session/prompt",
            {
                "sessionId": session["sessionId"],
                "prompt": [{"type": "text", "text": instruction}],
            },
            deadline,
        )
        if answer.get("stopReason") not in ("end_turn", None):
            exit_code = 1
    except TimeoutError:
        exit_code, timed_out = None, True
    except (EOFError, RuntimeError, KeyError) as error:
        exit_code = 1
        client.stderr.write(f"\nhemra: {error}\n".encode())
    finally:
        process.close_stdin()
        kill_agent_processes(sandbox, scratch, user)
        reader.join(5)
        process.close()
        with client._recording:
            client.record.close()
        client.stderr.close()
        for terminal in client.terminals.values():  # scratch: the record keeps what was shown
            terminal.stdout.unlink(missing_ok=True)
    return ExecResult(exit_code, timed_out, time.monotonic() - started)
