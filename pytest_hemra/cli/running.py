"""Running and the queue: `hemra run` (a pytest session, or `--detach`ed onto the queue),
`hemra worker` working the queue (`hemra serve`: a worker and the viewer), `hemra cancel`, and
`hemra runs` listing what the store holds."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_hemra.cli.arguments import (
    add_store_argument,
    add_viewer_arguments,
    find_run,
    open_store,
)
from pytest_hemra.cli.exits import exit_codes_text
from pytest_hemra.cli.reports import add_wide_argument
from pytest_hemra.core.errors import HemraError
from pytest_hemra.core.lifecycle import RUN_WAITING, JobState, RunStatus, TrialStatus
from pytest_hemra.core.outcome import Outcome
from pytest_hemra.core.store_location import STORE_HELP, store_location
from pytest_hemra.core.text import printable
from pytest_hemra.core.words import plural
from pytest_hemra.resolve.overrides import OVERRIDE_FLAGS, positive_int, read_overrides

if TYPE_CHECKING:
    from pytest_hemra.cli.arguments import Commands
    from pytest_hemra.core.records import RunRecord
    from pytest_hemra.store import Store

# `hemra runs`' counts, its table's columns and its JSON's keys: trials `done` (with an outcome),
# jobs `running` (held by a runner) and `queued`, trials `cancelled`
DONE, RUNNING, QUEUED, CANCELLED = "done", "running", "queued", "cancelled"  # not a lifecycle state
LEFT = "left"  # its JSON's trials without a result: cancelled, or not run yet
# `hemra run`'s pytest flags, which a session alone has: (flag, its `args` name)
SESSION_FLAGS = (("-k", "keyword"), ("-n", "numprocesses"), ("--junitxml", "junitxml"))


def add_commands(commands: Commands) -> None:
    run = commands.add_parser(
        "run",
        help="evaluate harnesses on datasets (a pytest session)",
        description="Evaluate harnesses on datasets: a pytest session, its trials recorded in"
        " the store. -k, -n, --junitxml and -v are pytest's; any other pytest flag goes after"
        " -- (hemra run run.toml -- --maxfail=3).",
        epilog=exit_codes_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("run_file", nargs="?", help="run file (TOML); flags alone also work")
    for flag in OVERRIDE_FLAGS:
        run.add_argument(
            *flag.flags,
            dest=flag.field,
            type=flag.type,
            metavar=flag.metavar,
            help=flag.help,
            action="append" if flag.repeats else "store",
            default=[] if flag.repeats else None,
        )
    run.add_argument("--store", metavar="PATH|URL", help=STORE_HELP)
    run.add_argument(
        "--detach",
        action="store_true",
        help="record and queue the run for `hemra worker` or `hemra serve`; return",
    )
    run.add_argument(
        "--dry-run", action="store_true", help="print the resolved plan; run and record nothing"
    )
    add_wide_argument(run)
    run.add_argument("--resume", metavar="RUN_ID", help="finish a recorded run")
    run.add_argument(
        "--resume-cancelled", action="store_true", help="with --resume, run cancelled trials too"
    )
    run.add_argument(
        "--fail-on",
        action="append",
        default=[],
        metavar="GATE",
        help="also exit 1 on: failure, regression, score<X, HARNESS:score<X"
        " (unfinished always counts)",
    )
    run.add_argument("--compare", metavar="RUN_ID", help="compare with an earlier run's harnesses")
    run.add_argument("--summary", metavar="PATH", help="write the report as JSON here, for CI")
    pytests = run.add_argument_group("pytest's flags (any other goes after --)")
    pytests.add_argument(
        "-k",
        dest="keyword",
        metavar="EXPR",
        help="run only the trials whose names match (pytest's -k: -k 'oracle and fix-test')",
    )
    pytests.add_argument(
        "-n",
        dest="numprocesses",
        metavar="N",
        help="worker processes sharing the run (pytest-xdist's -n: a number, or auto)",
    )
    pytests.add_argument(
        "--junitxml", metavar="PATH", help="write a JUnit XML file: one testcase per trial"
    )
    pytests.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="pytest's own output (its session, failures and summary) instead of HEMRA's lines",
    )
    run.set_defaults(handler=run_command)

    worker = commands.add_parser(
        "worker",
        help="work the shared queue on this machine's Docker engine",
        description="Work the store's queue: run the trials of every runnable run (or --run's)"
        " on this machine's engine (DOCKER_HOST, or the run's engine pool), with this"
        " machine's gateway and keys, beside other workers of the same store (a PostgreSQL"
        " store: on other machines). Stopped (SIGINT, SIGTERM), it queues its running"
        " trials again for the others; killed, its leases expire and the others take them.",
    )
    add_worker_arguments(worker)
    worker.set_defaults(handler=worker_command)

    serve = commands.add_parser("serve", help="work the queue of detached runs, with the viewer")
    add_worker_arguments(serve)
    add_viewer_arguments(serve)
    serve.add_argument("--no-viewer", action="store_true", help="work the queue only")
    serve.set_defaults(handler=serve_command)

    cancel = commands.add_parser("cancel", help="cancel a run's queued and running trials")
    cancel.add_argument("run_id", help="the run to cancel, as `hemra runs` lists it")
    add_store_argument(cancel)
    cancel.add_argument("--wait", type=float, default=10.0, help="seconds to wait for runners")
    cancel.set_defaults(handler=cancel_command)

    runs = commands.add_parser(
        "runs",
        help="list the runs in a store",
        description="List the runs in a store; under the table, anything the engine kept that"
        " HEMRA could not remove (a run's network, a firewall chain), with what to do, as the"
        " last runner to start found it.",
    )
    add_store_argument(runs)
    runs.add_argument(
        "--format", choices=("table", "json"), default="table", help="json: a list, for scripts"
    )
    runs.add_argument("-q", "--quiet", action="store_true", help="run ids only, one a line")
    add_wide_argument(runs)
    runs.set_defaults(handler=runs_command)


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    add_store_argument(parser)
    parser.add_argument("--run", metavar="RUN_ID", help="work this run only")
    parser.add_argument(
        "--concurrency",
        type=positive_int,
        metavar="N",
        help="trials at once per run (default: each run's own 'concurrency')",
    )
    parser.add_argument("--once", action="store_true", help="exit when the queue is empty")


def pytest_argv(args: argparse.Namespace) -> list[str]:
    """`hemra run`'s flags as the plugin's `--hemra-*` options, then what followed `--`."""
    argv: list[str] = []
    if args.run_file:
        argv += ["--hemra-run", args.run_file]
    for flag in OVERRIDE_FLAGS:
        value = getattr(args, flag.field)
        values = value if flag.repeats else [] if value is None else [value]
        argv += [word for each in values for word in (flag.option, str(each))]
    for gate in ["unfinished", *args.fail_on]:
        argv += ["--hemra-fail-on", gate]
    if args.resume_cancelled:
        argv += ["--hemra-resume-cancelled"]
    if getattr(args, "wide", False):
        argv += ["--hemra-wide"]
    for option, value in (
        ("--hemra-resume", args.resume),
        ("--hemra-compare", args.compare),
        ("--hemra-summary", args.summary),
        ("--hemra-store", args.store),
    ):
        if value is not None:
            argv += [option, str(value)]
    for option, value in (
        ("-k", args.keyword),
        ("-n", args.numprocesses),
        ("--junitxml", args.junitxml),
    ):
        if value is not None:
            argv += [f"{option}={value}"]
    argv += ["-v"] * args.verbose
    # a run's session measures nothing with pytest-benchmark, which warns under xdist when
    # installed beside HEMRA: kept out, so a refusal stays one line
    return ["-p", "no:cacheprovider", "-p", "no:benchmark", *argv, *args.pytest_args]


def run_command(args: argparse.Namespace) -> int:
    """A pytest session; its exit status is the gates': 0 when every trial has a result."""
    import pytest

    if not (args.run_file or args.harnesses or args.datasets or args.resume):
        raise HemraError("hemra run: name a run file, or harnesses (-H) and datasets (-d)")
    session_only = [flag for flag, value in SESSION_FLAGS if getattr(args, value)]
    if (args.detach or args.dry_run) and session_only:
        mode = "--detach" if args.detach else "--dry-run"
        raise HemraError(f"{', '.join(session_only)}: a pytest session's, not {mode}'s")
    if args.detach or args.dry_run:
        return detach_command(args)  # nothing runs: a refusal is hemra's own (exit 4 too)
    if args.numprocesses is not None and find_spec("xdist") is None:
        raise HemraError("-n needs pytest-xdist: pip install 'pytest-hemra[xdist]'")
    if not args.resume:
        check_named(args)
    from pytest_hemra.plugin.reporter import Output

    return int(pytest.main(pytest_argv(args), plugins=[Output()]))


def check_named(args: argparse.Namespace) -> None:
    """The run file's keys and values, and the harness and dataset files it names, checked
    before pytest starts, so the refusals most made take a fraction of a session's start (its
    plug-ins, the sandbox and kind registry); the session resolves the rest, as it would
    anyway (kinds a conftest.py adds are known only there). In this process, so what it
    imports the session has already."""
    from pytest_hemra.resolve.datasets import find_dataset
    from pytest_hemra.resolve.harnesses import find_harness
    from pytest_hemra.resolve.spec import load_run_spec

    run_file = Path(args.run_file) if args.run_file else None
    spec = load_run_spec(run_file, read_overrides(lambda flag: getattr(args, flag.field)))
    source = str(run_file) if run_file is not None else "command line"
    base_dir = run_file.resolve().parent if run_file is not None else Path.cwd()
    for name in spec.harnesses:
        find_harness(name, base_dir, source)
    for ref in spec.datasets:
        if "@" not in ref:  # name@version or name@digest: maybe the registry's, read later
            find_dataset(ref, base_dir, source)


def detach_command(args: argparse.Namespace) -> int:
    """Resolve and record the run with its jobs queued, print its id, and return; with
    `--dry-run`, print the resolved plan instead and record nothing."""
    from pytest_hemra.core import registry
    from pytest_hemra.execute.provisioning import describe, provision
    from pytest_hemra.execute.sandbox import SandboxProvider
    from pytest_hemra.resolve.plan import record_plan, resolve_plan
    from pytest_hemra.store import Store

    overrides = read_overrides(lambda flag: getattr(args, flag.field))
    run_file = Path(args.run_file) if args.run_file else None
    found = registry.sandbox_providers()
    if args.dry_run:
        plan = resolve_plan(run_file, overrides, Path.cwd())
        provision(plan, found, check_sandbox=False)
        try:
            provider: SandboxProvider | None = found[plan.spec.sandbox.provider]()
        except HemraError:
            provider = None
        print(describe(plan, provider))
        return 0
    plan = resolve_plan(run_file, overrides, Path.cwd())
    provision(plan, found, note=lambda line: print(line, file=sys.stderr))
    store = Store(store_location(args.store).address)
    run_id = record_plan(plan, store, status=RunStatus.QUEUED)
    print(run_id)
    print(
        f"queued {plural(len(plan.trials), 'trial')} in {store.name}; `hemra worker` (or"
        " `hemra serve`, a worker with the viewer) runs them",
        file=sys.stderr,
    )
    return 0


def worker_command(args: argparse.Namespace) -> int:
    """Work the queue until stopped (or, with --once, until it is empty)."""
    from pytest_hemra.run.supervisor import Worker

    store = open_store(args.store)
    run_id = find_run(store, args.store, args.run) if args.run else None
    return Worker(store.address, args.concurrency, run_id).serve(once=args.once)


def serve_command(args: argparse.Namespace) -> int:
    """A worker, with the viewer beside it (a warning, not an error, if it cannot listen)."""
    from contextlib import nullcontext

    from pytest_hemra.run.supervisor import Worker
    from pytest_hemra.viewer.server import running_viewer

    store = open_store(args.store)
    run_id = find_run(store, args.store, args.run) if args.run else None
    viewer = (
        nullcontext()
        if args.no_viewer
        else running_viewer(store.address, args.host, args.port, required=False)
    )
    with viewer:
        worker = Worker(store.address, args.concurrency, run_id, name="hemra serve")
        return worker.serve(once=args.once)


def cancel_command(args: argparse.Namespace) -> int:
    """Cancel queued trials now; ask running ones to stop and remove their sandboxes."""
    from pytest_hemra.core.errors import InfraError
    from pytest_hemra.run.cancellation import cancel_run
    from pytest_hemra.run.job import run_provider

    store = open_store(args.store)
    find_run(store, args.store, args.run_id)
    done = cancel_run(store, args.run_id, run_provider(store, args.run_id), args.wait)
    cancelled = plural(done.cancelled, "trial")
    removed = plural(done.removed, "sandbox", "sandboxes")
    print(f"run {args.run_id}: {cancelled} cancelled, {removed} removed")
    if done.engine_down:  # the run is cancelled: its engine's sandboxes go when it is back
        print(
            f"run {args.run_id}: its engine does not answer ({done.sandbox_error}); its"
            " sandboxes there are removed when it answers again (by the next runner on it,"
            " or hemra cancel again)"
        )
    elif done.sandbox_error is not None:
        raise InfraError(done.sandbox_error)
    return 0


def runs_command(args: argparse.Namespace) -> int:
    """Every run, oldest first: a table (fitting the terminal), a JSON list (`--format json`)
    or ids (`-q`)."""
    from pytest_hemra.core.terminal import fit_table, left_out_line, output_width, wrap_line

    store = open_store(args.store)
    if args.quiet:
        for run in store.runs():
            print(run.id)
        return 0
    listed = [run_summary(store, run) for run in store.runs()]
    if args.format == "json":
        print(json.dumps(listed, indent=2))
        return 0
    rows = [
        [
            run["id"],
            run["name"],
            _status(run),
            f"{run[DONE]}/{run['trials']}",
            run[RUNNING],
            run[QUEUED],
            run[CANCELLED],
            ", ".join(run["harnesses"]),
            ", ".join(run["datasets"]),
        ]
        for run in listed
    ]
    headers = ["run", "name", "status", DONE, RUNNING, QUEUED, CANCELLED]
    width = output_width(args.wide)
    keep = ["run", "status", DONE, "name", RUNNING, QUEUED, CANCELLED]
    fitted = fit_table(
        [*headers, "harnesses", "datasets"], rows, width, keep=keep, numbers_right=True
    )
    print(fitted.text)
    if fitted.dropped:
        print(left_out_line(fitted.dropped, width))
    for name, why in store.engine_kept().items():  # as the last runner to start found them
        print(wrap_line(printable(f"! the engine kept {name}: {why}"), width))
    return 0


def _status(run: dict[str, Any]) -> str:
    """The run's status as the table shows it: an interrupted run's with what a resume runs."""
    engines = ", ".join(str(wait["engine"]) for wait in run["waiting"])
    if engines:
        return f"{run['status']} for engine {engines}"
    if run["status"] == RunStatus.INTERRUPTED:
        return f"{run['status']} ({run[LEFT]} left)"
    return str(run["status"])


def run_summary(store: Store, run: RunRecord) -> dict[str, Any]:
    """One run as `hemra runs` lists it: `done` of its `trials` (deselected ones left out), the
    jobs `running` and `queued` now, the trials `cancelled`, those `left` without a result
    (what a resume of an interrupted run runs), its harnesses and datasets; a running run
    some of whose trials wait for their engine is `waiting` (`waiting` says for which engine,
    since when and how many trials)."""
    # counted by the store (its run, status and outcome index), not read trial by trial: a
    # run of 150,000 trials is listed in milliseconds
    found = store.trial_counts(run.id).get(run.id)
    statuses, outcomes = (found.statuses, found.outcomes) if found else ({}, {})
    total = sum(n for status, n in statuses.items() if status != TrialStatus.DESELECTED)
    states = store.job_counts(run.id)
    waits = store.engine_waits(run.id).get(run.id, []) if run.status == RunStatus.RUNNING else []
    return {
        "id": run.id,
        "name": run.name,
        "status": RUN_WAITING if waits else run.status,
        "waiting": [asdict(wait) for wait in waits],
        "created_at": run.created_at,
        DONE: sum(statuses.get(status, 0) for status in TrialStatus.OVER),
        "trials": total,
        RUNNING: sum(states.get(state, 0) for state in JobState.LIVE),
        QUEUED: states.get(JobState.QUEUED, 0),
        CANCELLED: outcomes.get(Outcome.CANCELLED, 0),
        LEFT: total - statuses.get(TrialStatus.FINISHED, 0),
        "harnesses": list(run.plan.harness_names),
        "datasets": list(run.plan.datasets),
    }
