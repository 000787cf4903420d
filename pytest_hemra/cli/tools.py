"""Set-up and checks: `hemra init`, the harnesses (`harnesses`, `harness install`), the
registry's and the cache's datasets (`datasets`), sandbox images and engines (`image bootstrap`,
`engines`), the gateway's `canary`, a judge's `calibrate`."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_hemra.cli.reports import add_wide_argument
from pytest_hemra.core.errors import HemraError, SpecError
from pytest_hemra.core.names import unknown_name
from pytest_hemra.core.store_location import STORE_DEFAULT, store_location
from pytest_hemra.core.terminal import fit_table, left_out_line, output_width
from pytest_hemra.core.words import plural
from pytest_hemra.resolve.overrides import Overrides

if TYPE_CHECKING:
    from pytest_hemra.cli.arguments import Commands


def add_commands(commands: Commands) -> None:
    init = commands.add_parser(
        "init",
        help="write a starter run file, harness and dataset (or a bundled example)",
        description="Write a starter run file, harness and dataset that run as they are; with"
        " --example NAME, the bundled example NAME (a run file or a folder) into examples/ of"
        " the folder instead. Nothing is overwritten.",
    )
    init.add_argument(
        "directory", nargs="?", default=".", help="folder to write into (default: this one)"
    )
    init.add_argument(
        "--example",
        nargs="?",
        const="",
        metavar="NAME",
        help="write the bundled example NAME into DIRECTORY/examples/; without NAME, list them",
    )
    init.set_defaults(handler=init_command)

    listing = commands.add_parser("harnesses", help="list harnesses and what HEMRA observes")
    listing.add_argument("--dir", default=".", help="folder whose harnesses/ is searched first")
    add_wide_argument(listing)
    listing.set_defaults(handler=harnesses_command)

    datasets = commands.add_parser(
        "datasets", help="the registry's datasets ($HEMRA_REGISTRY) and the cache's"
    )
    datasets.add_argument(
        "--format", choices=("table", "json"), default="table", help="json: an object, for scripts"
    )
    add_wide_argument(datasets)
    datasets.set_defaults(handler=datasets_command)

    harness = commands.add_parser("harness", help="harness installs")
    harness_commands = harness.add_subparsers(dest="harness_command", required=True)
    install = harness_commands.add_parser(
        "install", help="install a harness version into the host cache (once per digest)"
    )
    install.add_argument(
        "names", nargs="+", metavar="NAME", help="harness names, as `hemra harnesses` lists them"
    )
    install.add_argument("--dir", default=".", help="folder whose harnesses/ is searched first")
    install.set_defaults(handler=harness_command)

    image = commands.add_parser("image", help="sandbox images")
    image_commands = image.add_subparsers(dest="image_command", required=True)
    bootstrap = image_commands.add_parser(
        "bootstrap", help="build the offline Debian base image (debootstrap + docker import)"
    )
    bootstrap.add_argument(
        "--tag", default="debian:bookworm-slim", help="the image's tag (default: %(default)s)"
    )
    bootstrap.add_argument(
        "--suite", default="bookworm", help="the Debian release to install (default: %(default)s)"
    )
    bootstrap.add_argument("--mirror", help="Debian mirror (default: apt's configured one)")
    bootstrap.add_argument(
        "--if-missing", action="store_true", help="do nothing when the tag already exists"
    )
    bootstrap.set_defaults(handler=image_command)

    engines = commands.add_parser(
        "engines", help="a run file's Docker engines: health, capacity, running trials, images"
    )
    engines.add_argument("run_file", help="run file whose [[sandbox.engines]] to list")
    engines.add_argument(
        "--store", metavar="PATH|URL", help=f"store whose placements to count ({STORE_DEFAULT})"
    )
    engines.set_defaults(handler=engines_command)

    clean = commands.add_parser(
        "clean", help="remove what HEMRA left on the engine that no live trial owns"
    )
    clean.add_argument(
        "--store", metavar="PATH|URL", help=f"store whose trials to check ({STORE_DEFAULT})"
    )
    clean.add_argument("--dry-run", action="store_true", help="list what would go; remove nothing")
    clean.set_defaults(handler=clean_command)

    canary = commands.add_parser(
        "canary", help="check the gateway counts what an upstream reports, per wire format"
    )
    canary.add_argument(
        "--provider", default="scripted", help="built-in provider (default: the scripted model)"
    )
    canary.add_argument("--base-url", help="the upstream's URL (a provider of your own)")
    canary.add_argument(
        "--auth",
        choices=("x-api-key", "bearer"),
        default="bearer",
        help="how the key is sent to --base-url (default: %(default)s)",
    )
    canary.add_argument("--key-env", help="environment variable holding the upstream's key")
    canary.add_argument(
        "--model", default="hemra/scripted", help="the model to ask (default: %(default)s)"
    )
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
    canary.set_defaults(handler=canary_command)

    calibrate = commands.add_parser(
        "calibrate", help="score a judge against anchors with known scores (mean absolute error)"
    )
    calibrate.add_argument("run_file", nargs="?", help="run file whose [[judge]] to calibrate")
    calibrate.add_argument("--judge", required=True, help="judge name (or a rubric, with --model)")
    calibrate.add_argument("--model", help="the judge's model (default: the run file's)")
    calibrate.add_argument("--anchors", help="anchor file (default: the rubric's bundled anchors)")
    calibrate.add_argument("--threshold", type=float, default=0.15, help="drift past this MAE")
    calibrate.add_argument(
        "--store", metavar="PATH|URL", help=f"store to keep the result in ({STORE_DEFAULT})"
    )
    calibrate.set_defaults(handler=calibrate_command)


def init_command(args: argparse.Namespace) -> int:
    from pytest_hemra.cli.scaffold import write_starter

    if args.example is not None:
        return _init_example(args.example, Path(args.directory))
    target = Path(args.directory)
    for path in write_starter(target):
        print(f"wrote {path}")
    run_file = target / "run.toml"
    print(f"next: hemra run {run_file}   (then: hemra report; or: pytest --hemra-run {run_file})")
    return 0


def _init_example(name: str, target: Path) -> int:
    """`hemra init --example NAME`: the example written; without NAME, the list of them."""
    from pytest_hemra.cli.scaffold import bundled_examples, write_example
    from pytest_hemra.core.terminal import terminal_width

    if not name:
        examples = bundled_examples().values()
        named = max(len(example.name) for example in examples)
        width = terminal_width()
        fits = max(width - named - 2, 20) if width else None  # a line an example, on a terminal
        for example in examples:
            summary = example.summary
            if fits and len(summary) > fits:
                summary = summary[: fits - 3] + "..."
            print(f"{example.name:<{named}}  {summary}".rstrip())
        print(f"write one: hemra init --example NAME   (into {target / 'examples'}/)")
        return 0
    written = write_example(name, target)
    for path in written:
        print(f"wrote {path}")
    folder = target / "examples" / name
    readme, run_file = folder / "README.md", folder / "run.toml"
    if len(written) == 1:
        print(f"next: hemra run {written[0]} --dry-run   (its comments say what it needs)")
    elif readme in written:
        print(f"next: {readme} says how to run it")
    elif run_file in written:
        print(f"next: hemra run {run_file} --dry-run   (its comments say what it needs)")
    return 0


def harnesses_command(args: argparse.Namespace) -> int:
    from pytest_hemra.resolve.harness_spec import HarnessSpec
    from pytest_hemra.resolve.harnesses import Harness, available_harnesses, observability
    from pytest_hemra.resolve.validation import read_toml

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
    print_table([*headers, "transcript", "file"], rows, output_width(args.wide))
    return 0


def print_table(headers: list[str], rows: list[list[Any]], width: int | None) -> None:
    """A table fitting `width` columns, then the line naming the columns left out."""
    fitted = fit_table(headers, rows, width)
    print(fitted.text)
    if fitted.dropped:
        print(left_out_line(fitted.dropped, width))


def datasets_command(args: argparse.Namespace) -> int:
    """The registry's datasets (name, version, tasks, description), then the cache's: each
    dataset fetched (when, its size, its folder) and the git repositories kept for them."""
    import json
    from dataclasses import asdict

    from pytest_hemra.resolve.cache import (
        cached_datasets,
        datasets_dir,
        folder_size,
        repositories_dir,
    )
    from pytest_hemra.resolve.registry import REGISTRY_VARIABLE, configured_registry, read_registry

    location = configured_registry()
    registry = read_registry(location) if location else None
    listed = registry.datasets if registry else ()
    cached = cached_datasets()
    repositories = repositories_dir()
    kept = [p for p in repositories.glob("*") if p.is_dir() and not p.name.startswith(".")]
    git_bytes = sum(folder_size(p) for p in kept)
    if args.format == "json":
        found = {
            "registry": registry.location if registry else None,
            "datasets": [
                {
                    "name": d.name,
                    "version": d.version,
                    "tasks": len(d.tasks),
                    "description": d.description,
                }
                for d in listed
            ],
            "cache": {
                "datasets": [asdict(c) | {"path": str(c.path)} for c in cached],
                "git": {
                    "folder": str(repositories),
                    "repositories": len(kept),
                    "size_bytes": git_bytes,
                },
            },
        }
        print(json.dumps(found, indent=2))
        return 0
    if registry is None:
        print(f"registry: none ({REGISTRY_VARIABLE} is not set: a registry file or URL)")
    else:
        print(f"registry: {registry.location}")
        rows = [[d.name, d.version, len(d.tasks), _first_line(d.description)] for d in listed]
        headers = ["dataset", "version", "tasks", "description"]
        print_table(headers, rows, output_width(args.wide))
    print(f"\ncache: {datasets_dir()}")
    if cached:
        rows = [
            [
                c.name,
                c.version,
                "?" if c.tasks is None else c.tasks,
                c.fetched_at or "?",
                _size(c.size_bytes),
                str(c.path),
            ]
            for c in cached
        ]
        headers = ["dataset", "version", "tasks", "fetched", "size", "folder"]
        print_table(headers, rows, output_width(args.wide))
    else:
        print("no datasets fetched yet")
    print(f"git: {len(kept)} repositories, {_size(git_bytes)} in {repositories}")
    return 0


def _first_line(text: str, width: int = 60) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= width else line[: width - 3] + "..."


def _size(size_bytes: int) -> str:
    if size_bytes < 1024:
        return f"{size_bytes} B"
    size, unit = size_bytes / 1024, "KiB"
    for larger in ("MiB", "GiB"):
        if size < 1024:
            break
        size, unit = size / 1024, larger
    return f"{size:.1f} {unit}"


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


def image_command(args: argparse.Namespace) -> int:
    from pytest_hemra.execute.sandbox.base_image import bootstrap_base_image, has_image

    if args.if_missing and has_image(args.tag):
        print(f"{args.tag} is already on this docker engine")
        return 0
    print(f"built {bootstrap_base_image(args.tag, args.suite, args.mirror)}")
    return 0


def engines_command(args: argparse.Namespace) -> int:
    """The pool's engines, each pinged now; exits 1 when none answers."""
    from pytest_hemra.execute.sandbox.engines import engine_statuses, render_engines
    from pytest_hemra.resolve.spec import load_run_spec
    from pytest_hemra.store import Store

    run_file = Path(args.run_file)
    spec = load_run_spec(run_file, Overrides())
    if not spec.sandbox.engines:
        raise SpecError(f"{run_file}: no [[sandbox.engines]] (see docs/scaling.md)")
    location = store_location(args.store)
    store = Store(location.address) if location.exists() else None
    statuses = engine_statuses(spec.sandbox.engines, store)
    print(render_engines(statuses))
    return 0 if any(status.answers for status in statuses) else 1


def clean_command(args: argparse.Namespace) -> int:
    """What HEMRA left on the engine (DOCKER_HOST) that no live trial of the store owns, listed
    and removed (`--dry-run`: listed only); containers of trials the store does not know stay.
    Exits 1 when the engine does not answer, or something could not be removed."""
    from pytest_hemra.execute.sandbox.providers import sandbox_provider
    from pytest_hemra.resolve.spec import SandboxSettings
    from pytest_hemra.store import Store
    from pytest_hemra.store.owner import is_alive

    location = store_location(args.store)
    provider = sandbox_provider(SandboxSettings())
    down = provider.engine_error()
    if down is not None:
        print(f"hemra clean: the engine does not answer ({down}); nothing removed")
        return 1
    with Store(location.address) if location.exists() else contextlib.nullcontext() as store:
        found = provider.clean(
            (lambda t: store.is_trial_over(t, is_alive)) if store else (lambda t: False),
            dry_run=args.dry_run,
        )
    verb = "would remove" if args.dry_run else "removed"
    for leftover in found:
        if leftover.stuck:
            print(f"could not remove {leftover.kind} {leftover.name}: {leftover.stuck}")
        else:
            print(f"{verb} {leftover.kind} {leftover.name}: {leftover.why}")
    if not location.exists():
        print(f"no store at {location.describe()}: containers of trials were left alone")
    stuck = sum(1 for leftover in found if leftover.stuck)
    done = plural(len(found) - stuck, "object")
    print(f"hemra clean: {verb} {done}" + (f", {stuck} could not be removed" if stuck else ""))
    return 1 if stuck else 0


def canary_command(args: argparse.Namespace) -> int:
    import os

    from pytest_hemra.execute.gateway.canary import PATHS, run_canary
    from pytest_hemra.execute.gateway.wire import Wire
    from pytest_hemra.resolve.upstreams import BUILTIN_UPSTREAMS, ModelApi

    if args.base_url:
        name = args.provider if args.provider != "scripted" else "canary"
        provider = ModelApi(name=name, base_url=args.base_url, auth=args.auth, key_env=args.key_env)
    elif args.provider in BUILTIN_UPSTREAMS:
        provider = BUILTIN_UPSTREAMS[args.provider]
    else:
        raise HemraError(
            "--provider: " + unknown_name("built-in provider", args.provider, BUILTIN_UPSTREAMS)
        )
    key_env = args.key_env or provider.key_env
    key = os.environ.get(key_env) if key_env else None
    wires = tuple(Wire(name) for name in args.wire) if args.wire else tuple(PATHS)
    probes = run_canary(
        provider, args.model, key, expect_scripted=args.expect == "scripted", wires=wires
    )
    for probe in probes:
        print(probe.describe())
    failed = [probe for probe in probes if not probe.ok]
    counted = f"{len(probes) - len(failed)}/{plural(len(probes), 'call')}"
    print(f"canary: {counted} counted as the upstream reports")
    return 1 if failed else 0


def calibrate_command(args: argparse.Namespace) -> int:
    import os

    from tabulate import tabulate

    from pytest_hemra.execute.gateway.server import Gateway
    from pytest_hemra.resolve.judges import resolve_judges
    from pytest_hemra.resolve.spec import JudgeSpec, RunSpec, load_run_spec
    from pytest_hemra.resolve.upstreams import configured_upstreams
    from pytest_hemra.score.calibration import (
        bundled_anchors,
        calibrate,
        calibration_row,
        load_anchors,
    )
    from pytest_hemra.store import Store

    run_file = Path(args.run_file) if args.run_file else None
    base_dir = run_file.resolve().parent if run_file else Path.cwd()
    spec = load_run_spec(run_file, Overrides()) if run_file else None
    source = str(run_file) if run_file else "command line"
    entries = [j for j in spec.judge if j.name == args.judge] if spec else []
    if spec is not None and not entries:
        known = [j.name for j in spec.judge]
        raise HemraError(f"{run_file}: key 'judge': " + unknown_name("judge", args.judge, known))
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
    store = Store(store_location(args.store).address)
    store.record_calibration(calibration_row(result))
    return 0 if result.reliable else 1
