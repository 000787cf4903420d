"""`hemra check DATASET`: a dataset author's health check. The bundled `oracle` and `nop` run on
every task as a normal run (`hemra run -H oracle -H nop -d DATASET`, recorded like any other),
then each task gets its verdicts (`report.health`): broken, flaky, trivial, slow to build, its
verifier without the network it needs, or healthy."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pytest_hemra.cli.reports import add_wide_argument
from pytest_hemra.core.store_location import STORE_HELP
from pytest_hemra.report import SLOW_BUILD_SECS
from pytest_hemra.resolve.overrides import positive_int

if TYPE_CHECKING:
    from pytest_hemra.cli.arguments import Commands


def add_commands(commands: Commands) -> None:
    check = commands.add_parser(
        "check", help="run oracle and nop on a dataset's tasks; say which are broken, flaky..."
    )
    check.add_argument(
        "dataset", help="dataset name, name@digest, name@version or path (as `hemra run -d`)"
    )
    # not -k: that is pytest's selection, in `hemra run` as in pytest
    check.add_argument(
        "--attempts", type=positive_int, default=1, metavar="N", help="attempts per task"
    )
    check.add_argument(
        "-n", "--concurrency", type=positive_int, help="trials at once (threads of one process)"
    )
    check.add_argument(
        "-t",
        "--task",
        dest="tasks",
        action="append",
        default=[],
        metavar="GLOB",
        help="tasks to check",
    )
    check.add_argument(
        "-x", "--exclude", action="append", default=[], metavar="GLOB", help="tasks to leave out"
    )
    check.add_argument(
        "--pass-env",
        action="append",
        default=[],
        metavar="NAME",
        help="runner variable the tasks' env templates may read (as `hemra run --pass-env`)",
    )
    check.add_argument("--store", metavar="PATH|URL", help=STORE_HELP)
    add_wide_argument(check)
    check.add_argument(
        "--slow-build-secs",
        type=float,
        default=SLOW_BUILD_SECS,
        metavar="SECS",
        help=f"an image build past this is slow (default {SLOW_BUILD_SECS:g})",
    )
    check.add_argument(
        "--strict", action="store_true", help="also exit 1 on flaky, trivial or offline verifiers"
    )
    check.add_argument(
        "--format", choices=("table", "json"), default="table", help="json: an object, for scripts"
    )
    check.set_defaults(handler=check_command)


class RunSeen:
    """A pytest plug-in that notes the run the session recorded (the controller's: xdist
    workers report to it), so the verdicts can be read from the store afterwards."""

    def __init__(self) -> None:
        self.run_id: str | None = None
        self.store: str | None = None

    def pytest_sessionstart(self, session: Any) -> None:
        from pytest_hemra.plugin import CONTROLLER
        from pytest_hemra.plugin.controller import Controller

        controller = session.config.pluginmanager.get_plugin(CONTROLLER)
        if isinstance(controller, Controller) and controller.runner is not None:
            self.run_id = controller.runner.run.id
            self.store = controller.runner.store.address


def run_words(args: argparse.Namespace, kept: Sequence[str] = ()) -> list[str]:
    """The `hemra run` this check is; with `kept` (`dataset::task` names), the oracle again on
    those tasks alone, their processes kept for their verifiers."""
    from pytest_hemra.report.health import NOP, ORACLE

    harnesses = ["-H", ORACLE] if kept else ["-H", ORACLE, "-H", NOP]
    words = ["run", *harnesses, f"--dataset={args.dataset}", f"--attempts={args.attempts}"]
    if kept:
        words += [w for name in kept for w in ("-t", name.split("::", 1)[1])]
        words += [w for name in kept for w in ("--keep-agent-processes", name)]
    else:
        words += [w for glob in args.tasks for w in ("-t", glob)]
        words += [w for glob in args.exclude for w in ("-x", glob)]
    words += [w for name in args.pass_env for w in ("--pass-env", name)]
    if args.concurrency is not None:
        words += ["--concurrency", str(args.concurrency)]
    if args.store is not None:
        words += [f"--store={args.store}"]
    return words


def check_command(args: argparse.Namespace) -> int:
    """Run the check as `hemra run` would (its session's output on stderr), then print the
    verdicts on stdout. 1 when a task is broken; a refused input exits 4 and records nothing."""
    from contextlib import redirect_stdout

    import pytest

    from pytest_hemra.cli import build_parser
    from pytest_hemra.cli.running import pytest_argv
    from pytest_hemra.core.terminal import output_width
    from pytest_hemra.plugin.reporter import Output
    from pytest_hemra.report.health import (
        ORACLE,
        check_health,
        health_dict,
        left_listening,
        render_health,
        with_processes_kept,
    )
    from pytest_hemra.store import Store

    run_args = build_parser().parse_args(run_words(args))
    # quiet: nop's failures are expected, and the verdicts say what each one means
    run_args.pytest_args = ["-q", "--tb=no", "-rN", *args.pytest_args]
    seen = RunSeen()
    with redirect_stdout(sys.stderr):
        status = int(pytest.main(pytest_argv(run_args), plugins=[seen, Output()]))
    if seen.run_id is None or seen.store is None:
        return status or int(pytest.ExitCode.USAGE_ERROR)  # nothing was recorded
    store = Store(seen.store)
    (dataset,) = store.run(seen.run_id).plan.datasets
    health = check_health(store, seen.run_id, dataset, args.slow_build_secs)
    suspects = left_listening(health)
    if suspects:  # broken after the clean room killed what its oracle left listening: again
        again = build_parser().parse_args(run_words(args, [f"{dataset}::{t}" for t in suspects]))
        again.pytest_args = ["-q", "--tb=no", "-rN", *args.pytest_args]
        rerun = RunSeen()
        with redirect_stdout(sys.stderr):
            pytest.main(pytest_argv(again), plugins=[rerun, Output()])
        if rerun.run_id is not None:
            trials = Store(rerun.store or seen.store).trials(rerun.run_id)
            passed = {t.task for t in trials if t.harness == ORACLE and t.outcome == "pass"}
            health = with_processes_kept(health, passed)
    if args.format == "json":
        print(json.dumps(health_dict(health, args.strict), indent=2))
    else:
        print(render_health(health, output_width(args.wide)))
    if status not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        return status  # interrupted (what did not finish is unchecked) or pytest's own fault
    return health.exit_status(args.strict)
