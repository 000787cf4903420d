"""Agent-controlled text made safe to print or show: control characters escaped.

An agent chooses its file names, its output and its errors' words; printed raw, an ESC sequence
clears or rewrites the terminal of whoever reads a summary, a CR hides what precedes it on the
line, a newline forges a line of its own. Every face (the terminal summary, `hemra show`, the
reports and their exports, the viewer) passes such text through `printable` (one line) or
`printable_lines` (a multi-line text: newlines and tabs kept).
"""

from __future__ import annotations

import re

# C0 controls, DEL, and C1 controls (U+0080-U+009F: a terminal may take U+009B as CSI);
# U+2028/U+2029 (line breaks to some readers) and bidirectional overrides (text shown reversed)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_CONTROL_BUT_LINES = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\x1b": "\\e", "\b": "\\b"}


def _escape(match: re.Match[str]) -> str:
    found = match.group()
    named = _NAMED.get(found)
    if named is not None:
        return named
    code = ord(found)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: str) -> str:
    """`text` on one line with every control character shown as an escape (`\\e`, `\\n`,
    `\\r`, `\\x07`, `\\u202e`...): safe on a terminal, in a table cell, in a header."""
    return _CONTROL.sub(_escape, text)


def printable_lines(text: str) -> str:
    """`text` with its newlines and tabs kept and every other control character escaped, for
    output shown as several lines (an agent's stdout tail, a leftovers listing)."""
    return _CONTROL_BUT_LINES.sub(_escape, text)


def has_control(text: str) -> bool:
    """Whether `printable` would change `text`."""
    return _CONTROL.search(text) is not None
