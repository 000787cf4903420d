"""Where the store is: one rule for `pytest --hemra-run` and every `hemra` command.

`--store PATH` (`--hemra-store PATH` under pytest) when given, else the `HEMRA_STORE` environment
variable, else `.hemra/hemra.db` in the current folder. A run writes there and every command
reads there, so what a run recorded is found from the folder it was started in, whichever folder
its run file is in. Trial folders go beside the store (`.hemra/runs/RUN_ID/...`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pytest_hemra.core.records import DEFAULT_STORE

STORE_VARIABLE = "HEMRA_STORE"


@dataclass(frozen=True)
class StoreLocation:
    """A store's path and what named it: an option (`--store`), `HEMRA_STORE`, or the default."""

    path: Path
    named_by: str

    @property
    def is_default(self) -> bool:
        return self.named_by == "default"

    def describe(self) -> str:
        """The path and why it is the one: for messages that say where HEMRA looked."""
        if self.is_default:
            return (
                f"{self.path} (the default store: .hemra/hemra.db in the current folder;"
                f" --store PATH or {STORE_VARIABLE} names another)"
            )
        return f"{self.path} (from {self.named_by})"


def store_location(option: str | None, flag: str = "--store") -> StoreLocation:
    """The store an option names, else `$HEMRA_STORE`'s, else the current folder's."""
    if option:
        return StoreLocation(Path(option).absolute(), flag)
    named = os.environ.get(STORE_VARIABLE, "")
    if named:
        return StoreLocation(Path(named).absolute(), STORE_VARIABLE)
    return StoreLocation(Path.cwd() / DEFAULT_STORE, "default")


STORE_DEFAULT = f"default: ${STORE_VARIABLE}, else .hemra/hemra.db in the current folder"
STORE_HELP = f"SQLite store ({STORE_DEFAULT})"
