"""`hemra`: a thin command line over the pytest plugin, plus the store's views.

`hemra run` maps its flags onto the plugin's `--hemra-*` options and runs pytest in-process;
everything after `--` goes to pytest unchanged (`-- -v --junitxml=report.xml`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from tabulate import tabulate

from pytest_hemra.core.errors import HemraError, SpecError
from pytest_hemra.plugin import DEFAULT_STORE
from pytest_hemra.report.comparison import compare_runs, render_comparison
from pytest_hemra.report.formats import FORMATS, render
from pytest_hemra.report.tables import build_report
from pytest_hemra.resolve.spec import Overrides, load_run_spec
from pytest_hemra.store import Store


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
    run.add_argument(
        "--detach", action="store_true", help="record and queue the run for `hemra serve`; return"
    )
    run.add_argument(
        "--dry-run", action="store_true", help="print the resolved plan; run and record nothing"
    )
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

    serve = commands.add_parser("serve", help="work the queue of detached runs")
    serve.add_argument("--store", default=str(DEFAULT_STORE))
    serve.add_argument("--concurrency", type=int, default=1, help="trials at once per run")
    serve.add_argument("--once", action="store_true", help="exit when the queue is empty")
    _viewer_arguments(serve)
    serve.add_argument("--no-viewer", action="store_true", help="work the queue only")

    view = commands.add_parser("view", help="browse the store's runs in the viewer (no queue)")
    view.add_argument("--store", default=str(DEFAULT_STORE))
    _viewer_arguments(view)

    cancel = commands.add_parser("cancel", help="cancel a run's queued and running trials")
    cancel.add_argument("run_id")
    cancel.add_argument("--store", default=str(DEFAULT_STORE))
    cancel.add_argument("--wait", type=float, default=10.0, help="seconds to wait for runners")

    report = commands.add_parser("report", help="a run's tables from the store, or two runs'")
    report.add_argument("run_id", nargs="?", help="run id (default: the latest run)")
    report.add_argument("other_run", nargs="?", help="a second run: compare each harness in it")
    report.add_argument("--store", default=str(DEFAULT_STORE))
    report.add_argument("--format", choices=FORMATS, default="text")
    report.add_argument("-o", "--output", help="write to this file (default: stdout)")

    show = commands.add_parser("show", help="one trial: outcome, rewards, phases, usage, calls")
    show.add_argument(
        "trial_id", help="a trial id (RUN_ID.NNNNN, as in the JUnit 'trial' property)"
    )
    show.add_argument("--store", default=str(DEFAULT_STORE))

    runs = commands.add_parser("runs", help="list the runs in a store")
    runs.add_argument("--store", default=str(DEFAULT_STORE))

    engines = commands.add_parser(
        "engines", help="a run file's Docker engines: health, capacity, running trials, images"
    )
    engines.add_argument("run_file", help="run file whose [[sandbox.engines]] to list")
    engines.add_argument("--store", help="store whose placements to count (default: beside it)")

    canary = commands.add_parser(
        "canary", help="check the gateway counts what an upstream reports, per wire format"
    )
    canary.add_argument(
        "--provider", default="scripted", help="built-in provider (default: the scripted model)"
    )
    canary.add_argument("--base-url", help="the upstream's URL (a provider of your own)")
    canary.add_argument("--auth", choices=("x-api-key", "bearer"), default="bearer")
    canary.add_argument("--key-env", help="environment variable holding the upstream's key")
    canary.add_argument("--model", default="hemra/scripted")
    canary.add_argument(
        "--wire",
        action="append",
        choices=("anthropic-messages", "openai-responses", "openai-chat"),
        help="wire formats to probe (repeatable; default all three)",
    )
    canary.add_argument(
        "--expect",
        choices=("response", "scripted"),
        default="response",
        help="the upstream's own numbers: what its responses say, or the scripted model's",
    )

    calibrate = commands.add_parser(
        "calibrate", help="score a judge against anchors with known scores (mean absolute error)"
    )
    calibrate.add_argument("run_file", nargs="?", help="run file whose [[judge]] to calibrate")
    calibrate.add_argument("--judge", required=True, help="judge name (or a rubric, with --model)")
    calibrate.add_argument("--model", help="the judge's model (default: the run file's)")
    calibrate.add_argument("--anchors", help="anchor file (default: the rubric's bundled anchors)")
    calibrate.add_argument("--threshold", type=float, default=0.15, help="drift past this MAE")
    calibrate.add_argument("--store", help="store to keep the result in (default .hemra/hemra.db)")

    init = commands.add_parser("init", help="write a starter run file, harness and dataset")
    init.add_argument("directory", nargs="?", default=".")

    listing = commands.add_parser("harnesses", help="list harnesses and what HEMRA observes")
    listing.add_argument("--dir", default=".", help="folder whose harnesses/ is searched first")

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
    for gate in ["unfinished", *args.fail_on]:
        argv += ["--hemra-fail-on", gate]
    if args.resume_cancelled:
        argv += ["--hemra-resume-cancelled"]
    for flag, value in (
        ("--hemra-resume", args.resume),
        ("--hemra-compare", args.compare),
        ("--hemra-summary", args.summary),
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


def run_command(args: argparse.Namespace) -> int:
    """A pytest session; its exit status is the gates': 0 when every trial has a result."""
    if not (args.run_file or args.harness or args.dataset or args.resume):
        print("hemra run: name a run file, or harnesses (-H) and datasets (-d)", file=sys.stderr)
        return 4
    if args.detach or args.dry_run:
        return detach_command(args)
    if args.concurrency is None and args.run_file:
        args.concurrency = _file_concurrency(Path(args.run_file))
    return int(pytest.main(pytest_argv(args)))


def detach_command(args: argparse.Namespace) -> int:
    """Resolve and record the run with its jobs queued, print its id, and return; with
    `--dry-run`, print the resolved plan instead and record nothing."""
    from pytest_hemra.execute.sandbox.docker import DockerProvider
    from pytest_hemra.resolve.plan import describe, record_plan, resolve_plan

    overrides = Overrides(
        harnesses=args.harness,
        datasets=args.dataset,
        attempts=args.attempts,
        tasks=args.task,
        exclude=args.exclude,
        baseline=args.baseline,
        sandbox=args.sandbox,
        require=args.require,
        verifier_env=args.verifier_env,
        judges=args.judge,
    )
    run_file = Path(args.run_file) if args.run_file else None
    if args.dry_run:
        plan = resolve_plan(
            run_file, overrides, Path.cwd(), {"docker": DockerProvider}, check_sandbox=False
        )
        try:
            provider: DockerProvider | None = DockerProvider()
        except HemraError:
            provider = None
        print(describe(plan, provider))
        return 0
    plan = resolve_plan(run_file, overrides, Path.cwd(), {"docker": DockerProvider})
    store = Store(Path(args.store) if args.store else plan.base_dir / DEFAULT_STORE)
    run_id = record_plan(plan, store, status="queued")
    print(run_id)
    print(
        f"queued {len(plan.trials)} trials in {store.path}; `hemra serve` runs them",
        file=sys.stderr,
    )
    return 0


def _file_concurrency(run_file: Path) -> int | None:
    """The run file's `concurrency` (with `[[sandbox.engines]]` and none given: the engines'
    capacities added up); a malformed file is left for pytest to report."""
    try:
        spec = load_run_spec(run_file, Overrides())
    except SpecError:
        return None
    if spec.sandbox.engines and "concurrency" not in spec.model_fields_set:
        return sum(engine.capacity for engine in spec.sandbox.engines)
    return spec.concurrency


def _viewer_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host", default="127.0.0.1", help="viewer address; beyond loopback it needs a token"
    )
    parser.add_argument("--port", type=int, default=8765, help="viewer port (0: any free one)")


def serve_command(args: argparse.Namespace) -> int:
    """Work the queue, with the viewer beside it (a warning, not an error, if it cannot listen)."""
    from contextlib import nullcontext

    from pytest_hemra.execute.sandbox.docker import DockerProvider
    from pytest_hemra.run.supervisor import Supervisor
    from pytest_hemra.viewer.server import running_viewer

    store = _open_store(args.store)
    viewer = (
        nullcontext()
        if args.no_viewer
        else running_viewer(store.path, args.host, args.port, DockerProvider(), required=False)
    )
    with viewer:
        return Supervisor(store.path, args.concurrency, DockerProvider()).serve(once=args.once)


def view_command(args: argparse.Namespace) -> int:
    """The viewer alone, until Ctrl-C or SIGTERM."""
    from pytest_hemra.execute.sandbox.docker import DockerProvider
    from pytest_hemra.viewer.server import running_viewer, wait_for_signal

    store = _open_store(args.store)
    with running_viewer(store.path, args.host, args.port, DockerProvider(), required=True):
        wait_for_signal()
    return 0


def cancel_command(args: argparse.Namespace) -> int:
    """Cancel queued trials now; ask running ones to stop and remove their sandboxes."""
    from pytest_hemra.core.errors import InfraError
    from pytest_hemra.execute.sandbox.docker import DockerProvider
    from pytest_hemra.run.cancellation import cancel_run

    store = _open_store(args.store)
    done = cancel_run(store, args.run_id, DockerProvider(), args.wait)
    print(f"run {args.run_id}: {done.cancelled} trials cancelled, {done.removed} sandboxes removed")
    if done.sandbox_error is not None:
        raise InfraError(done.sandbox_error)
    return 0


def report_command(args: argparse.Namespace) -> int:
    store = _open_store(args.store)
    run_id = args.run_id or _latest_run(store)
    if args.other_run:
        text = render_comparison(compare_runs(store, run_id, args.other_run), args.format)
    else:
        text = render(build_report(store, run_id), args.format)
    if args.output:
        Path(args.output).write_text(text if text.endswith("\n") else text + "\n")
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        print(text)
    return 0


def show_command(args: argparse.Namespace) -> int:
    """Everything the store holds of one trial, for a terminal (the viewer shows the rest)."""
    store = _open_store(args.store)
    detail = store.trial_detail(args.trial_id)
    trial = detail.trial
    reward = "-" if trial.reward is None else f"{trial.reward:g}"
    cost = "unknown" if trial.cost is None else f"${trial.cost:.4f}"
    lines = [
        f"trial {trial.id}: {trial.item_id}",
        f"  status {trial.status}, outcome {trial.outcome or '-'}, reward {reward}"
        + (f", class {trial.error_class}" if trial.error_class else "")
        + (f", retries {trial.retries} (replaces {trial.replaces})" if trial.replaces else ""),
        f"  rewards {json.dumps(trial.rewards, sort_keys=True)}",
        f"  tokens {trial.tokens} (input {detail.input_tokens}, output {detail.output_tokens},"
        f" cache read {detail.cache_read_tokens}, cache write {detail.cache_write_tokens});"
        f" {detail.calls} calls; cost {cost}",
        "  phases " + ", ".join(f"{k} {v:.2f}s" for k, v in detail.phases.items()),
        f"  worker {detail.worker or '-'}, job {detail.job_state or '-'}",
    ]
    if trial.error:
        lines.append(f"  error: {trial.error}")
    lines += [
        f"  step {step['seq']} {step['name']}: reward {step['reward']}"
        for step in store.steps(trial.id)
    ]
    lines += [
        f"  judge {j['judge']}: score {j['score']}" + (f" ({j['error']})" if j["error"] else "")
        for j in store.judgments(trial.id)
    ]
    calls = store.calls(trial=trial.id)
    if calls:
        rows = [
            [c.role, c.model or c.model_requested or "", c.status, c.input_tokens,
             c.output_tokens, f"{c.latency:.3f}s", c.error or ""]
            for c in calls
        ]  # fmt: skip
        table = tabulate(rows, headers=["role", "model", "status", "in", "out", "latency", ""])
        lines += ["", table]
    lines.append(f"\nfolder {trial.trial_dir or '-'}")
    print("\n".join(lines))
    return 0


def runs_command(args: argparse.Namespace) -> int:
    store = _open_store(args.store)
    rows = []
    for run in store.runs():
        trials = store.trials(run.id)
        counted = [t for t in trials if t.status != "deselected"]
        done = sum(1 for t in counted if t.is_finished)
        states = store.job_counts(run.id)
        rows.append(
            [
                run.id,
                run.name,
                run.status,
                f"{done}/{len(counted)}",
                states.get("leased", 0) + states.get("cancelling", 0),
                states.get("queued", 0),
                sum(1 for t in counted if t.outcome == "cancelled"),
                ", ".join(run.spec["spec"]["harnesses"]),
                ", ".join(run.spec["datasets"]),
            ]
        )
    headers = ["run", "name", "status", "done", "running", "queued", "cancelled"]
    print(tabulate(rows, headers=[*headers, "harnesses", "datasets"]))
    return 0


def engines_command(args: argparse.Namespace) -> int:
    """The pool's engines, each pinged now; exits 1 when none answers."""
    from pytest_hemra.execute.sandbox.engines import engine_statuses, render_engines

    run_file = Path(args.run_file)
    spec = load_run_spec(run_file, Overrides())
    if not spec.sandbox.engines:
        raise SpecError(f"{run_file}: no [[sandbox.engines]] (see docs/scaling.md)")
    store_path = Path(args.store) if args.store else run_file.resolve().parent / DEFAULT_STORE
    store = Store(store_path) if store_path.is_file() else None
    statuses = engine_statuses(spec.sandbox.engines, store)
    print(render_engines(statuses))
    return 0 if any(status.answers for status in statuses) else 1


def image_command(args: argparse.Namespace) -> int:
    from pytest_hemra.execute.sandbox.base_image import bootstrap_base_image, has_image

    if args.if_missing and has_image(args.tag):
        print(f"{args.tag} is already on this docker engine")
        return 0
    print(f"built {bootstrap_base_image(args.tag, args.suite, args.mirror)}")
    return 0


def canary_command(args: argparse.Namespace) -> int:
    import os

    from pytest_hemra.execute.gateway.canary import PATHS, run_canary
    from pytest_hemra.resolve.upstreams import BUILTIN_UPSTREAMS, ModelApi

    if args.base_url:
        name = args.provider if args.provider != "scripted" else "canary"
        provider = ModelApi(name=name, base_url=args.base_url, auth=args.auth, key_env=args.key_env)
    elif args.provider in BUILTIN_UPSTREAMS:
        provider = BUILTIN_UPSTREAMS[args.provider]
    else:
        known = ", ".join(sorted(BUILTIN_UPSTREAMS))
        raise HemraError(f"--provider: no built-in provider {args.provider!r} (known: {known})")
    key_env = args.key_env or provider.key_env
    key = os.environ.get(key_env) if key_env else None
    from pytest_hemra.execute.gateway.wire import Wire

    wires = tuple(Wire(name) for name in args.wire) if args.wire else tuple(PATHS)
    probes = run_canary(
        provider, args.model, key, expect_scripted=args.expect == "scripted", wires=wires
    )
    for probe in probes:
        print(probe.describe())
    failed = [probe for probe in probes if not probe.ok]
    print(
        f"canary: {len(probes) - len(failed)}/{len(probes)} calls counted as the upstream reports"
    )
    return 1 if failed else 0


def calibrate_command(args: argparse.Namespace) -> int:
    import os

    from pytest_hemra.execute.gateway.server import Gateway
    from pytest_hemra.resolve.judges import resolve_judges
    from pytest_hemra.resolve.spec import JudgeSpec, RunSpec
    from pytest_hemra.resolve.upstreams import configured_upstreams
    from pytest_hemra.score.calibration import (
        bundled_anchors,
        calibrate,
        calibration_row,
        load_anchors,
    )

    run_file = Path(args.run_file) if args.run_file else None
    base_dir = run_file.resolve().parent if run_file else Path.cwd()
    spec = load_run_spec(run_file, Overrides()) if run_file else None
    source = str(run_file) if run_file else "command line"
    entries = [j for j in spec.judge if j.name == args.judge] if spec else []
    if spec is not None and not entries:
        raise HemraError(f"{run_file}: key 'judge': no judge named {args.judge!r}")
    entry = entries[0] if entries else JudgeSpec(name=args.judge)
    if args.model:
        entry = entry.model_copy(update={"model": args.model, "command": None})
    (judge,) = resolve_judges([entry], base_dir, source, spec.model if spec else None)
    anchors_path = (
        Path(args.anchors) if args.anchors else bundled_anchors(entry.rubric or entry.name)
    )
    if anchors_path is None:
        raise HemraError(f"--anchors: no bundled anchors for rubric {entry.rubric or entry.name!r}")
    anchors = load_anchors(anchors_path)
    providers = configured_upstreams((spec or RunSpec(harnesses=["nop"], datasets=["x"])).providers)
    keys = {
        name: os.environ[p.key_env]
        for name, p in providers.items()
        if p.key_env and p.key_env in os.environ
    }
    with Gateway(providers, lambda call: None) as gateway:
        result = calibrate(judge, anchors, gateway, keys, args.threshold)
    rows = [
        [r.anchor, f"{r.expected:g}", "-" if r.score is None else f"{r.score:g}", r.error or ""]
        for r in result.results
    ]
    print(tabulate(rows, headers=["anchor", "expected", "judge", "error"]))
    print(
        f"judge {result.judge} on {result.model}: mean absolute error {result.mae:.3f} over"
        f" {result.anchors} anchors ({anchors_path}); threshold {result.threshold:g}:"
        f" {result.verdict}"
    )
    store = Store(Path(args.store) if args.store else base_dir / DEFAULT_STORE)
    store.record_calibration(calibration_row(result))
    return 0 if result.reliable else 1


def init_command(args: argparse.Namespace) -> int:
    from pytest_hemra.cli.scaffold import write_starter

    target = Path(args.directory)
    for path in write_starter(target):
        print(f"wrote {path}")
    run_file = target / "run.toml"
    print(f"next: pytest --hemra-run {run_file}   (or: hemra run {run_file})")
    return 0


def harnesses_command(args: argparse.Namespace) -> int:
    from pytest_hemra.resolve.harnesses import Harness, available_harnesses, observability
    from pytest_hemra.resolve.spec import HarnessSpec, read_toml

    rows = []
    for path in available_harnesses(Path(args.dir).resolve()):
        try:
            spec = HarnessSpec.model_validate(read_toml(path))
        except (SpecError, ValueError) as error:
            rows.append([path.stem, "invalid", "", str(error).splitlines()[0][:60], "", "", ""])
            continue
        seen = observability(Harness(path.stem, path, spec))
        rows.append(
            [
                path.stem,
                spec.kind,
                spec.version or "",
                spec.package or "",
                *seen.values(),
                str(path),
            ]
        )
    headers = ["harness", "kind", "version", "package", "gateway usage", "own usage"]
    print(tabulate(rows, headers=[*headers, "transcript", "file"]))
    return 0


def harness_command(args: argparse.Namespace) -> int:
    from pytest_hemra.execute.installs import ensure_installed, is_installed
    from pytest_hemra.resolve.harnesses import resolve_harness

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
    "show": show_command,
    "serve": serve_command,
    "view": view_command,
    "cancel": cancel_command,
    "image": image_command,
    "harness": harness_command,
    "harnesses": harnesses_command,
    "engines": engines_command,
    "init": init_command,
    "canary": canary_command,
    "calibrate": calibrate_command,
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
