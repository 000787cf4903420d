"""The agent's changes to /app, as the unified diff kept in the trial folder (`diff.patch`) and
shown to judges."""

from __future__ import annotations

import difflib

MAX_DIFF_BYTES = 4 << 20


def tree_diff(before: dict[str, bytes], after: dict[str, bytes]) -> str:
    """A unified diff of the agent's changes to /app (binary files named, not shown)."""
    lines: list[str] = []
    for name in sorted(before.keys() | after.keys()):
        old, new = before.get(name), after.get(name)
        if old == new:
            continue
        try:
            old_text = (old or b"").decode().splitlines(keepends=True)
            new_text = (new or b"").decode().splitlines(keepends=True)
        except UnicodeDecodeError:
            lines.append(f"Binary files a/{name} and b/{name} differ\n")
            continue
        lines.extend(
            difflib.unified_diff(
                old_text,
                new_text,
                fromfile=f"a/{name}" if old is not None else "/dev/null",
                tofile=f"b/{name}" if new is not None else "/dev/null",
            )
        )
    text = "".join(line if line.endswith("\n") else line + "\n" for line in lines)
    return text[:MAX_DIFF_BYTES]
