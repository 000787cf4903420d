"""Arguments several commands share: the store they read, and the viewer's address."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from pytest_hemra.core.errors import HemraError
from pytest_hemra.core.records import DEFAULT_STORE

if TYPE_CHECKING:
    from pytest_hemra.store import Store

    # what `add_subparsers` returns, each group's `add_commands` adds to; argparse names it private
    Commands: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]


def add_store_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", default=str(DEFAULT_STORE))


def add_viewer_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host", default="127.0.0.1", help="viewer address; beyond loopback it needs a token"
    )
    parser.add_argument("--port", type=int, default=8765, help="viewer port (0: any free one)")


def open_store(path: str) -> Store:
    """The store an existing file holds; a path with none is the user's mistake, said so."""
    from pytest_hemra.store import Store

    if not Path(path).is_file():
        raise HemraError(f"{path}: no store here (pass --store PATH)")
    return Store(Path(path))
