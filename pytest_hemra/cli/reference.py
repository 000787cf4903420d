"""`docs/cli.md`, written from the parsers themselves so it cannot drift from them:
`python -m pytest_hemra.cli.reference > docs/cli.md` (a test checks the committed file is what
this writes)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from pytest_hemra.cli.exits import MEANINGS

HEADER = """\
# The `hemra` command line

<!-- Written by `python -m pytest_hemra.cli.reference > docs/cli.md`; do not edit by hand. -->

You want the exact flags of a command. Every command and option is here, as `hemra COMMAND
--help` prints them; what the words mean is in [concepts.md](concepts.md), and the run-file keys
the `hemra run` flags replace are in [run-files.md](run-files.md).

Every command finds its store the same way: `--store PATH|URL` when given, else the
`HEMRA_STORE` environment variable, else `.hemra/hemra.db` in the current folder. A store is a
SQLite file, or a PostgreSQL database several machines share (`postgresql://...`, see
[store.md](store.md#a-shared-store-postgresql)). Under plain pytest, the
`--hemra-*` options (`pytest --help`) are the same as `hemra run`'s flags.
"""


def render_reference(parser: argparse.ArgumentParser) -> str:
    lines = [HEADER, "## Exit codes", "", "| code | meaning |", "|---|---|"]
    lines += [f"| {int(code)} | {_cell(meaning)} |" for code, meaning in MEANINGS.items()]
    lines += ["", "## Commands", ""]
    commands = list(_commands(parser))
    lines += [f"- [`{sub.prog}`](#{_anchor(sub.prog)}): {_cell(text)}" for sub, text in commands]
    for sub, text in commands:
        lines += ["", f"## {sub.prog}", "", _sentence(sub.description or text), ""]
        formatter = argparse.HelpFormatter(sub.prog, width=100)
        formatter.add_usage(sub.usage, sub._actions, sub._mutually_exclusive_groups, prefix="")
        lines += ["```", formatter.format_help().strip(), "```", ""]
        rows = [_row(action) for action in sub._actions if _is_documented(action)]
        if rows:
            lines += ["| argument | default | what it is |", "|---|---|---|", *rows]
    return "\n".join(lines).rstrip() + "\n"


def _commands(
    parser: argparse.ArgumentParser, help_text: str = ""
) -> Iterator[tuple[argparse.ArgumentParser, str]]:
    """Every command that runs something, nested ones (`hemra image bootstrap`) included."""
    groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not groups:
        yield parser, help_text
    for group in groups:
        helps = {choice.dest: choice.help or "" for choice in group._choices_actions}
        for name, sub in group.choices.items():
            yield from _commands(sub, helps.get(name, ""))


def _is_documented(action: argparse.Action) -> bool:
    return not isinstance(action, argparse._HelpAction | argparse._SubParsersAction)


def _row(action: argparse.Action) -> str:
    if action.option_strings:
        metavar = "" if action.nargs == 0 else f" {action.metavar or action.dest.upper()}"
        name = ", ".join(f"`{flag}{metavar}`" for flag in action.option_strings)
    else:
        name = f"`{action.metavar or action.dest}`"
    if isinstance(action, argparse._AppendAction) and "repeatable" not in (action.help or ""):
        name += " (repeatable)"
    default = action.default
    shown = "" if default in (None, False, [], argparse.SUPPRESS) else f"`{default}`"
    if action.choices is not None and not isinstance(action.choices, dict):
        choices = ", ".join(f"`{choice}`" for choice in action.choices)
        help_text = f"{action.help or ''} (one of {choices})"
    else:
        help_text = action.help or ""
    help_text = help_text.replace("%(default)s", str(default))
    return f"| {name} | {shown} | {_cell(help_text)} |"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _sentence(text: str) -> str:
    text = " ".join(text.split())
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def _anchor(title: str) -> str:
    """GitHub's anchor for a heading: lower case, spaces to dashes, punctuation dropped."""
    return "".join(c for c in title.lower().replace(" ", "-") if c.isalnum() or c in "-_")


def main() -> None:
    from pytest_hemra.cli import build_parser

    print(render_reference(build_parser()), end="")


if __name__ == "__main__":
    main()
