"""What the red-team suites share: a run of some harnesses on the test's dataset `ds`, through
pytest with HEMRA, and its trials read back from the store, one row a harness."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest


def trial_rows(store: Path) -> dict[str, dict[str, Any]]:
    """Every trial row of the store, by harness (one trial each)."""
    connection = sqlite3.connect(store)
    connection.row_factory = sqlite3.Row
    rows = {r["harness"]: dict(r) for r in connection.execute("SELECT * FROM trials")}
    connection.close()
    return rows


def run_harnesses(
    pytester: pytest.Pytester, tmp_path: Path, harnesses: list[str], extra: str = ""
) -> dict[str, dict[str, Any]]:
    """A run of `harnesses` on dataset `ds` (run-file lines `extra` added), its trial rows."""
    run_file = tmp_path / "run.toml"
    names = ", ".join(f'"{h}"' for h in harnesses)
    run_file.write_text(f'harnesses = [{names}]\ndatasets = ["ds"]\n{extra}')
    pytester.runpytest("--hemra-run", str(run_file))
    return trial_rows(pytester.path / ".hemra" / "hemra.db")
