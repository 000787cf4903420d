"""`hemra`: a thin command line over the pytest plugin, plus the store's views.

`hemra run` maps its flags onto the plugin's `--hemra-*` options and runs pytest in-process;
everything after `--` goes to pytest unchanged (`-- -v --junitxml=report.xml`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from tabulate import tabulate

from pytest_hemra.errors import HemraError, SpecError
from pytest_hemra.plugin import DEFAULT_STORE, SESSION
from pytest_hemra.report import render_run
from pytest_hemra.spec import Overrides, load_run_spec
from pytest_hemra.store import Store
from pytest_hemra.trial import SCORED_OUTCOMES

UNFINISHED_EXIT = 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hemra", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="evaluate harnesses on datasets (a pytest session)")
    run.add_argument("run_file", nargs="?", help="run file (TOML); flags alone also work")
    run.add_argument("-H", "--harness", action="append", default=[], help="harness (replaces)")
    run.add_argument("-d", "--dataset", action="append", default=[], help="dataset (replaces)")
    run.add_argument("-k", "--attempts", type=int, help="attempts per task (replaces)")
    run.add_argument("-t", "--task", action="append", default=[], help="task glob (replaces)")
    run.add_argument("-x", "--exclude", action="append", default=[], help="task glob to leave out")
    run.add_argument("--baseline", help="harness the others are compared to (replaces)")
    run.add_argument("--concurrency", type=int, help="trials at once, via pytest-xdist -n")
    run.add_argument("--sandbox", help="sandbox provider (replaces)")
    run.add_argument("--require", action="append", default=[], help="sandbox capability (adds)")
    run.add_argument("--verifier-env", action="append", default=[], help="env name (adds)")
    run.add_argument("--judge", action="append", default=[], help="judge (adds)")
    run.add_argument("--store", help="SQLite store (default .hemra/hemra.db beside the run file)")

    report = commands.add_parser("report", help="print a run's tables from the store")
    report.add_argument("run_id", nargs="?", help="run id (default: the latest run)")
    report.add_argument("--store", default=str(DEFAULT_STORE))

    runs = commands.add_parser("runs", help="list the runs in a store")
    runs.add_argument("--store", default=str(DEFAULT_STORE))

    harness = commands.add_parser("harness", help="harness installs")
    harness_commands = harness.add_subparsers(dest="harness_command", required=True)
    install = harness_commands.add_parser(
        "install", help="install a harness version into the host cache (once per digest)"
    )
    install.add_argument("names", nargs="+", metavar="NAME")
    install.add_argument("--dir", default=".", help="folder whose harnesses/ is searched first")

    image = commands.add_parser("image", help="sandbox images")
    image_commands = image.add_subparsers(dest="image_command", required=True)
    bootstrap = image_commands.add_parser(
        "bootstrap", help="build the offline Debian base image (debootstrap + docker import)"
    )
    bootstrap.add_argument("--tag", default="debian:bookworm-slim")
    bootstrap.add_argument("--suite", default="bookworm")
    bootstrap.add_argument("--mirror", help="Debian mirror (default: apt's configured one)")
    bootstrap.add_argument(
        "--if-missing", action="store_true", help="do nothing when the tag already exists"
    )
    return parser


def pytest_argv(args: argparse.Namespace) -> list[str]:
    argv: list[str] = []
    if args.run_file:
        argv += ["--hemra-run", args.run_file]
    for flag, values in (
        ("--hemra-harness", args.harness),
        ("--hemra-dataset", args.dataset),
        ("--hemra-task", args.task),
        ("--hemra-exclude", args.exclude),
        ("--hemra-require", args.require),
        ("--hemra-verifier-env", args.verifier_env),
        ("--hemra-judge", args.judge),
    ):
        for value in values:
            argv += [flag, value]
    for flag, value in (
        ("--hemra-attempts", args.attempts),
        ("--hemra-baseline", args.baseline),
        ("--hemra-sandbox", args.sandbox),
        ("--hemra-store", args.store),
    ):
        if value is not None:
            argv += [flag, str(value)]
    if args.concurrency and args.concurrency > 1:
        argv += ["-n", str(args.concurrency)]
    return ["-p", "no:cacheprovider", *argv, *args.pytest_args]


class _RunCapture:
    """Remembers which run and store the pytest session used, for the exit status."""

    run_id: str | None = None
    store_path: Path | None = None

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        hemra = session.config.stash.get(SESSION, None)
        if hemra is not None and hemra.run is not None and hemra.store is not None:
            self.run_id, self.store_path = hemra.run.id, hemra.store.path


def run_command(args: argparse.Namespace) -> int:
    if not (args.run_file or args.harness or args.dataset):
        print("hemra run: name a run file, or harnesses (-H) and datasets (-d)", file=sys.stderr)
        return 4
    if args.concurrency is None and args.run_file:
        args.concurrency = _file_concurrency(Path(args.run_file))
    capture = _RunCapture()
    code = int(pytest.main(pytest_argv(args), plugins=[capture]))
    if code in (2, 3, 4) or capture.run_id is None or capture.store_path is None:
        return code
    store = Store(capture.store_path)
    unfinished = [
        t
        for t in store.trials(capture.run_id)
        if t.status != "deselected" and (not t.is_finished or t.outcome not in SCORED_OUTCOMES)
    ]
    return UNFINISHED_EXIT if unfinished else 0


def _file_concurrency(run_file: Path) -> int | None:
    """The run file's `concurrency`; a malformed file is left for pytest to report."""
    try:
        return load_run_spec(run_file, Overrides()).concurrency
    except SpecError:
        return None


def report_command(args: argparse.Namespace) -> int:
    store = _open_store(args.store)
    run_id = args.run_id or _latest_run(store)
    print(render_run(store, run_id))
    return 0


def runs_command(args: argparse.Namespace) -> int:
    store = _open_store(args.store)
    rows = []
    for run in store.runs():
        trials = store.trials(run.id)
        finished = sum(1 for t in trials if t.is_finished)
        rows.append(
            [
                run.id,
                run.name,
                run.status,
                f"{finished}/{len(trials)}",
                ", ".join(run.spec["spec"]["harnesses"]),
                ", ".join(run.spec["datasets"]),
            ]
        )
    print(tabulate(rows, headers=["run", "name", "status", "finished", "harnesses", "datasets"]))
    return 0


def image_command(args: argparse.Namespace) -> int:
    from pytest_hemra.sandbox.base_image import bootstrap_base_image, has_image

    if args.if_missing and has_image(args.tag):
        print(f"{args.tag} is already on this docker engine")
        return 0
    print(f"built {bootstrap_base_image(args.tag, args.suite, args.mirror)}")
    return 0


def harness_command(args: argparse.Namespace) -> int:
    from pytest_hemra.harnesses import resolve_harness
    from pytest_hemra.installs import ensure_installed, is_installed

    for name in args.names:
        harness = resolve_harness(name, Path(args.dir).resolve(), "command line", None)
        was_cached = is_installed(harness)
        installed = ensure_installed(harness)
        if installed is None:
            print(f"{name}: nothing to install (no package)")
        else:
            state = "already installed" if was_cached else "installed"
            print(f"{name}: {state} in {installed.directory}")
    return 0


def _open_store(path: str) -> Store:
    if not Path(path).is_file():
        raise HemraError(f"{path}: no store here (pass --store PATH)")
    return Store(Path(path))


def _latest_run(store: Store) -> str:
    runs = store.runs()
    if not runs:
        raise HemraError(f"{store.path}: the store holds no runs")
    return runs[-1].id


COMMANDS: dict[str, Any] = {
    "run": run_command,
    "report": report_command,
    "runs": runs_command,
    "image": image_command,
    "harness": harness_command,
}


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
        return int(COMMANDS[args.command](args))
    except HemraError as error:
        print(f"hemra: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
