"""`hemra`: a thin command line over the pytest plugin, plus the store's views.

`hemra run` maps its flags onto the plugin's `--hemra-*` options and runs pytest in-process;
pytest's `-k`, `-n`, `--junitxml` and `-v` are `hemra run` flags too, and everything after `--`
goes to pytest unchanged (`-- --maxfail=3`). A flag no command knows is refused naming it.

One module per command group (`running`: run and the queue; `reports`: what a run left;
`checking`: a dataset's health; `tools`: set-up and checks), each adding its commands with
`add_commands`. Building the parser imports almost nothing: a command's heavy modules load
inside its handler.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn, cast

from pytest_hemra import DOCS_URL
from pytest_hemra.cli.arguments import Parser
from pytest_hemra.cli.checking import add_commands as add_check_commands
from pytest_hemra.cli.exits import Exit, exit_codes_text
from pytest_hemra.cli.reports import add_commands as add_report_commands
from pytest_hemra.cli.running import add_commands as add_running_commands
from pytest_hemra.cli.tools import add_commands as add_tool_commands
from pytest_hemra.core.errors import HemraError

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

    from pytest_hemra.cli.arguments import Commands

DESCRIPTION = f"""\
Evaluate coding-agent harnesses on datasets of tasks (a pytest plugin), and read what runs left.
Every command finds runs in one store: --store PATH|URL (a SQLite file, or postgresql://...),
else $HEMRA_STORE, else .hemra/hemra.db in the current folder. `hemra COMMAND --help`
describes a command; {DOCS_URL}/cli.md all of them."""


class CommandLine(Parser):
    """`hemra`'s parser (its commands' too): a refused command line is one `hemra: ...` line,
    as every other refusal is, where argparse prints its usage and `PROG: error: ...`."""

    def print_usage(self, file: SupportsWrite[str] | None = None) -> None:
        if file is not sys.stderr:  # on stderr only before a refusal: its line names --help
            super().print_usage(file)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if status == Exit.REFUSED and message:
            text = message.strip().removeprefix(f"{self.prog}: error: ")
            where = "" if self.prog == "hemra" else f"{self.prog}: "
            message = f"hemra: {where}{text} (see {self.prog} --help)\n"
        super().exit(status, message)


def build_parser() -> argparse.ArgumentParser:
    parser = CommandLine(
        prog="hemra",
        description=DESCRIPTION,
        epilog=exit_codes_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"hemra {installed_version()}")
    # each command's parser a CommandLine too (argparse makes them of the parent's class)
    commands = cast(
        "Commands", parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    )
    for add_commands in (
        add_running_commands,
        add_report_commands,
        add_check_commands,
        add_tool_commands,
    ):
        add_commands(commands)
    return parser


def installed_version() -> str:
    """The installed distribution's version (a wheel's, or an editable install's)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pytest-hemra")
    except PackageNotFoundError:  # run from a source tree never installed
        from pytest_hemra import __version__

        return __version__


def unknown_flags(command: str, words: Sequence[str], unknown: Sequence[str]) -> str:
    """The refusal of flags the command does not know (`unknown`, of the command line `words`),
    saying what to type instead."""
    named = " ".join(unknown)
    if command == "run":
        kept = list(words)
        for word in unknown:
            kept.remove(word)
        return (
            f"hemra run: unknown flag {named}; put pytest's flags after --:"
            f" {shlex.join(['hemra', *kept, '--', *unknown])}"
        )
    if command == "check" and "-k" in unknown:
        return "hemra check: unknown flag -k (attempts per task: --attempts N)"
    return f"hemra {command}: unknown argument {named} (hemra {command} --help lists its flags)"


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    ours, passed = (
        (words[: words.index("--")], words[words.index("--") + 1 :])
        if "--" in words
        else (words, [])
    )
    args, unknown = build_parser().parse_known_args(ours)
    if unknown:
        print(f"hemra: {unknown_flags(args.command, ours, unknown)}", file=sys.stderr)
        return int(Exit.REFUSED)
    args.pytest_args = passed
    try:
        return int(args.handler(args))
    except HemraError as error:
        print(f"hemra: {error}", file=sys.stderr)
        return int(Exit.REFUSED)
    except KeyboardInterrupt:
        print("hemra: interrupted", file=sys.stderr)
        return int(Exit.INTERRUPTED)
    except BrokenPipeError:  # `hemra show ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # flushed at exit
        return int(Exit.OK)


__all__ = ["build_parser", "installed_version", "main"]
