"""Run the commands a Markdown page shows, as a reader would, and check each one's exit status.

What a page marks, in a fenced block's info string (GitHub shows only its first word):

- ```` ```bash runnable ````: each line is a command (a trailing `\\` continues it), run in order
  with bash in the page's folder; `# exits N` in its comment is the status it must return (else
  0); `(until Ctrl-C)` marks a command that serves until stopped: it is started, its first
  `http://` address fetched, then it is sent SIGINT and must exit 0. `cd DIR` moves the folder
  for the commands after it. `RUN_ID` stands for the id the last run printed: the latest in the
  store. Lines starting with `#` are comments.
- ```` ```LANG file=PATH ````: the block's text is written to PATH (in the page's folder) when
  the reader reaches it, before the commands after it.

Blocks without either mark are read, not run.
"""

from __future__ import annotations

import queue
import re
import shlex
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```\s*$", re.MULTILINE | re.DOTALL)
EXITS = re.compile(r"#.*\bexits (?P<code>\d+)")
UNTIL_CTRL_C = "until Ctrl-C"
COMMAND_TIMEOUT_SECS = 600


@dataclass(frozen=True)
class Command:
    line: str  # as the page shows it, comment included
    argv_text: str  # the command alone, for bash
    exits: int
    serves: bool


@dataclass(frozen=True)
class FileBlock:
    path: str
    text: str


Step = Command | FileBlock


def steps(markdown: str) -> Iterator[Step]:
    """The page's runnable commands and files to write, in the order a reader meets them."""
    for block in FENCE.finditer(markdown):
        words = block.group("info").split()
        body = block.group("body")
        written = [w.removeprefix("file=") for w in words if w.startswith("file=")]
        if written:
            yield FileBlock(written[0], body)
        elif "runnable" in words[1:]:
            yield from _commands(body)


def _commands(body: str) -> Iterator[Command]:
    joined = re.sub(r"\\\n\s*", " ", body)
    for raw in joined.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        command, _, comment = _split_comment(line)
        found = EXITS.search("#" + comment) if comment else None
        yield Command(
            line=line,
            argv_text=command.strip(),
            exits=int(found.group("code")) if found else 0,
            serves=UNTIL_CTRL_C in comment,
        )


def _split_comment(line: str) -> tuple[str, str, str]:
    """A command and its trailing comment: the first ` #` outside quotes."""
    quote = ""
    for index, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and index > 0 and line[index - 1] in " \t":
            return line[:index], "#", line[index + 1 :]
    return line, "", ""


@dataclass
class Reader:
    """Runs a page's steps in `folder`, with `env`; `replace` rewrites a command first (the
    wheel test installs its wheel where the README says `pip install pytest-hemra`)."""

    folder: Path
    env: Mapping[str, str]
    replace: Callable[[str], str | None] = lambda command: command
    timeout: float = COMMAND_TIMEOUT_SECS

    def run(self, markdown: str) -> list[str]:
        """Every step, in order; what each command was, for the test's failure message."""
        done: list[str] = []
        for step in steps(markdown):
            if isinstance(step, FileBlock):
                target = self.folder / step.path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(step.text)
                done.append(f"wrote {step.path}")
                continue
            command = self.replace(step.argv_text)
            if command is None:
                done.append(f"skipped {step.line}")
                continue
            command = self._fill(command)
            if command.startswith("cd "):
                self.folder = (self.folder / shlex.split(command)[1]).resolve()
            elif step.serves:
                self._serve(command, done)
            else:
                self._command(command, step.exits, done)
        return done

    def _fill(self, command: str) -> str:
        if "RUN_ID" not in command:
            return command
        listed = subprocess.run(
            ["hemra", "runs", "-q"],
            cwd=self.folder,
            env=dict(self.env),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert listed.returncode == 0, f"hemra runs -q, for RUN_ID: {listed.stderr}"
        return command.replace("RUN_ID", listed.stdout.split()[-1])

    def _command(self, command: str, exits: int, done: list[str]) -> None:
        started = time.monotonic()
        result = subprocess.run(
            ["bash", "-c", command],
            cwd=self.folder,
            env=dict(self.env),
            capture_output=True,
            text=True,
            timeout=self.timeout,
        )
        done.append(f"{command}  -> {result.returncode} in {time.monotonic() - started:.1f}s")
        assert result.returncode == exits, (
            f"`{command}` in {self.folder} exited {result.returncode}, the page says {exits}\n"
            f"stdout: {result.stdout[-3000:]}\nstderr: {result.stderr[-3000:]}"
        )

    def _serve(self, command: str, done: list[str]) -> None:
        """Start a server with any free port, fetch the page it announces, stop it as Ctrl-C
        would, and expect exit 0."""
        served = subprocess.Popen(
            ["bash", "-c", f"exec {command} --port 0"],
            cwd=self.folder,
            env=dict(self.env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            assert served.stdout is not None
            url = _announced_url(served, time.monotonic() + 60)
            with urllib.request.urlopen(url, timeout=30) as page:
                body = page.read().decode()
                assert page.status == 200 and "<html" in body.lower(), body[:500]
        finally:
            served.send_signal(signal.SIGINT)
            try:
                code = served.wait(timeout=30)
            except subprocess.TimeoutExpired:
                served.kill()
                raise
        done.append(f"{command} --port 0  -> served {url}, {code} after Ctrl-C")
        assert code == 0, f"`{command}` exited {code} after Ctrl-C"


def _announced_url(served: subprocess.Popen[str], deadline: float) -> str:
    """The first `http://` address the server prints (read by a thread: a pipe has no timeout)."""
    lines: queue.Queue[str] = queue.Queue()
    stream = served.stdout
    assert stream is not None
    threading.Thread(target=lambda: [lines.put(line) for line in stream], daemon=True).start()
    seen = []
    while time.monotonic() < deadline and served.poll() is None:
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            continue
        seen.append(line)
        found = re.search(r"http://\S+", line)
        if found:
            return found.group(0)
    raise AssertionError(f"no address announced: {''.join(seen)[-2000:]}")
