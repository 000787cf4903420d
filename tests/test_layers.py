"""The layer contracts in pyproject.toml hold for the tree, and fail on an import breaking one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.parametrize(
    ("module", "wrong_import", "refusal"),
    [
        (
            "core/records.py",
            "from pytest_hemra.run import trial",
            "pytest_hemra.core.records -> pytest_hemra.run.trial",
        ),
        (
            "report/stats.py",
            "from pytest_hemra.execute import sandbox",
            "report needs only core and the store BROKEN",
        ),
        (
            "viewer/params.py",
            "import sqlite3",
            "pytest_hemra.viewer is not allowed to import sqlite3",
        ),
    ],
    ids=["core-imports-the-runner", "report-reaches-a-sandbox", "sql-outside-the-store"],
)
def test_a_deliberately_wrong_import_breaks_its_contract(
    tmp_path: Path, module: str, wrong_import: str, refusal: str
) -> None:
    tree = _copy_tree(tmp_path)
    path = tree / "pytest_hemra" / module
    path.write_text(path.read_text() + f"\n{wrong_import}  # noqa\n")
    result = _lint(tree)
    assert result.returncode != 0
    assert refusal in result.stdout
