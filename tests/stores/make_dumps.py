"""Makes `schema-N.sql` (and `schema-N.postgres.sql` from schema 10, the first with PostgreSQL
stores) for every schema version HEMRA shipped from 2 to the one before the current: each
version's own code, at the last commit where `store/schema.py` (`store.py` before it) said
`SCHEMA_VERSION = N`, checked out into a temporary `git worktree`, runs `write_store.py`; the
store it wrote is dumped as SQL text (SQLite's `iterdump`; `pg_dump --inserts`).

    python tests/stores/make_dumps.py     # from the repository; rewrites tests/stores/*.sql
    python tests/stores/make_dumps.py 12  # only schema 12's

The older versions' code needs what they depended on (`pip install sqlite-utils`, which HEMRA
itself no longer does) and psycopg; PostgreSQL's server programs for the PostgreSQL dumps.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

from tests.postgres import PostgresServer, binaries  # noqa: E402

FIRST_POSTGRES = 10  # the first schema a PostgreSQL store was written with
# the commit that moved each schema version to the next: its parent is the version's last
MOVED_ON = {
    2: "13177b2",
    3: "7f4c30f",
    4: "7242646",
    5: "92ff3b0",
    6: "ee502b1",
    7: "7c34a55",
    8: "e60cacd",
    9: "fa71e45",
    10: "fe649e7",
    11: "cd016e2",
    12: "dad8fa9",
}


def git(*argv: str) -> str:
    return subprocess.run(
        ["git", *argv], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()


def write(worktree: Path, address: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(worktree)}
    subprocess.run(
        [sys.executable, str(HERE / "write_store.py"), address], check=True, env=env, cwd=worktree
    )


def main() -> None:
    chosen = {int(version) for version in sys.argv[1:]} or set(MOVED_ON)
    bin_dir = binaries()
    server = None
    if bin_dir is not None:
        server = PostgresServer(bin_dir)
        server.start()
    try:
        for version, commit in MOVED_ON.items():
            if version not in chosen:
                continue
            last = git("rev-parse", f"{commit}^")
            with tempfile.TemporaryDirectory(prefix=f"hemra-schema-{version}-") as folder:
                worktree = Path(folder) / "tree"
                git("worktree", "add", "--detach", str(worktree), last)
                try:
                    shown = (worktree / "pytest_hemra").rglob("*.py")
                    assert any(f"SCHEMA_VERSION = {version}\n" in p.read_text() for p in shown)
                    path = Path(folder) / "hemra.db"
                    write(worktree, str(path))
                    connection = sqlite3.connect(path)
                    dump = "\n".join(connection.iterdump()) + "\n"
                    connection.close()
                    (HERE / f"schema-{version}.sql").write_text(dump)
                    if version >= FIRST_POSTGRES and server is not None:
                        url = server.create_database()
                        write(worktree, url)
                        dumped = subprocess.run(
                            [str(bin_dir / "pg_dump"), "--inserts", "--no-owner",
                             "--no-privileges", url],
                            check=True, capture_output=True, text=True,
                        ).stdout  # fmt: skip
                        (HERE / f"schema-{version}.postgres.sql").write_text(dumped)
                    print(f"schema {version}: {last[:10]}")
                finally:
                    git("worktree", "remove", "--force", str(worktree))
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
