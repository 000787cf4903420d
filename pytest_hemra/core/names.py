"""Answers to a name HEMRA does not know: the closest known ones, and the list of what exists.

`no harness named 'claud-code' (did you mean 'claude-code'? known: aider, claude-code, ...)`
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

LISTED = 20  # past this many known names, the list is cut (with how many more)


def unknown_name(what: str, name: str, known: Iterable[str]) -> str:
    """`no WHAT named 'NAME'`, with the closest known names and what exists."""
    return f"no {what} named {name!r}{suggestions(name, known)}"


def suggestions(name: str, known: Iterable[str]) -> str:
    """` (did you mean 'x'? known: a, b, c)`, or ` (none exists)` when nothing is known."""
    names = sorted(dict.fromkeys(known))
    if not names:
        return " (none exists)"
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    if len(name) >= 3:  # a name some known one holds: 'claude' for 'claude-code'
        close += [n for n in names if n not in close and name.lower() in n.lower()]
    listed = ", ".join(names[:LISTED])
    if len(names) > LISTED:
        listed += f" and {len(names) - LISTED} more"
    meant = " or ".join(repr(n) for n in close[:3])
    return f" (did you mean {meant}? known: {listed})" if meant else f" (known: {listed})"
