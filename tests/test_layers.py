"""The layer contracts in pyproject.toml hold for the tree, and fail on an import breaking one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = [
    sys.executable,
    "-c",
    "from importlinter.cli import lint_imports_command; lint_imports_command()",
]


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [*LINT_IMPORTS, "--no-cache"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _copy_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    shutil.copytree(
        ROOT / "pytest_hemra", tree / "pytest_hemra", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    return tree


def test_the_tree_keeps_every_layer_contract(tmp_path: Path) -> None:
    result = _lint(_copy_tree(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout


def test_a_core_module_importing_the_runner_breaks_the_layers(tmp_path: Path) -> None:
    tree = _copy_tree(tmp_path)
    records = tree / "pytest_hemra" / "core" / "records.py"
    records.write_text(records.read_text() + "\nfrom pytest_hemra.run import trial  # noqa\n")
    result = _lint(tree)
    assert result.returncode != 0
    assert "pytest_hemra.core is not allowed to import pytest_hemra.run" in result.stdout
    assert "pytest_hemra.core.records -> pytest_hemra.run.trial" in result.stdout


def test_a_report_module_reaching_into_a_sandbox_is_refused(tmp_path: Path) -> None:
    tree = _copy_tree(tmp_path)
    stats = tree / "pytest_hemra" / "report" / "stats.py"
    stats.write_text(stats.read_text() + "\nfrom pytest_hemra.execute import sandbox  # noqa\n")
    result = _lint(tree)
    assert result.returncode != 0
    assert "report needs only core and the store BROKEN" in result.stdout


def test_sql_outside_the_store_is_refused(tmp_path: Path) -> None:
    tree = _copy_tree(tmp_path)
    tables = tree / "pytest_hemra" / "viewer" / "params.py"
    tables.write_text(tables.read_text() + "\nimport sqlite3  # noqa\n")
    result = _lint(tree)
    assert result.returncode != 0
    assert "pytest_hemra.viewer is not allowed to import sqlite3" in result.stdout
