"""The JSON API's run endpoints: runs, one run, its report, its trials, cancel, and compare.

Every answer is JSON; an error is `{"error": "..."}` naming what was expected (docs/viewer.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from aiohttp import web

from pytest_hemra.core.events import EngineWait
from pytest_hemra.core.lifecycle import RUN_WAITING, JobState, RunStatus, TrialStatus
from pytest_hemra.core.outcome import Outcome
from pytest_hemra.core.records import (
    RunRecord,
    TrialCounts,
    TrialFilter,
    TrialRecord,
)
from pytest_hemra.report.comparison import compare_runs, comparison_dict
from pytest_hemra.run.cancellation import cancel_run
from pytest_hemra.run.job import run_provider
from pytest_hemra.store import Store
from pytest_hemra.viewer.context import viewer
from pytest_hemra.viewer.pairing import Side, pair_sides
from pytest_hemra.viewer.params import BadRequest, integer, required, text

# a trial's statuses the progress counts (beside `queued`, its planned ones)
PROGRESS = (
    TrialStatus.RUNNING,
    TrialStatus.FINISHED,
    TrialStatus.CANCELLED,
    TrialStatus.DESELECTED,
)
# a trial's state: its outcome, or while it has none its status (what `?outcome=` may name)
STATES = (*(str(o) for o in Outcome), *(str(s) for s in TrialStatus.WITHOUT_OUTCOME))
DEFAULT_PAGE, MAX_PAGE = 200, 1000
MAX_CANCEL_WAIT = 60


def run_json(
    run: RunRecord,
    counts: TrialCounts | None,
    *,
    with_tasks: bool = False,
    waits: Sequence[EngineWait] = (),
) -> dict[str, Any]:
    """A run as the API serves it; one running with trials waiting for their engine (`waits`)
    is `waiting`, and `waiting` says for which engine, since when and how many trials. Its
    progress `total` leaves deselected trials out (as `hemra runs` does); `left` counts the
    trials without a result (what a resume of an interrupted run runs)."""
    plan = run.plan
    statuses = counts.statuses if counts else {}
    counted = (counts.total if counts else 0) - statuses.get(TrialStatus.DESELECTED, 0)
    waiting = bool(waits) and run.status == RunStatus.RUNNING
    return {
        "id": run.id,
        "name": run.name,
        "created_at": run.created_at,
        "status": RUN_WAITING if waiting else run.status,
        "waiting": [asdict(wait) for wait in waits] if waiting else [],
        "is_active": run.status in RunStatus.OPEN,
        "harnesses": list(plan.harness_names),
        "baseline": plan.baseline,
        "model": plan.model,
        "models": list(plan.models),  # a matrix run's (every harness under each)
        "attempts": plan.attempts,
        "datasets": [
            {
                "name": dataset.name,
                "digest": dataset.digest,
                "tasks": list(dataset.tasks) if with_tasks else len(dataset.tasks),
            }
            for dataset in plan.datasets.values()
        ],
        "progress": {
            JobState.QUEUED: statuses.get(TrialStatus.PLANNED, 0),  # a planned trial's job
            **{status: statuses.get(status, 0) for status in PROGRESS},
            "total": counted,
            "left": counted - statuses.get(TrialStatus.FINISHED, 0),
        },
        "outcomes": dict(sorted(counts.outcomes.items())) if counts else {},
    }


def trial_json(trial: TrialRecord) -> dict[str, Any]:
    return {**asdict(trial), "models": list(trial.models), "is_finished": trial.is_finished}


def _runs(store: Store) -> list[dict[str, Any]]:
    counts, waits = store.trial_counts(), store.engine_waits()
    return [
        run_json(run, counts.get(run.id), waits=waits.get(run.id, ()))
        for run in reversed(store.runs())
    ]


def _run(store: Store, run_id: str) -> dict[str, Any]:
    run = store.run(run_id)
    counts, waits = store.trial_counts(run_id), store.engine_waits(run_id)
    return run_json(run, counts.get(run_id), with_tasks=True, waits=waits.get(run_id, ()))


def _trial_page(
    store: Store, run_id: str, where: TrialFilter, limit: int, offset: int, cursor: str | None
) -> dict[str, Any]:
    store.run(run_id)
    if cursor is not None and not cursor.startswith(f"{run_id}."):
        raise BadRequest(f"parameter 'cursor': {cursor!r} is not a trial of run {run_id!r}")
    if cursor is not None:
        store.trial(cursor)
    rows = store.trial_page(run_id, where, limit=limit + 1, offset=offset, after=cursor)
    page = rows[:limit]
    more = len(rows) > limit
    return {
        "run_id": run_id,
        "total": store.count_trials(run_id, where),
        "offset": offset,
        "limit": limit,
        "cursor": cursor,
        "next_cursor": page[-1].id if more else None,
        "trials": [trial_json(t) for t in page],
    }


def _cancel(store: Store, run_id: str, wait: float) -> dict[str, Any]:
    """`hemra cancel`'s work, with the sandbox provider the run names (from the registry)."""
    return asdict(cancel_run(store, run_id, run_provider(store, run_id), wait))


def _compare_runs(store: Store, before: str, after: str, harness: str | None) -> dict[str, Any]:
    run_a, run_b = store.run(before), store.run(after)
    shared = [h for h in run_b.plan.harness_names if h in run_a.plan.harness_names]
    if harness is not None and harness not in shared:
        raise BadRequest(
            f"parameter 'harness': {harness!r} is not in both runs (expected one of {shared})"
        )
    chosen = harness or (shared[0] if shared else None)
    try:
        comparison: dict[str, Any] | None = comparison_dict(compare_runs(store, before, after))
        error = None
    except ValueError as failure:  # a harness with no task scored in both runs
        comparison, error = None, f"the runs cannot be compared yet: {failure}"
    counts = store.trial_counts()
    return {
        "before": run_json(run_a, counts.get(before)),
        "after": run_json(run_b, counts.get(after)),
        "comparison": comparison,
        "comparison_error": error,
        "harnesses": shared,
        "harness": chosen,
        "datasets": []
        if chosen is None
        else pair_sides(store, Side(before, chosen), Side(after, chosen)),
    }


def _compare_harnesses(store: Store, run_id: str, a: str, b: str) -> dict[str, Any]:
    run = store.run(run_id)
    harnesses = list(run.plan.harness_names)
    for name, value in (("a", a), ("b", b)):
        if value not in harnesses:
            raise BadRequest(
                f"parameter {name!r}: {value!r} is not a harness of run {run_id!r}"
                f" (expected one of {harnesses})"
            )
    return {
        "run": run_json(run, store.trial_counts(run_id).get(run_id)),
        "a": a,
        "b": b,
        "datasets": pair_sides(store, Side(run_id, a), Side(run_id, b)),
    }


async def outcomes(request: web.Request) -> web.Response:
    """Every outcome, its groups, and the states a trial can show (the pages read them here)."""
    return web.json_response({**Outcome.groups(), "states": list(STATES)})


async def runs(request: web.Request) -> web.Response:
    pool = viewer(request).pool
    listed, kept = await pool.call(_runs), await pool.call(Store.engine_kept)
    return web.json_response({"runs": listed, "engine_kept": kept})


async def run(request: web.Request) -> web.Response:
    run_id = request.match_info["run_id"]
    return web.json_response(await viewer(request).pool.call(_run, run_id))


async def report(request: web.Request) -> web.Response:
    run_id = request.match_info["run_id"]
    return web.json_response(await viewer(request).reports.get(run_id))


async def trials(request: web.Request) -> web.Response:
    query = request.query
    outcome = text(query, "outcome")
    if outcome is not None and outcome not in STATES:
        raise BadRequest(f"parameter 'outcome': {outcome!r} (expected one of {', '.join(STATES)})")
    where = TrialFilter(
        harness=text(query, "harness"),
        task=text(query, "task"),
        dataset=text(query, "dataset"),
        outcome=outcome,
        text=text(query, "text"),
    )
    limit = integer(query, "limit", DEFAULT_PAGE, 1, MAX_PAGE)
    offset = integer(query, "offset", 0, 0, 1 << 40)
    run_id = request.match_info["run_id"]
    page = await viewer(request).pool.call(
        _trial_page, run_id, where, limit, offset, text(query, "cursor")
    )
    return web.json_response(page)


async def cancel(request: web.Request) -> web.Response:
    body = await request.json() if request.can_read_body else {}
    if not isinstance(body, dict):
        raise BadRequest('cancel: expected a JSON object, such as {"wait": 10}')
    wait = body.get("wait", 10)
    if not isinstance(wait, int | float) or not 0 <= wait <= MAX_CANCEL_WAIT:
        raise BadRequest(
            f"cancel: 'wait' must be seconds from 0 to {MAX_CANCEL_WAIT}, not {wait!r}"
        )
    context = viewer(request)
    run_id = request.match_info["run_id"]
    done = await context.pool.call(_cancel, run_id, float(wait))
    return web.json_response(done)


async def compare_run_pair(request: web.Request) -> web.Response:
    query = request.query
    found = await viewer(request).pool.call(
        _compare_runs, required(query, "before"), required(query, "after"), text(query, "harness")
    )
    return web.json_response(found)


async def compare_harness_pair(request: web.Request) -> web.Response:
    query = request.query
    found = await viewer(request).pool.call(
        _compare_harnesses, required(query, "run"), required(query, "a"), required(query, "b")
    )
    return web.json_response(found)
