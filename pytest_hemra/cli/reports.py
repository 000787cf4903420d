"""What a run left: `hemra report` (a run's tables, or two runs compared), `hemra show` (one
trial) and `hemra view` (the viewer on the store, without the queue)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_hemra.cli.arguments import (
    add_store_argument,
    add_viewer_arguments,
    find_run,
    find_trial,
    open_store,
)
from pytest_hemra.core.errors import HemraError
from pytest_hemra.core.store_location import store_location
from pytest_hemra.core.terminal import output_width
from pytest_hemra.core.text import printable, printable_lines
from pytest_hemra.core.words import plural
from pytest_hemra.report import FORMATS

if TYPE_CHECKING:
    from pytest_hemra.cli.arguments import Commands
    from pytest_hemra.store import Store


def add_commands(commands: Commands) -> None:
    report = commands.add_parser("report", help="a run's tables from the store, or two runs'")
    report.add_argument("run_id", nargs="?", help="run id (default: the latest run)")
    report.add_argument("other_run", nargs="?", help="a second run: compare each harness in it")
    add_store_argument(report)
    report.add_argument(
        "--format",
        choices=FORMATS,
        default="text",
        help="text (the terminal's tables) or a file format (default: text)",
    )
    report.add_argument("-o", "--output", help="write to this file (default: stdout)")
    report.add_argument(
        "--rebuild",
        action="store_true",
        help="build the report from every trial even when a closed run's report is kept (and"
        " keep the new one): after its store was edited by hand",
    )
    add_wide_argument(report)
    report.set_defaults(handler=report_command)

    show = commands.add_parser("show", help="one trial: outcome, rewards, phases, usage, calls")
    show.add_argument(
        "trial_id", help="a trial id (RUN_ID.NNNNN, as in the JUnit 'trial' property)"
    )
    add_store_argument(show)
    add_wide_argument(show)
    show.set_defaults(handler=show_command)

    view = commands.add_parser("view", help="browse the store's runs in the viewer (no queue)")
    add_store_argument(view)
    add_viewer_arguments(view)
    view.set_defaults(handler=view_command)


def report_command(args: argparse.Namespace) -> int:
    from pytest_hemra.report.formats import render
    from pytest_hemra.report.snapshot import report_of

    store = open_store(args.store)
    width = None if args.output else output_width(args.wide)  # a file gets every column
    run_id = (
        find_run(store, args.store, args.run_id) if args.run_id else _latest_run(store, args.store)
    )
    if args.other_run:
        from pytest_hemra.report.comparison import compare_runs, render_comparison

        find_run(store, args.store, args.other_run)
        if args.other_run == run_id:
            raise HemraError(
                f"hemra report {run_id} {run_id}: a run compared with itself; name"
                " an earlier run first and a later one second"
            )
        text = render_comparison(compare_runs(store, run_id, args.other_run), args.format, width)
    else:
        text = render(report_of(store, run_id, rebuild=args.rebuild), args.format, width)
    if args.format != "json":  # an agent's words shown, never obeyed (JSON escapes its own)
        text = printable_lines(text)
    if args.output:
        Path(args.output).write_text(text if text.endswith("\n") else text + "\n")
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        print(text)
    return 0


def _latest_run(store: Store, option: str | None) -> str:
    runs = store.runs()
    if not runs:
        raise HemraError(f"no runs in {store_location(option).describe()}")
    return runs[-1].id


def show_command(args: argparse.Namespace) -> int:
    """Everything the store holds of one trial, for a terminal (the viewer shows the rest)."""
    from pytest_hemra.core.terminal import fit_table, left_out_line
    from pytest_hemra.report.history import trial_history

    store = open_store(args.store)
    detail = store.trial_detail(find_trial(store, args.store, args.trial_id))
    trial = detail.trial
    reward = "-" if trial.reward is None else f"{trial.reward:g}"
    cost = "unknown" if trial.cost is None else f"${trial.cost:.4f}"
    if trial.usage_unknown:
        cost += f" (usage unknown on {trial.usage_unknown} of {plural(trial.calls, 'call')})"
    lines = [
        f"trial {trial.id}: {trial.item_id}",
        f"  status {trial.status}, outcome {trial.outcome or '-'}, reward {reward}"
        + (f", class {trial.swe_class}" if trial.swe_class else "")
        + (f", cause {trial.cause}" if trial.cause else "")
        + (f", retries {trial.retries} (replaces {trial.replaces})" if trial.replaces else ""),
        f"  rewards {json.dumps(trial.rewards, sort_keys=True)}"
        + _headline(
            trial.rewards, store.run(trial.run_id).plan.reward_keys(trial.dataset, trial.task)
        ),
        f"  tokens {trial.tokens} (input {detail.input_tokens}, output {detail.output_tokens},"
        f" cache read {detail.cache_read_tokens}, cache write {detail.cache_write_tokens});"
        f" {plural(detail.calls, 'call')}; cost {cost}",
        "  phases " + ", ".join(f"{k} {v:.2f}s" for k, v in detail.phases.items()),
        f"  worker {detail.worker or '-'}, job {detail.job_state or '-'}"
        + (f", agent user {trial.agent_user}" if trial.agent_user else "")
        + (", verified with the agent's processes running" if trial.kept_processes else ""),
    ]
    if trial.error:
        lines.append(f"  error: {printable(trial.error)}")
    lines += tampered_lines(trial.trial_dir)
    lines += trial_history(store, trial)
    lines += [_step_line(step) for step in store.steps(trial.id)]
    lines += [
        f"  judge {j['judge']}: score {j['score']}"
        + (f" ({printable(j['error'])})" if j["error"] else "")
        for j in store.judgments(trial.id)
    ]
    calls = store.calls(trial=trial.id)
    if calls:
        rows = [
            [c.role, printable(c.model or c.model_requested or ""), c.status,
             c.input_tokens if c.is_usage_known else "?",
             c.output_tokens if c.is_usage_known else "?", f"{c.latency:.3f}s",
             printable(c.error or "")]
            for c in calls
        ]  # fmt: skip
        width = output_width(args.wide)
        headers = ["role", "model", "status", "in", "out", "latency", "error"]
        keep = ["status", "model", "latency"]
        fitted = fit_table(headers, rows, width, keep=keep, numbers_right=True)
        lines += ["", fitted.text]
        lines += [left_out_line(fitted.dropped, width)] if fitted.dropped else []
    lines.append(f"\nfolder {trial.trial_dir or '-'}")
    print(printable_lines("\n".join(lines)))  # an agent's words shown, never obeyed
    return 0


def _headline(rewards: dict[str, float], named: tuple[str, ...]) -> str:
    """Which key the reward is, where it is not `reward` itself (core/reward.py)."""
    from pytest_hemra.core.reward import HEADLINE, has_no_headline, headline_key

    if has_no_headline(rewards, named):
        return " (no headline: the reward is the lowest key; [report] reward_key picks one)"
    key = headline_key(rewards, named)
    return "" if key in (None, HEADLINE) or len(rewards) == 1 else f" (headline {key})"


def _step_line(step: dict[str, Any]) -> str:
    """A step of a multi-step task: its reward and keys, or why it was skipped (left out of
    the trial's reward, as Harbor leaves it out)."""
    where = f"  step {step['seq']} {step['name']}:"
    error = step["error"] or ""
    if step["reward"] is None and error.startswith("skipped"):
        return f"{where} {printable(error)} (left out of the trial's reward)"
    rewards = step["rewards"] or {}
    keys = f" {json.dumps(rewards, sort_keys=True)}" if set(rewards) - {"reward"} else ""
    return f"{where} reward {step['reward']}{keys}"


MAX_SHOWN_EVIDENCE = 20  # lines of a tampered trial's evidence `hemra show` prints


def tampered_lines(trial_dir: str | None) -> list[str]:
    """What made a trial `tampered` (its folder's `tampered.json`): the reason, then each path
    and why, escaped (the paths are the agent's)."""
    from pytest_hemra.core.text import printable

    try:
        found = json.loads((Path(trial_dir or "") / "tampered.json").read_text())
        reason, evidence = str(found["reason"]), [str(line) for line in found["evidence"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    lines = [f"  tampered: {printable(reason)}"]
    lines += [f"    {printable(line)}" for line in evidence[:MAX_SHOWN_EVIDENCE]]
    if len(evidence) > MAX_SHOWN_EVIDENCE:
        lines.append(f"    ... {len(evidence) - MAX_SHOWN_EVIDENCE} more in tampered.json")
    return lines


def add_wide_argument(parser: argparse.ArgumentParser) -> None:
    """`--wide`: every column of the command's tables, however wide the terminal."""
    parser.add_argument(
        "--wide",
        action="store_true",
        help="print every column (default: the columns that fit the terminal; a pipe gets all)",
    )


def view_command(args: argparse.Namespace) -> int:
    """The viewer alone, until Ctrl-C or SIGTERM."""
    from pytest_hemra.viewer.server import running_viewer, wait_for_signal

    store = open_store(args.store)
    with running_viewer(store.address, args.host, args.port, required=True):
        wait_for_signal()
    return 0
