"""Output kept in a trial folder, bounded: a process's stdout or stderr up to a cap (its head and
its tail, the cut noted), and the folder's budget for what else the agent controls (its logs, its
artifacts).

An agent may print gigabytes, or leave them in /logs/agent; the runner keeps at most the cap of
each stream (`[sandbox] output_cap_mb`, 16 MiB by default) and the budget of each trial folder
(`[sandbox] folder_cap_mb`), reading the rest through and dropping it.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import TracebackType
from typing import IO, Any

DEFAULT_OUTPUT_CAP = 16 << 20  # per stream (a file such as agent/stdout.txt), per trial
DEFAULT_FOLDER_CAP = 256 << 20  # what the agent controls in one trial folder besides its output
CUTS = "cuts.json"  # beside a capped file: what was cut from each, by file name
MAX_LEFT_OUT = 100  # files named in `folder-cap.json` (their count and bytes are all kept)
FOLDER_NOTE = "folder-cap.json"


def marker(cut: int, cap: int) -> bytes:
    """The line a capped file holds where its middle was cut."""
    return (
        f"\n[hemra: {cut} bytes cut here; output over the cap of {cap} bytes per stream"
        " keeps its head and tail]\n"
    ).encode()


class CappedOutput:
    """A file written up to `cap` bytes (past what it already holds from earlier writers):
    its first half straight to disk, then its last half kept in a ring (in memory, bounded),
    everything between counted and dropped. On `close` the tail follows a marker line saying
    how many bytes were cut, and `cuts.json` beside the file says so too. A later writer to the
    same file (a trial's next command) goes on from there: the cap is the file's, not one
    command's."""

    def __init__(self, path: Path, cap: int = DEFAULT_OUTPUT_CAP) -> None:
        self.path, self.cap = path, max(cap, 2)
        self.head_cap = self.cap // 2
        self.tail_cap = self.cap - self.head_cap
        self._tail = bytearray()
        note = _read_cuts(path).get(path.name)
        self._handle: IO[bytes] = path.open("a+b")
        size = self._handle.seek(0, 2)
        if isinstance(note, dict):  # cut before: its tail goes back to the ring
            self.head_end = min(int(note.get("head", 0)), size)
            tail_start = min(int(note.get("tail", self.head_end)), size)
            self.cut = int(note.get("cut", 0))
        else:
            self.head_end = min(size, self.head_cap)
            tail_start, self.cut = self.head_end, 0
        if size > tail_start:
            keep = min(size - tail_start, self.tail_cap)
            self.cut += size - tail_start - keep
            self._handle.seek(size - keep)
            self._tail += self._handle.read(keep)
        self._handle.truncate(self.head_end)
        self._handle.seek(self.head_end)

    def write(self, data: bytes) -> None:
        if self._handle.closed:  # a reader still draining after its command was given up
            return
        room = self.head_cap - self.head_end
        if room > 0:
            head = data[:room]
            self._handle.write(head)
            self.head_end += len(head)
            data = data[room:]
        if data:
            self._tail += data
            over = len(self._tail) - self.tail_cap
            if over > (1 << 20) or (over > 0 and len(data) >= self.tail_cap):
                del self._tail[:over]  # from the front: CPython moves no bytes for it
                self.cut += over

    def close(self) -> None:
        if self._handle.closed:
            return
        over = len(self._tail) - self.tail_cap
        if over > 0:
            del self._tail[:over]
            self.cut += over
        if self.cut:
            self._handle.write(marker(self.cut, self.cap))
            tail_start = self._handle.tell()
            self._handle.write(self._tail)
            _write_cut(self.path, {"head": self.head_end, "tail": tail_start, "cut": self.cut})
        else:
            self._handle.write(self._tail)
        self._tail = bytearray()
        self._handle.close()

    def __enter__(self) -> CappedOutput:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _read_cuts(path: Path) -> dict[str, Any]:
    try:
        found = json.loads((path.parent / CUTS).read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _write_cut(path: Path, note: dict[str, int]) -> None:
    cuts = _read_cuts(path)
    cuts[path.name] = note
    (path.parent / CUTS).write_text(json.dumps(cuts, indent=1, sort_keys=True) + "\n")


class FolderBudget:
    """What a trial folder may still take of files the agent controls (its /logs/agent, its
    artifacts): `take` says whether a file of so many bytes fits, and counts it; what did not
    fit is listed (the first `MAX_LEFT_OUT` names, all counted) in `folder-cap.json`."""

    def __init__(self, folder: Path, cap: int = DEFAULT_FOLDER_CAP) -> None:
        self.folder, self.cap = folder, cap
        self.used = 0
        self.left_out: list[dict[str, Any]] = []
        self.left_out_files = 0
        self.left_out_bytes = 0

    def take(self, where: str, size: int) -> bool:
        """Whether `size` more bytes (a file kept as `where`, relative to the trial folder)
        fit; if not it is noted as left out."""
        if self.used + size <= self.cap:
            self.used += size
            return True
        self.left_out_files += 1
        self.left_out_bytes += size
        if len(self.left_out) < MAX_LEFT_OUT:
            self.left_out.append({"path": where, "bytes": size})
        return False

    def note(self) -> None:
        """`folder-cap.json`, when anything was left out."""
        if not self.left_out_files:
            return
        (self.folder / FOLDER_NOTE).write_text(
            json.dumps(
                {
                    "schema_version": 1,
                    "cap_bytes": self.cap,
                    "kept_bytes": self.used,
                    "left_out_files": self.left_out_files,
                    "left_out_bytes": self.left_out_bytes,
                    "left_out": self.left_out,
                },
                indent=1,
            )
            + "\n"
        )
