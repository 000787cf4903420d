"""Arguments several commands share: the store they read, and the viewer's address; and how a
command finds its store, a run and a trial in it, saying where it looked when it cannot."""

from __future__ import annotations

import argparse
import re
import sys
from typing import TYPE_CHECKING, NoReturn, TypeAlias

from pytest_hemra.cli.exits import Exit
from pytest_hemra.core.errors import HemraError
from pytest_hemra.core.ids import (
    TRIAL_ID_PATTERN,
    malformed_trial_id,
    unknown_run,
    unknown_trial,
)
from pytest_hemra.core.names import unknown_name
from pytest_hemra.core.store_location import STORE_HELP, store_location

if TYPE_CHECKING:
    from pytest_hemra.store import Store

    # what `add_subparsers` returns, each group's `add_commands` adds to; argparse names it private
    Commands: TypeAlias = argparse._SubParsersAction["Parser"]


class Parser(argparse.ArgumentParser):
    """argparse's parser, refusing a wrong command line with HEMRA's code for refused input (4)
    rather than argparse's 2, which HEMRA keeps for an interrupted run."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if choice is not None:  # a mistyped command or choice: the closest, and what exists
            known = re.findall(r"'([^']*)'", choice.group(2))
            what = "command" if message.startswith("argument COMMAND") else "choice"
            message = message[: choice.start()] + unknown_name(what, choice.group(1), known)
        self.exit(int(Exit.REFUSED), f"{self.prog}: error: {message}\n")


def add_store_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", metavar="PATH|URL", help=STORE_HELP)


def add_viewer_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host", default="127.0.0.1", help="viewer address; beyond loopback it needs a token"
    )
    parser.add_argument("--port", type=int, default=8765, help="viewer port (0: any free one)")


def open_store(option: str | None) -> Store:
    """The store `--store`, `$HEMRA_STORE` or the current folder names; none there is refused,
    naming where HEMRA looked."""
    from pytest_hemra.store import Store

    location = store_location(option)
    if not location.exists():
        raise HemraError(
            f"no store at {location.describe()}: `hemra run` records one there when run from"
            " this folder"
        )
    return Store(location.address)


def find_run(store: Store, option: str | None, run_id: str) -> str:
    """`run_id`, checked to be in the store; else a message with its form and the store's runs."""
    known = [run.id for run in store.runs()]
    if run_id not in known:
        raise HemraError(unknown_run(run_id, store_location(option).describe(), known))
    return run_id


def find_trial(store: Store, option: str | None, trial_id: str) -> str:
    """`trial_id` (RUN_ID.NNNNN), checked to be in the store, else said what is wrong with it."""
    match = TRIAL_ID_PATTERN.fullmatch(trial_id)
    if match is None:
        raise HemraError(malformed_trial_id(trial_id))
    run_id = find_run(store, option, match.group("run"))
    trials = store.trials(run_id, history=True)
    if trial_id not in {trial.id for trial in trials}:
        raise HemraError(unknown_trial(trial_id, run_id, len(trials)))
    return trial_id
