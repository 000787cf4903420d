"""The agent's changes to /app, as the unified diff kept in the trial folder (`diff.patch`) and
shown to judges.

The diff is written to its file as it is made, one changed file at a time, and stops at
`MAX_DIFF_BYTES` (a last line says where and how many changed files it left out): a big change
(the tree read is capped at 128 MiB) costs the runner one file's diff in memory at a time, not the
whole text several times over. Names are quoted in the headers as git quotes them
(`core.quotePath`): a name with a newline, an ESC sequence or a quote can neither forge a header
nor reach the terminal of whoever prints the patch.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from pathlib import Path

MAX_DIFF_BYTES = 4 << 20
# git's quote_c_style: the escapes it names, every other byte below 0x20 (and 0x7f) in octal
_NAMED_ESCAPES = {
    0x07: "\\a",
    0x08: "\\b",
    0x09: "\\t",
    0x0A: "\\n",
    0x0B: "\\v",
    0x0C: "\\f",
    0x0D: "\\r",
    0x22: '\\"',
    0x5C: "\\\\",
}


def quote_path(name: str) -> str:
    """`name` as git writes it in a diff header (core.quotePath on): as it is when every byte is
    printable ASCII other than `"` and `\\`, else C-quoted in double quotes with octal escapes
    for control and non-ASCII bytes (`"a/\\303\\251"`). Names read from a tar stream keep bytes
    that are not UTF-8 as surrogates: they are quoted as the bytes they were."""
    raw = name.encode("utf-8", "surrogateescape")
    if all(0x20 <= byte < 0x7F and byte not in (0x22, 0x5C) for byte in raw):
        return name
    quoted = []
    for byte in raw:
        if byte in _NAMED_ESCAPES:
            quoted.append(_NAMED_ESCAPES[byte])
        elif byte < 0x20 or byte >= 0x7F:
            quoted.append(f"\\{byte:03o}")
        else:
            quoted.append(chr(byte))
    return '"' + "".join(quoted) + '"'


def _lines(text: str) -> list[str]:
    return [line if line.endswith("\n") else line + "\n" for line in text.splitlines(True)]


def _file_diff(name: str, old: bytes | None, new: bytes | None) -> Iterator[str]:
    """One changed file's part of the diff, piece by piece."""
    source = quote_path(f"a/{name}") if old is not None else "/dev/null"
    target = quote_path(f"b/{name}") if new is not None else "/dev/null"
    try:
        old_text = (old or b"").decode()
        new_text = (new or b"").decode()
    except UnicodeDecodeError:
        yield f"Binary files {quote_path(f'a/{name}')} and {quote_path(f'b/{name}')} differ\n"
        return
    # git ends a header line with a tab when its name holds a space (for GNU patch)
    header = f"--- {source}{_tab(source)}\n+++ {target}{_tab(target)}\n"
    if not old_text or not new_text:  # all added or all removed: no matching to do
        lines, sign = (_lines(new_text), "+") if new_text else (_lines(old_text), "-")
        if not lines:
            return
        count = len(lines)
        span = "1" if count == 1 else f"1,{count}"
        hunk = f"@@ -0,0 +{span} @@\n" if sign == "+" else f"@@ -{span} +0,0 @@\n"
        yield header + hunk
        for line in lines:
            yield sign + line
        return
    hunks = difflib.unified_diff(_lines(old_text), _lines(new_text))
    for index, line in enumerate(hunks):
        if index == 0:
            yield header
        elif index > 1:  # difflib's own header lines (the first two) replaced by git's
            yield line if line.endswith("\n") else line + "\n"


def _tab(name: str) -> str:
    return "\t" if " " in name else ""


def changed_names(before: Mapping[str, bytes], after: Mapping[str, bytes]) -> list[str]:
    """The names whose content differs (added, removed or changed), sorted."""
    return sorted(
        name for name in before.keys() | after.keys() if before.get(name) != after.get(name)
    )


def write_diff(
    before: Mapping[str, bytes], after: Mapping[str, bytes], path: Path, cap: int = MAX_DIFF_BYTES
) -> int:
    """Write the unified diff of `before` -> `after` to `path`, streamed, up to `cap` bytes;
    past it a last line says so and how many changed files were left out. Returns the bytes
    written."""
    names = changed_names(before, after)
    written = 0
    with path.open("wb") as handle:
        for index, name in enumerate(names):
            for piece in _file_diff(name, before.get(name), after.get(name)):
                data = piece.encode("utf-8", "surrogateescape")
                if written + len(data) > cap:
                    handle.write(data[: cap - written])
                    left = len(names) - index - 1
                    note = (
                        f"\n# hemra: diff cut at {cap} bytes, in {quote_path(name)};"
                        f" {left} more changed files not shown\n"
                    ).encode()
                    handle.write(note)
                    return cap + len(note)
                handle.write(data)
                written += len(data)
    return written


def tree_diff(before: Mapping[str, bytes], after: Mapping[str, bytes]) -> str:
    """The unified diff of the agent's changes to /app as text (binary files named, not shown),
    up to `MAX_DIFF_BYTES`."""
    pieces: list[str] = []
    size = 0
    for name in changed_names(before, after):
        for piece in _file_diff(name, before.get(name), after.get(name)):
            pieces.append(piece)
            size += len(piece)
            if size >= MAX_DIFF_BYTES:
                return "".join(pieces)[:MAX_DIFF_BYTES]
    return "".join(pieces)
