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

import bisect
import difflib
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path

MAX_DIFF_BYTES = 4 << 20
CONTEXT = 3  # lines around each change
# the most lines (before x after, of a part of a file between two anchors) difflib matches (an
# every-other-line change of 5,000 lines takes it ~2 s); a bigger part is removed then added
MAX_MATCHED = 25_000_000
DIFF_SECS = 10.0  # past this, no more matching: what is left is removed then added
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


def _file_diff(name: str, old: bytes | None, new: bytes | None, deadline: float) -> Iterator[str]:
    """One changed file's part of the diff, piece by piece (lines matched until `deadline`)."""
    source = quote_path(f"a/{name}") if old is not None else "/dev/null"
    target = quote_path(f"b/{name}") if new is not None else "/dev/null"
    try:
        old_lines = _lines((old or b"").decode())
        new_lines = _lines((new or b"").decode())
    except UnicodeDecodeError:
        yield f"Binary files {quote_path(f'a/{name}')} and {quote_path(f'b/{name}')} differ\n"
        return
    if not old_lines and not new_lines:
        return
    # git ends a header line with a tab when its name holds a space (for GNU patch)
    yield f"--- {source}{_tab(source)}\n+++ {target}{_tab(target)}\n"
    yield from _hunks(old_lines, new_lines, deadline)


def _hunks(old: list[str], new: list[str], deadline: float) -> Iterator[str]:
    """The unified hunks (3 lines of context) of `old` -> `new`, matched in bounded work: the
    common first and last lines are set aside, lines found once on each side anchor the rest
    (as git's patience diff), and difflib matches each part between anchors only when the
    product of its two sides' lines is under `MAX_MATCHED` and `deadline` has not passed (its
    work grows with that product: every other line of 20,000 changed takes it ~40 s); any
    other part is removed then added whole."""
    start = 0
    while start < min(len(old), len(new)) and old[start] == new[start]:
        start += 1
    end = 0
    while end < min(len(old), len(new)) - start and old[-1 - end] == new[-1 - end]:
        end += 1
    front, back = max(start - CONTEXT, 0), max(end - CONTEXT, 0)
    old_part, new_part = old[front : len(old) - back], new[front : len(new) - back]
    codes = _opcodes(old[start : len(old) - end], new[start : len(new) - end], deadline)
    head, tail = start - front, end - back  # the context kept from the common lines
    codes = [
        ("equal", 0, head, 0, head),
        *((tag, i1 + head, i2 + head, j1 + head, j2 + head) for tag, i1, i2, j1, j2 in codes),
        ("equal", len(old_part) - tail, len(old_part), len(new_part) - tail, len(new_part)),
    ]
    for group in _grouped([code for code in codes if code[1] != code[2] or code[3] != code[4]]):
        first, last = group[0], group[-1]
        old_span = _span(first[1] + front, last[2] + front)
        new_span = _span(first[3] + front, last[4] + front)
        yield f"@@ -{old_span} +{new_span} @@\n"
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                yield from (" " + line for line in old_part[i1:i2])
                continue
            yield from ("-" + line for line in old_part[i1:i2])
            yield from ("+" + line for line in new_part[j1:j2])


Opcode = tuple[str, int, int, int, int]


def _opcodes(old: list[str], new: list[str], deadline: float) -> list[Opcode]:
    """difflib-style opcodes of `old` -> `new`, between anchors (`_anchors`), bounded."""
    codes: list[Opcode] = []
    i0 = j0 = 0
    for i, j in [*_anchors(old, new), (len(old), len(new))]:
        codes += _segment(old, new, (i0, i), (j0, j), deadline)
        if i < len(old):
            codes.append(("equal", i, i + 1, j, j + 1))
        i0, j0 = i + 1, j + 1
    merged: list[Opcode] = []
    for code in codes:
        if merged and code[0] == merged[-1][0] == "equal":
            last = merged[-1]
            merged[-1] = ("equal", last[1], code[2], last[3], code[4])
        elif code[1] != code[2] or code[3] != code[4]:
            merged.append(code)
    return merged


def _segment(
    old: list[str], new: list[str], rows: tuple[int, int], cols: tuple[int, int], deadline: float
) -> list[Opcode]:
    (i1, i2), (j1, j2) = rows, cols
    if i1 == i2 or j1 == j2:
        return [("delete" if i1 < i2 else "insert", i1, i2, j1, j2)]
    if (i2 - i1) * (j2 - j1) > MAX_MATCHED or time.monotonic() > deadline:
        return [("replace", i1, i2, j1, j2)]
    matcher = difflib.SequenceMatcher(None, old[i1:i2], new[j1:j2], autojunk=False)
    return [(tag, a + i1, b + i1, c + j1, d + j1) for tag, a, b, c, d in matcher.get_opcodes()]


def _anchors(old: list[str], new: list[str]) -> list[tuple[int, int]]:
    """(old index, new index) of lines found exactly once in each, the longest run of them in
    the same order on both sides (patience sorting: n log n)."""
    once_old = {line for line, count in Counter(old).items() if count == 1}
    counts_new = Counter(new)
    where = {line: j for j, line in enumerate(new) if counts_new[line] == 1 and line in once_old}
    pairs = [(i, where[line]) for i, line in enumerate(old) if line in where]
    tops: list[int] = []  # the least last j of an increasing run of each length
    ends: list[int] = []  # the pair index holding it
    previous = [-1] * len(pairs)
    for index, (_, j) in enumerate(pairs):
        at = bisect.bisect_left(tops, j)
        if at == len(tops):
            tops.append(j)
            ends.append(index)
        else:
            tops[at], ends[at] = j, index
        previous[index] = ends[at - 1] if at else -1
    run: list[tuple[int, int]] = []
    index = ends[-1] if ends else -1
    while index >= 0:
        run.append(pairs[index])
        index = previous[index]
    return run[::-1]


def _grouped(codes: list[Opcode]) -> Iterator[list[Opcode]]:
    """The opcodes in hunks with `CONTEXT` lines around each change (difflib's
    `get_grouped_opcodes`)."""
    if not codes:
        return
    if codes[0][0] == "equal":
        tag, i1, i2, j1, j2 = codes[0]
        codes[0] = tag, max(i1, i2 - CONTEXT), i2, max(j1, j2 - CONTEXT), j2
    if codes[-1][0] == "equal":
        tag, i1, i2, j1, j2 = codes[-1]
        codes[-1] = tag, i1, min(i2, i1 + CONTEXT), j1, min(j2, j1 + CONTEXT)
    group: list[Opcode] = []
    for tag, i1, i2, j1, j2 in codes:
        if tag == "equal" and i2 - i1 > 2 * CONTEXT:
            group.append((tag, i1, min(i2, i1 + CONTEXT), j1, min(j2, j1 + CONTEXT)))
            yield group
            group = []
            i1, j1 = max(i1, i2 - CONTEXT), max(j1, j2 - CONTEXT)
        group.append((tag, i1, i2, j1, j2))
    if group and not (len(group) == 1 and group[0][0] == "equal"):
        yield group


def _span(start: int, stop: int) -> str:
    """A hunk's range as unified diffs write it (difflib's `_format_range_unified`)."""
    length = stop - start
    if length == 1:
        return str(start + 1)
    return f"{start if not length else start + 1},{length}"


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
    try:
        return _write_diff(before, after, path, cap)
    except OSError as error:  # a buffered write's error names no file: name it (a full disk)
        if error.filename is None:
            raise OSError(error.errno, error.strerror, str(path)) from error
        raise


def _write_diff(
    before: Mapping[str, bytes], after: Mapping[str, bytes], path: Path, cap: int
) -> int:
    names = changed_names(before, after)
    written = 0
    deadline = time.monotonic() + DIFF_SECS
    with path.open("wb") as handle:
        for index, name in enumerate(names):
            for piece in _file_diff(name, before.get(name), after.get(name), deadline):
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
    deadline = time.monotonic() + DIFF_SECS
    for name in changed_names(before, after):
        for piece in _file_diff(name, before.get(name), after.get(name), deadline):
            pieces.append(piece)
            size += len(piece)
            if size >= MAX_DIFF_BYTES:
                return "".join(pieces)[:MAX_DIFF_BYTES]
    return "".join(pieces)
