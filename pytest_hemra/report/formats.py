"""Renderings of a `RunReport`: text (the terminal summary), markdown, CSV, JSON and HTML.

Every format holds the same numbers; HTML is one self-contained, autoescaped file with a chart
of each harness's mean reward and its 95% CI per dataset.
"""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Callable
from importlib import resources
from typing import Any

import jinja2
from tabulate import tabulate

from pytest_hemra.core.terminal import fit_table, left_out_line, wrap_line
from pytest_hemra.core.text import printable_lines
from pytest_hemra.core.words import plural
from pytest_hemra.report import FORMATS
from pytest_hemra.report.stats import Estimate, Spread
from pytest_hemra.report.tables import DatasetReport, HarnessSummary, RunReport, report_dict
from pytest_hemra.report.variance import render_variance


def render(report: RunReport, fmt: str, width: int | None = None) -> str:
    """`report` in format `fmt`; text fits `width` columns (None: every column)."""
    renderers: dict[str, Callable[[RunReport], str]] = {
        "text": render_text,
        "markdown": render_markdown,
        "csv": render_csv,
        "json": render_json,
        "html": render_html,
    }
    if fmt == "text":
        renderers["text"] = lambda found: render_text(found, width=width, more="--wide")
    text = renderers[fmt](report)
    # JSON escapes control characters itself; elsewhere an agent's words (a model's name it
    # asked for) are shown, never obeyed by the terminal or page that shows them
    return text if fmt == "json" else printable_lines(text)


def headers(dataset: DatasetReport) -> list[str]:
    ks = range(1, dataset.attempts + 1) if dataset.attempts > 1 else ()
    judges = sorted({name for row in dataset.harnesses for name in row.judges})
    keys = reward_keys(dataset)
    return [
        dataset.axis,
        "trials",
        "passes",
        "mean reward [95% CI]",
        "vs baseline [95% CI]",
        "p",
        *(f"pass@{k}" for k in ks),
        *(f"pass^{k}" for k in ks if k > 1),
        *(["pass@k tasks"] if ks else []),
        *(["attempts disagree"] if ks else []),
        *(f"key {name} [95% CI]" for name in keys),
        *(f"judge {name}" for name in judges),
        "tokens",
        "tokens/trial",
        "cost",
        "cost/trial",
        "duration/trial",
        "own tokens",
        "outcomes",
        "classes",
    ]


def cells(dataset: DatasetReport, row: HarnessSummary) -> list[Any]:
    ks = range(1, dataset.attempts + 1) if dataset.attempts > 1 else ()
    judges = sorted({name for r in dataset.harnesses for name in r.judges})
    keys = reward_keys(dataset)
    versus = row.versus
    return [
        row.harness + (" (baseline)" if row.is_baseline else ""),
        f"{row.finished}/{row.planned}",
        row.passes,
        _estimate(row.reward),
        "" if versus is None else f"{versus.diff:+.3f} [{versus.low:+.3f}, {versus.high:+.3f}]",
        "" if versus is None else f"{versus.p_value:.3f}",
        *(_number(row.pass_at_k.get(k)) for k in ks),
        *(_number(row.pass_hat_k.get(k)) for k in ks if k > 1),
        *([_pass_k_tasks(row)] if ks else []),
        *([_share(row.disagree)] if ks else []),
        *(_estimate(row.keys.get(name)) for name in keys),
        *(_estimate(row.judges.get(name)) for name in judges),
        int(row.tokens.total or 0),
        _number(row.tokens.median, digits=0),
        "unknown" if row.cost is None else f"${row.cost.total or 0:.4f}",
        "unknown" if row.cost is None else _money(row.cost.median),
        _number(row.duration.median, "s", digits=2),
        "-" if row.own_tokens is None else row.own_tokens,
        ", ".join(f"{name} {count}" for name, count in row.outcomes.items()),
        ", ".join(f"{name} {count}" for name, count in row.classes.items()),
    ]


def reward_keys(dataset: DatasetReport) -> list[str]:
    """The reward keys other than the headline that some row of the table has a value of."""
    return sorted({name for row in dataset.harnesses for name in row.keys})


def _pass_k_tasks(row: HarnessSummary) -> str:
    """The tasks every pass@k and pass^k of the row averages over, and those left out."""
    left_out = f" ({row.pass_k_left_out} left out)" if row.pass_k_left_out else ""
    return f"{row.pass_k_tasks}{left_out}"


def table(dataset: DatasetReport) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of a dataset's table, leaving out columns no harness has a value in."""
    names = headers(dataset)
    rows = [[str(cell) for cell in cells(dataset, row)] for row in dataset.harnesses]
    keep = [
        index
        for index, name in enumerate(names)
        if name == dataset.axis or any(row[index] not in ("", "-") for row in rows)
    ]
    return [names[i] for i in keep], [[row[i] for i in keep] for row in rows]


# the columns a narrow terminal keeps, most important first; the others are dropped first,
# then these from the end of the list, until the table fits (`core.terminal.fit_table`); every
# column stays in `--wide` and the exports
TERMINAL_COLUMNS = (
    "harness", "model", "mean reward [95% CI]", "vs baseline [95% CI]", "p", "trials",
    "passes", "cost/trial", "tokens/trial", "outcomes", "pass@1", "duration/trial",
)  # fmt: skip


def title(dataset: DatasetReport) -> str:
    """`name@digest (N tasks)`, `(N tasks, M counted)` when some left every row's numbers
    (`taskset.py`), and in a matrix run which table: `- model M` / `- harness H`."""
    view = f" - {dataset.view}" if dataset.view else ""
    counted = f", {len(dataset.counted_tasks)} counted" if dataset.tasks_left_out else ""
    tasks = f"({plural(dataset.tasks, 'task')}{counted})"
    return f"{dataset.name}@{dataset.digest[:12]} {tasks}{view}"


def render_text(
    report: RunReport,
    tablefmt: str = "simple",
    width: int | None = None,
    more: str = "hemra report --wide",
) -> str:
    """The terminal's tables: with `width`, each table's columns fit it (`fit_table`) and every
    other line wraps at word boundaries; the columns left out are named once at the end, with
    `more`, the command that shows them."""
    header = f"HEMRA run {report.run_id} ({report.name}) - store {report.store}"
    sections = [wrap_line(header, width)]
    dropped: dict[str, None] = {}
    for dataset in report.datasets:
        names, rows = table(dataset)
        fitted = fit_table(names, rows, width, keep=TERMINAL_COLUMNS, tablefmt=tablefmt)
        dropped.update(dict.fromkeys(fitted.dropped))
        lines = [str(flag) for flag in dataset.flags] + variance_lines(dataset)
        below = "".join(f"\n{wrap_line(line, width)}" for line in lines)
        sections.append(f"\n{wrap_line(title(dataset), width)}\n{fitted.text}{below}")
    if dropped:
        sections.append("\n" + left_out_line(list(dropped), width, more))
    if report.prices:  # where the cost column's prices came from, and their version
        sections.append(wrap_line(f"prices: {report.prices}", width))
    if report.kept_at is not None:  # read back, not built now (`snapshot.py`)
        kept = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(report.kept_at))
        line = f"numbers: as kept at {kept}; the run's trials and HEMRA unchanged since"
        sections.append(wrap_line(line, width))
    return "\n".join(sections)


def variance_lines(dataset: DatasetReport) -> list[str]:
    """Where the variance comes from (`variance.py`), under a dataset's first table."""
    if dataset.variance is None:
        return []
    return list(render_variance(dataset.variance))


def render_markdown(report: RunReport) -> str:
    lines = [f"# HEMRA run {report.run_id} ({report.name})", ""]
    for dataset in report.datasets:
        lines += [f"## {title(dataset)}", ""]
        names, rows = table(dataset)
        lines.append(tabulate(rows, headers=names, tablefmt="github", disable_numparse=True))
        lines += [
            "",
            *(
                f"- {flag.harness + ': ' if flag.harness else ''}{flag.message}"
                for flag in dataset.flags
            ),
            *variance_lines(dataset),
            "",
        ]
    return "\n".join(lines)


def render_csv(report: RunReport) -> str:
    """One row per dataset and harness, plain numbers (empty where there is none)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")  # printable_lines would show a \r
    writer.writerow(
        [
            "run", "dataset", "view", "axis", "harness", "baseline",
            "planned", "finished",  # not a lifecycle state: the count columns
            "scored", "passes", "tasks", "mean_reward", "reward_low", "reward_high", "pass_rate",
            "diff",
            "diff_low", "diff_high", "p_value", "shared_tasks", "tokens_total",
            "tokens_median", "cost_total", "cost_median", "duration_median", "outcomes",
            "pass_at_k", "pass_hat_k", "pass_k_tasks", "pass_k_left_out", "attempts_disagree",
            "reward_keys",
        ]
    )  # fmt: skip
    for dataset in report.datasets:
        for row in dataset.harnesses:
            reward, versus = row.reward, row.versus
            writer.writerow(
                [
                    report.run_id, dataset.name, dataset.view, dataset.axis, row.harness,
                    int(row.is_baseline), row.planned,
                    row.finished, row.scored, row.passes, row.tasks,
                    *(_field(reward, x) for x in ("mean", "low", "high")),
                    _field(row.pass_rate, "mean"),
                    *(_field(versus, x) for x in ("diff", "low", "high", "p_value", "n_tasks")),
                    _field(row.tokens, "total"), _field(row.tokens, "median"),
                    _field(row.cost, "total"), _field(row.cost, "median"),
                    _field(row.duration, "median"), json.dumps(row.outcomes),
                    json.dumps(row.pass_at_k), json.dumps(row.pass_hat_k), row.pass_k_tasks,
                    row.pass_k_left_out, "" if row.disagree is None else f"{row.disagree:.6g}",
                    _keys(row),
                ]
            )  # fmt: skip
    return out.getvalue()


def _keys(row: HarnessSummary) -> str:
    """Each reward key other than the headline, for CSV: {key: {mean, low, high}} as JSON."""
    found = {
        key: {"mean": e.mean, "low": e.low, "high": e.high}
        for key, e in row.keys.items()
        if e is not None
    }
    return json.dumps(found, sort_keys=True) if found else ""


def _field(source: Any, name: str) -> str:
    """An attribute of a summary that may be missing, for CSV: '' when there is none."""
    value = None if source is None else getattr(source, name)
    return "" if value is None else f"{value:.6g}" if isinstance(value, float) else str(value)


def render_json(report: RunReport) -> str:
    return json.dumps(report_dict(report), indent=2, sort_keys=True) + "\n"


def render_html(report: RunReport) -> str:
    environment = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    template = environment.from_string(
        resources.files("pytest_hemra").joinpath("templates/report.html.j2").read_text()
    )
    datasets = [
        {
            "report": dataset,
            "headers": table(dataset)[0],
            "rows": table(dataset)[1],
            "chart": chart(dataset),
            "title": title(dataset),
            "variance": variance_lines(dataset),
        }
        for dataset in report.datasets
    ]
    return template.render(report=report, datasets=datasets)


def chart(dataset: DatasetReport) -> dict[str, Any]:
    """Geometry of an SVG dot-and-whisker chart: mean reward and its CI, one line per harness."""
    width, left, row_height = 640, 180, 28
    scale = width - left - 20
    bars = []
    for index, row in enumerate(dataset.harnesses):
        y = 30 + index * row_height
        estimate = row.reward
        bars.append(
            {
                "label": row.harness + (" (baseline)" if row.is_baseline else ""),
                "y": y,
                "has_value": estimate is not None,
                "x": left + scale * (estimate.mean if estimate else 0.0),
                "x_low": left + scale * (estimate.low if estimate else 0.0),
                "x_high": left + scale * (estimate.high if estimate else 0.0),
                "text": _estimate(estimate),
            }
        )
    ticks = [{"x": left + scale * t / 4, "label": f"{t / 4:g}"} for t in range(5)]
    height = 40 + row_height * len(dataset.harnesses)
    return {"width": width, "height": height, "left": left, "bars": bars, "ticks": ticks}


def _estimate(estimate: Estimate | None) -> str:
    if estimate is None:
        return "-"
    if estimate.low == estimate.high:
        return f"{estimate.mean:.3f}"
    return f"{estimate.mean:.3f} [{estimate.low:.3f}, {estimate.high:.3f}]"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _number(value: float | None, unit: str = "", digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def _money(value: float | None) -> str:
    return "-" if value is None else f"${value:.4f}"


__all__ = ["FORMATS", "Spread", "render"]
