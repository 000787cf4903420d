"""A store address is printed without its password whatever its scheme or typo: `hemra runs`
and `hemra run` refuse an unknown scheme naming it, and no message shows the password."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_hemra.core.store_location import redacted, store_location

REPO = Path(__file__).resolve().parent.parent
HEMRA = [sys.executable, "-c", "import sys; from pytest_hemra.cli import main; sys.exit(main())"]


def hemra(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "HEMRA_STORE"}
    return subprocess.run(
        [*HEMRA, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240
    )


@pytest.mark.parametrize(
    ("address", "scheme"),
    [
        ("mysql://user:secret@host/db", "mysql"),
        ("postgressql://user:secret@host/db", "postgressql"),
    ],
)
def test_hemra_runs_refuses_an_unknown_scheme_without_printing_the_password(
    address: str, scheme: str, tmp_path: Path
) -> None:
    done = hemra(["runs", "--store", address], tmp_path)
    assert done.returncode == 4
    assert f"unknown store scheme {scheme!r}" in done.stderr
    assert "user:***@host/db" in done.stderr
    assert "secret" not in done.stdout + done.stderr
    assert list(tmp_path.iterdir()) == []


def test_hemra_run_refuses_a_misspelt_scheme_without_printing_the_password(
    tmp_path: Path,
) -> None:
    run_file = REPO / "examples" / "scripted-agent" / "run.toml"
    done = hemra(["run", str(run_file), "--store", "postgressql://user:secret@host/db"], tmp_path)
    assert done.returncode == 4
    assert "unknown store scheme 'postgressql'" in done.stderr
    assert "secret" not in done.stdout + done.stderr


def test_a_scheme_typo_without_slashes_is_named_without_its_password(tmp_path: Path) -> None:
    """`postgresql:/...` is no URL: HEMRA looks for a file of that name, and says so."""
    done = hemra(["runs", "--store", "postgresql:/user:secret@host/db"], tmp_path)
    assert done.returncode == 4 and "no store at" in done.stderr
    assert "secret" not in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("address", "shown"),
    [
        ("mysql://user:secret@host/db", "mysql://user:***@host/db"),
        ("postgressql://user:secret@host/db", "postgressql://user:***@host/db"),
        ("postgresql://user:p@ss@host:5432/db", "postgresql://user:***@host:5432/db"),
        ("sqlite://host/db?password=secret&x=1", "sqlite://host/db?password=***&x=1"),
        ("postgresql:/user:secret@host/db", "postgresql:***@host/db"),
        ("mysql:user:secret@host", "mysql:***@host"),
        ("postgresql://user@host/db", "postgresql://user@host/db"),
        ("/tmp/user@host/hemra.db", "/tmp/user@host/hemra.db"),
    ],
)
def test_any_address_is_printed_without_its_password(address: str, shown: str) -> None:
    assert redacted(address) == shown


def test_a_store_named_by_the_environment_is_described_without_its_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HEMRA_STORE", "postgresql://me:secret@db/x?password=secret")
    described = store_location(None).describe()
    assert "secret" not in described and "HEMRA_STORE" in described
