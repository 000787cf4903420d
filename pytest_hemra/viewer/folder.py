"""A trial's folder, read safely: paged by byte offset, never loaded whole, nothing outside it.

Paths come from the store (the run's `trials_dir`, the trial's `trial_dir`) and from the
request; every one is resolved (symbolic links followed) and must stay inside the trial's
folder, which must itself be inside the run's trials folder.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_hemra.resolve.validation import is_valid_name
from pytest_hemra.viewer.params import BadRequest, NotFound

DEFAULT_LIMIT = 64 << 10
MAX_LIMIT = 1 << 20
MAX_LISTED = 2000  # files listed per trial folder
MAX_INSTRUCTION = 256 << 10
MAX_EVIDENCE = 200  # a tampered trial's evidence lines the trial page lists
MAX_TAMPERED_BYTES = 4 << 20  # tampered.json read at most this big
MAX_TRAJECTORY = 32 << 20  # trajectory.json parsed at most this big; page the raw file beyond
MAX_MESSAGE_CHARS = 64 << 10  # each transcript field cut here (the raw file has it whole)


@dataclass(frozen=True)
class Chunk:
    path: str
    size: int
    offset: int
    length: int
    next_offset: int | None  # None: the chunk reaches the end of the file
    is_binary: bool
    text: str | None  # None for a binary file


class TrialFolder:
    def __init__(self, trials_dir: Path, trial_dir: str | None) -> None:
        self.root: Path | None = None
        if trial_dir:
            root = Path(trial_dir).resolve()
            if not root.is_relative_to(trials_dir.resolve()):
                raise NotFound(f"trial folder {trial_dir}: outside the run's trials folder")
            self.root = root

    def files(self) -> list[dict[str, Any]]:
        """Every file in the folder (the first MAX_LISTED), as relative path and size."""
        if self.root is None or not self.root.is_dir():
            return []
        found: list[dict[str, Any]] = []
        for folder, dirs, names in os.walk(self.root):
            dirs.sort()
            for name in sorted(names):
                path = Path(folder) / name
                if path.is_symlink() or not path.is_file():
                    continue
                relative = path.relative_to(self.root).as_posix()
                found.append({"path": relative, "size": path.stat().st_size})
                if len(found) >= MAX_LISTED:
                    return found
        return found

    def tampered(self) -> dict[str, Any] | None:
        """What made the trial `tampered` (`tampered.json`: its reason and evidence lines, the
        first MAX_EVIDENCE of them), or None."""
        if self.root is None:
            return None
        try:
            found = json.loads((self.root / "tampered.json").read_bytes()[:MAX_TAMPERED_BYTES])
            reason, evidence = str(found["reason"]), [str(line) for line in found["evidence"]]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return {"reason": reason, "evidence": evidence[:MAX_EVIDENCE], "total": len(evidence)}

    def path(self, relative: str) -> Path:
        """The file `relative` names, checked to be inside the trial folder."""
        if self.root is None:
            raise NotFound("the trial has no folder yet (it has not run)")
        if not relative or relative.startswith("/") or "\x00" in relative:
            raise BadRequest(f"file {relative!r}: expected a path relative to the trial folder")
        path = (self.root / relative).resolve()
        if not path.is_relative_to(self.root):
            raise BadRequest(f"file {relative!r}: outside the trial folder")
        if not path.is_file():
            raise NotFound(f"file {relative!r}: not in the trial folder")
        return path

    def read(self, relative: str, offset: int, limit: int) -> Chunk:
        """`limit` bytes from `offset`, cut back to a whole UTF-8 character."""
        path = self.path(relative)
        with path.open("rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            handle.seek(min(offset, size))
            data = handle.read(limit)
        start = min(offset, size)
        reaches_end = start + len(data) >= size
        if not reaches_end:
            data = data[: _whole_characters(data)]
        is_binary = b"\x00" in data
        end = start + len(data)
        return Chunk(
            path=relative,
            size=size,
            offset=start,
            length=len(data),
            next_offset=None if end >= size else end,
            is_binary=is_binary,
            text=None if is_binary else data.decode("utf-8", errors="replace"),
        )

    def transcript(self, offset: int, limit: int) -> dict[str, Any]:
        """A page of the messages in trajectory.json, each long field cut at MAX_MESSAGE_CHARS."""
        try:
            path = self.path("trajectory.json")
        except NotFound:
            return {"has_trajectory": False, "total": 0, "offset": offset, "messages": []}
        size = path.stat().st_size
        if size > MAX_TRAJECTORY:
            raise BadRequest(
                f"trajectory.json is {size} bytes, over the {MAX_TRAJECTORY} the viewer parses;"
                " read it paged from the files endpoint"
            )
        try:
            data = json.loads(path.read_bytes())
            messages = list(data["messages"])
        except (ValueError, KeyError, TypeError) as error:
            raise BadRequest(f"trajectory.json: not a HEMRA trajectory ({error})") from None
        return {
            "has_trajectory": True,
            "wire": data.get("wire"),
            "main_call": data.get("main_call"),
            "total": len(messages),
            "offset": offset,
            "messages": [_cut(m) for m in messages[offset : offset + limit]],
        }


def read_instruction(dataset_dir: str | None, task: str) -> dict[str, Any]:
    """The task's instruction.md from the dataset folder the run resolved, its head if long."""
    if not dataset_dir or not is_valid_name(task):
        return {"text": None, "truncated": False, "error": "the task's folder is not known"}
    root = Path(dataset_dir).resolve()
    path = (root / task / "instruction.md").resolve()
    if not path.is_relative_to(root) or not path.is_file():
        return {"text": None, "truncated": False, "error": f"{path}: not found"}
    with path.open("rb") as handle:
        data = handle.read(MAX_INSTRUCTION + 1)
    truncated = len(data) > MAX_INSTRUCTION
    data = data[: _whole_characters(data[:MAX_INSTRUCTION])] if truncated else data
    return {"text": data.decode("utf-8", errors="replace"), "truncated": truncated, "error": None}


def _whole_characters(data: bytes) -> int:
    """The length of `data` without a UTF-8 character cut at its end."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return len(data)  # ASCII: nothing is cut
        if byte >= 0xC0:  # the lead byte of the last character
            needed = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return len(data) if back >= needed else len(data) - back
    return len(data)


def _cut(message: Any) -> Any:
    if not isinstance(message, dict):
        return message
    cut = dict(message)
    for key in ("text", "output"):
        value = cut.get(key)
        if isinstance(value, str) and len(value) > MAX_MESSAGE_CHARS:
            cut[key] = value[:MAX_MESSAGE_CHARS]
            cut[f"{key}_truncated"] = len(value)
    calls = cut.get("tool_calls")
    if isinstance(calls, list):
        cut["tool_calls"] = [
            {**c, "arguments": c["arguments"][:MAX_MESSAGE_CHARS]}
            if isinstance(c, dict) and isinstance(c.get("arguments"), str)
            else c
            for c in calls
        ]
    return cut
