"""The `sdk` harness kind: a Python function of yours, run on the host, acting on the sandbox.

`entry = "my_agent.py:solve"` (a file beside the harness file) or `"package.module:solve"`
names a function that takes one `SdkAgent`. It runs in the runner's Python, talks to the model
through the gateway on loopback (`agent.base_url`, `agent.api_key`), and acts only through the
agent object: `agent.run(...)` executes in the sandbox as the sandbox user; `read_file` and
`write_file` reach its files as that user too (run by `head` and `cat` in the sandbox, never by
the engine, which acts as root). So an agent built on any Python SDK needs nothing installed in
the task image. The deadline is enforced: past it the sandbox's processes are killed and the
trial is a timeout, whatever the function is still doing; its thread is left to end by itself,
and the agent object refuses every call from then on (`TurnOver`), as it does once the function
has returned.
"""

from __future__ import annotations

import importlib
import importlib.util
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_hemra.core.errors import InfraError, SpecError
from pytest_hemra.execute.installs import Installed
from pytest_hemra.execute.kinds import AgentTurn, SandboxKind
from pytest_hemra.execute.output import DEFAULT_OUTPUT_CAP, CappedOutput
from pytest_hemra.execute.sandbox import (
    AGENT_USER,
    WORKDIR,
    ExecResult,
    Sandbox,
    kill_agent_processes,
)
from pytest_hemra.resolve.harness_spec import HarnessSpec
from pytest_hemra.resolve.harnesses import Harness

DRAIN_SECS = 10.0  # how long the end of a turn waits for calls already under way


class SdkKind(SandboxKind):
    """`entry` names the function; it is loaded at resolve, so a broken one refuses the run."""

    needs_command = False

    def validate(self, path: Path, spec: HarnessSpec) -> None:
        super().validate(path, spec)
        if not spec.entry:
            raise SpecError(f"{path}: key 'entry' is required for an sdk harness (module:function)")

    def install(self, harness: Harness) -> Installed | None:
        installed = super().install(harness)
        load_entry(harness)
        return installed

    def run_agent(self, turn: AgentTurn) -> ExecResult:
        sandbox, values, env = turn.sandbox, turn.values, turn.env
        return run_sdk(
            turn.harness, sandbox, values, env, turn.deadline, turn.stdout, turn.stderr, turn.user
        )


@dataclass(frozen=True)
class Completed:
    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool


class TurnOver(RuntimeError):
    """A call on an `SdkAgent` whose turn has ended: its deadline passed, or its function
    returned."""


class SdkAgent:
    """What an sdk harness function gets: the task, the model access, and the sandbox, for the
    length of its turn only."""

    def __init__(
        self,
        sandbox: Sandbox,
        values: Mapping[str, str],
        env: Mapping[str, str],
        deadline: float,
        scratch: Path,
        user: str = AGENT_USER,
    ) -> None:
        self.instruction = values["instruction"]
        self._user = user
        self.model = values["model"]
        self.base_url = values["host_base_url"]
        self.api_key = values["api_key"]
        self.deadline = deadline
        self.workdir = values.get("workdir") or WORKDIR
        self._sandbox, self._env, self._scratch = sandbox, dict(env), scratch
        self._runs = 0
        self._is_over = False
        self._under_way = 0
        self._calls = threading.Condition()

    @property
    def seconds_left(self) -> float:
        return max(self.deadline - time.time(), 0.0)

    def run(self, command: str | Sequence[str], timeout: float | None = None) -> Completed:
        """Run a command in the sandbox (a string goes to `bash -c`); never past the deadline."""
        argv = ["bash", "-c", command] if isinstance(command, str) else list(command)
        with self._call("run"):
            self._runs += 1
            out = self._scratch / f"run-{self._runs}.stdout"
            err = self._scratch / f"run-{self._runs}.stderr"
            limit = min(timeout or self.seconds_left, self.seconds_left) or 0.001
            result = self._sandbox.exec(
                argv, user=self._user, env=self._env, timeout=limit, stdout=out, stderr=err
            )
        return Completed(result.exit_code, _read(out), _read(err), result.timed_out)

    def read_file(self, path: str) -> bytes:
        """A file's bytes as the sandbox user reads it; the OSError that user meets otherwise
        (FileNotFoundError, PermissionError, IsADirectoryError; EFBIG over 16 MiB)."""
        with self._call("read_file"):
            return self._sandbox.read_file(path, user=self._user)

    def write_file(self, path: str, content: str | bytes) -> None:
        """Write a file as the sandbox user (its missing folders too); the OSError that user
        meets otherwise (PermissionError outside what it may write)."""
        data = content.encode() if isinstance(content, str) else content
        with self._call("write_file"):
            self._sandbox.write_file(path, data, user=self._user)

    @contextmanager
    def _call(self, name: str) -> Iterator[None]:
        with self._calls:
            if self._is_over or time.time() >= self.deadline:
                raise TurnOver(
                    f"agent.{name}: the agent's turn is over (its deadline passed or its "
                    "function returned); the sandbox no longer takes its calls"
                )
            self._under_way += 1
        try:
            yield
        finally:
            with self._calls:
                self._under_way -= 1
                self._calls.notify_all()

    def end_turn(self) -> None:
        """Refuse every call from now on."""
        with self._calls:
            self._is_over = True

    def drain(self, seconds: float) -> bool:
        """Wait for the calls already under way to end; whether they did within `seconds`."""
        with self._calls:
            return self._calls.wait_for(lambda: self._under_way == 0, seconds)


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def load_entry(harness: Harness) -> Callable[[SdkAgent], Any]:
    """The harness's function: `file.py:name` beside the harness file, or `module:name`."""
    location, _, name = str(harness.spec.entry).partition(":")
    try:
        if location.endswith(".py"):
            path = harness.path.parent / location
            spec = importlib.util.spec_from_file_location(f"hemra_sdk_{harness.name}", path)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load {path}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(location)
        function = getattr(module, name)
    except (ImportError, OSError, AttributeError, SyntaxError) as error:
        raise InfraError(
            f"{harness.path}: key 'entry': cannot load {harness.spec.entry} ({error})"
        ) from None
    if not callable(function):
        raise InfraError(f"{harness.path}: key 'entry': {harness.spec.entry} is not callable")
    return function  # type: ignore[no-any-return]


def run_sdk(
    harness: Harness,
    sandbox: Sandbox,
    values: Mapping[str, str],
    env: Mapping[str, str],
    deadline: float,
    stdout: Path,
    stderr: Path,
    user: str = AGENT_USER,
) -> ExecResult:
    """Call the function in a thread with the deadline; its failure is the harness's exit 1.
    Its commands and file operations run as `user`, the agent's."""
    function = load_entry(harness)
    scratch = stdout.parent / "sdk"
    scratch.mkdir(exist_ok=True)
    agent = SdkAgent(sandbox, values, env, deadline, scratch, user)
    outcome: dict[str, Any] = {}

    def call() -> None:
        try:
            outcome["result"] = function(agent)
        except BaseException:  # the harness's own failure, reported as its exit status
            outcome["error"] = traceback.format_exc()

    started = time.monotonic()
    worker = threading.Thread(target=call, name=f"hemra-sdk-{harness.name}", daemon=True)
    worker.start()
    worker.join(max(deadline - time.time(), 0.0))
    agent.end_turn()  # whatever the function (or a thread it left) still does reaches nothing
    if worker.is_alive() or time.time() >= deadline:  # also: its last command hit the deadline
        kill_agent_processes(sandbox, scratch, user)  # ends the commands under way
        agent.drain(DRAIN_SECS)
        return ExecResult(None, True, time.monotonic() - started)
    agent.drain(DRAIN_SECS)
    cap = int(getattr(sandbox, "output_cap", DEFAULT_OUTPUT_CAP))  # as an exec's output
    if "error" in outcome:
        with CappedOutput(stderr, cap) as err:
            err.write(str(outcome["error"]).encode(errors="replace"))
        return ExecResult(1, False, time.monotonic() - started)
    if outcome.get("result") is not None:
        with CappedOutput(stdout, cap) as out:
            out.write((str(outcome["result"]) + "\n").encode(errors="replace"))
    return ExecResult(0, False, time.monotonic() - started)
