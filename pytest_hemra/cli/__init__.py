"""`hemra`: a thin command line over the pytest plugin, plus the store's views.

`hemra run` maps its flags onto the plugin's `--hemra-*` options and runs pytest in-process;
everything after `--` goes to pytest unchanged (`-- -v --junitxml=report.xml`).

One module per command group (`running`: run and the queue; `reports`: what a run left;
`checking`: a dataset's health; `tools`: set-up and checks), each adding its commands with
`add_commands`. Building the parser imports almost nothing: a command's heavy modules load
inside its handler.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pytest_hemra.cli.checking import add_commands as add_check_commands
from pytest_hemra.cli.reports import add_commands as add_report_commands
from pytest_hemra.cli.running import add_commands as add_running_commands
from pytest_hemra.cli.tools import add_commands as add_tool_commands
from pytest_hemra.core.errors import HemraError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hemra", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for add_commands in (
        add_running_commands,
        add_report_commands,
        add_check_commands,
        add_tool_commands,
    ):
        add_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    ours, passed = (
        (words[: words.index("--")], words[words.index("--") + 1 :])
        if "--" in words
        else (words, [])
    )
    args = build_parser().parse_args(ours)
    args.pytest_args = passed
    try:
        return int(args.handler(args))
    except HemraError as error:
        print(f"hemra: {error}", file=sys.stderr)
        return 2


__all__ = ["build_parser", "main"]
