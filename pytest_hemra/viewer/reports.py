"""Each run's report as the viewer serves it, built by `pytest_hemra.report.tables` (one source of
truth with `hemra report`) and kept until the run changes.

Building the report of 150,000 trials takes seconds, so it is built in a worker thread, once per
state of the run (its status and its trials' counts by status and outcome), and the run page
asks for it apart from its first response.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

from pytest_hemra.report.formats import chart, table, title, variance_lines
from pytest_hemra.report.snapshot import report_of
from pytest_hemra.report.tables import RunReport, report_dict
from pytest_hemra.store import Store
from pytest_hemra.viewer.pool import StorePool

KEPT_RUNS = 16
StateKey = tuple[str, tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]]


def run_state(store: Store, run_id: str) -> StateKey:
    """What a run's report depends on, cheaply read: it changes whenever a trial finishes."""
    status = store.run(run_id).status
    counts = store.trial_counts(run_id).get(run_id)
    if counts is None:
        return status, (), ()
    return status, tuple(sorted(counts.statuses.items())), tuple(sorted(counts.outcomes.items()))


def report_json(store: Store, run_id: str) -> dict[str, Any]:
    """The report as `hemra report --format json` has it, with each dataset's table as the
    text report prints it and the geometry of its chart."""
    report = report_of(store, run_id)
    tables = []
    for dataset in report.datasets:
        headers, rows = table(dataset)
        tables.append(
            {
                "dataset": dataset.name,
                "title": title(dataset),
                "headers": headers,
                "rows": rows,
                "flags": [
                    {"kind": f.kind, "harness": f.harness, "message": f.message}
                    for f in dataset.flags
                ],
                "chart": chart(dataset),
                "variance": variance_lines(dataset),
            }
        )
    return {"report": report_dict(report), "tables": tables, "matrix": matrix(report)}


def matrix(report: RunReport) -> list[dict[str, Any]]:
    """A matrix run's grid per dataset: harness rows, model columns, each cell's mean reward
    with its 95% interval (from the table of its model); [] for a one-model run."""
    grids: dict[str, dict[str, Any]] = {}
    for dataset in report.datasets:
        if dataset.axis != "harness" or not dataset.view.startswith("model ") or dataset.reward_key:
            continue
        model = dataset.view.removeprefix("model ")
        grid = grids.setdefault(dataset.name, {"dataset": dataset.name, "harnesses": [],
                                               "models": [], "cells": []})  # fmt: skip
        grid["models"].append(model)
        for row in dataset.harnesses:
            if row.harness not in grid["harnesses"]:
                grid["harnesses"].append(row.harness)
            reward = row.reward
            grid["cells"].append(
                {
                    "harness": row.harness,
                    "model": model,
                    "mean": None if reward is None else reward.mean,
                    "low": None if reward is None else reward.low,
                    "high": None if reward is None else reward.high,
                    "trials": f"{row.finished}/{row.planned}",
                }
            )
    return list(grids.values())


class ReportCache:
    def __init__(self, pool: StorePool) -> None:
        self.pool = pool
        self._kept: OrderedDict[str, tuple[StateKey, dict[str, Any]]] = OrderedDict()
        self._building: dict[str, tuple[StateKey, asyncio.Future[dict[str, Any]]]] = {}

    async def get(self, run_id: str) -> dict[str, Any]:
        key = await self.pool.call(run_state, run_id)
        kept = self._kept.get(run_id)
        if kept is not None and kept[0] == key:
            self._kept.move_to_end(run_id)
            return {**kept[1], "cached": True}
        building = self._building.get(run_id)
        if building is None or building[0] != key:
            future = asyncio.ensure_future(self.pool.call(report_json, run_id))
            building = (key, future)
            self._building[run_id] = building
            future.add_done_callback(lambda done: self._built(run_id, key, done))
        return {**await asyncio.shield(building[1]), "cached": False}

    def _built(self, run_id: str, key: StateKey, done: asyncio.Future[dict[str, Any]]) -> None:
        if self._building.get(run_id, (None, None))[1] is done:
            del self._building[run_id]
        if done.cancelled() or done.exception() is not None:
            return
        self._kept[run_id] = (key, done.result())
        self._kept.move_to_end(run_id)
        while len(self._kept) > KEPT_RUNS:
            self._kept.popitem(last=False)
