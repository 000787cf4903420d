"""The width output is shaped for, and tables made to fit it.

A table printed on a terminal fits it: columns are dropped, least important first, and the
ones left out are named under it (`--wide` prints every column). A pipe or a CI log gets every
column, unless `COLUMNS` says how wide to be. Lines of prose (a report's flags) wrap at word
boundaries with a hanging indent.
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO

MIN_WIDTH = 40  # narrower than this, a table is printed as narrow as it goes and left to wrap


def terminal_width(stream: TextIO | None = None) -> int | None:
    """The columns `stream` (stdout) shows: `COLUMNS` when set, else the terminal's width when
    `stream` is a terminal; None (every column) for a pipe or a log."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return max(int(columns), MIN_WIDTH)
    stream = stream or sys.stdout
    try:
        is_terminal = stream.isatty()
    except (AttributeError, ValueError):  # closed, or not a file
        return None
    return max(shutil.get_terminal_size().columns, MIN_WIDTH) if is_terminal else None


def output_width(wide: bool) -> int | None:
    """The width a command's tables fit: None (every column) with `--wide`."""
    return None if wide else terminal_width()


@dataclass(frozen=True)
class FittedTable:
    text: str
    dropped: tuple[str, ...]  # the headers of the columns left out, in the table's order


def fit_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    width: int | None,
    *,
    keep: Sequence[str] = (),
    tablefmt: str = "simple",
    numbers_right: bool = False,
) -> FittedTable:
    """The table as tabulate prints it, at most `width` wide: columns dropped from the right
    (those named in `keep` last, the last of them first) until it fits; the first column is
    never dropped, and a table still too wide then has its widest cells folded onto lines of
    their own. `width` None: every column. `numbers_right`: columns of numbers aligned right
    (tabulate's number parsing; a report's cells are text, "0.500 [0.2, 0.8]")."""
    from tabulate import tabulate

    names = list(headers)
    cells = [[str(cell) for cell in row] for row in rows]

    def render(columns: list[int], fold: list[int | None] | None = None) -> str:
        return tabulate(
            [[row[i] for i in columns] for row in cells],
            headers=[names[i] for i in columns],
            tablefmt=tablefmt,
            disable_numparse=not numbers_right,
            maxcolwidths=fold,
        )

    columns = list(range(len(names)))
    text = render(columns)
    if width is None or _widest(text) <= width:
        return FittedTable(text, ())
    important = [names.index(n) for n in keep if n in names]
    order = [i for i in reversed(columns[1:]) if i not in important]
    order += [i for i in reversed(important) if i != 0]
    while order and _widest(text) > width:
        columns.remove(order.pop(0))
        text = render(columns)
    if _widest(text) > width:  # one column left, or the first alone too wide: fold its cells
        text = _folded(render, columns, text, width)
    dropped = tuple(n for i, n in enumerate(names) if i not in columns)
    return FittedTable(text, dropped)


def _folded(render: Any, columns: list[int], text: str, width: int) -> str:
    """The table with its widest columns' cells wrapped, narrowing them until it fits (or
    every column is down to 8 characters)."""
    header = text.splitlines()
    limits: list[int] = []
    # each column's printed width, from the dashes tabulate rules under the headers
    rule = next((line for line in header if set(line) <= {"-", " ", "|", ":", "+"}), "")
    limits = [len(part) for part in rule.split()] or [width] * len(columns)
    if len(limits) != len(columns):
        limits = [width] * len(columns)
    while _widest(text) > width and max(limits) > 8:
        widest = limits.index(max(limits))
        limits[widest] = max(8, limits[widest] - (_widest(text) - width))
        text = render(columns, list(limits))
    return str(text)


def _widest(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


def left_out_line(dropped: Sequence[str], width: int | None, where: str = "--wide") -> str:
    """The line under fitted tables naming what was left out, and how to see it."""
    line = f"(left out to fit {width} columns: {', '.join(dropped)}; {where} shows them)"
    return wrap_line(line, width)


def wrap_line(line: str, width: int | None, indent: str = "  ") -> str:
    """`line` wrapped at word boundaries to `width` (never mid-word: a word longer than the
    width stands on a line of its own), each line after the first indented by `indent`."""
    if width is None or len(line) <= width:
        return line
    return "\n".join(
        textwrap.wrap(
            line,
            width,
            subsequent_indent=indent,
            break_long_words=False,
            break_on_hyphens=False,
        )
    )
