"""The JSON API's trial endpoints: one trial, its model calls, its folder's files (paged by
byte offset) and its transcript (paged by message)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from aiohttp import web

from pytest_hemra.core.records import CALL_COLUMNS
from pytest_hemra.core.usage import TOKEN_FIELDS
from pytest_hemra.store import Store
from pytest_hemra.viewer.api import trial_json
from pytest_hemra.viewer.context import viewer
from pytest_hemra.viewer.folder import DEFAULT_LIMIT, MAX_LIMIT, TrialFolder, read_instruction
from pytest_hemra.viewer.params import NotFound, integer

CALL_FIELDS = tuple(name for name in CALL_COLUMNS if name != "headers")
DEFAULT_MESSAGES, MAX_MESSAGES = 500, 5000


def _folder(store: Store, trial_id: str) -> TrialFolder:
    trial = store.trial(trial_id)
    return TrialFolder(store.run(trial.run_id).trials_dir, trial.trial_dir)


def _trial(store: Store, trial_id: str) -> dict[str, Any]:
    detail = store.trial_detail(trial_id)
    trial = detail.trial
    run = store.run(trial.run_id)
    dataset = run.plan.datasets.get(trial.dataset)
    try:
        folder = TrialFolder(run.trials_dir, trial.trial_dir)
        files, folder_error, tampered = folder.files(), None, folder.tampered()
    except NotFound as error:
        files, folder_error, tampered = [], str(error), None
    return {
        "trial": trial_json(trial),
        "run": {"id": run.id, "name": run.name, "status": run.status},
        "phases": detail.phases,
        "started_at": detail.started_at,
        "finished_at": detail.finished_at,
        "worker": detail.worker,
        "job_state": detail.job_state,
        "usage": {
            "calls": detail.calls,
            **detail.counts(),
            "tokens": trial.tokens,
            "cost": trial.cost,
        },
        "judgments": store.judgments(trial_id),
        "instruction": read_instruction(dataset.path if dataset else None, trial.task),
        "files": files,
        "folder_error": folder_error,
        "tampered": tampered,
    }


def _calls(store: Store, trial_id: str) -> list[dict[str, Any]]:
    """A trial's calls as stored: the tokens of a call whose usage is unknown are null."""
    store.trial(trial_id)
    return [
        {
            name: None if name in TOKEN_FIELDS and not call.is_usage_known else getattr(call, name)
            for name in CALL_FIELDS
        }
        for call in store.calls(trial=trial_id)
    ]


def _files(store: Store, trial_id: str) -> list[dict[str, Any]]:
    return _folder(store, trial_id).files()


def _file(store: Store, trial_id: str, path: str, offset: int, limit: int) -> dict[str, Any]:
    return asdict(_folder(store, trial_id).read(path, offset, limit))


def _transcript(store: Store, trial_id: str, offset: int, limit: int) -> dict[str, Any]:
    return _folder(store, trial_id).transcript(offset, limit)


async def trial(request: web.Request) -> web.Response:
    trial_id = request.match_info["trial_id"]
    return web.json_response(await viewer(request).pool.call(_trial, trial_id))


async def calls(request: web.Request) -> web.Response:
    trial_id = request.match_info["trial_id"]
    found = await viewer(request).pool.call(_calls, trial_id)
    return web.json_response({"trial_id": trial_id, "calls": found})


async def files(request: web.Request) -> web.Response:
    trial_id = request.match_info["trial_id"]
    found = await viewer(request).pool.call(_files, trial_id)
    return web.json_response({"trial_id": trial_id, "files": found})


async def file(request: web.Request) -> web.Response:
    trial_id, path = request.match_info["trial_id"], request.match_info["path"]
    offset = integer(request.query, "offset", 0, 0, 1 << 50)
    limit = integer(request.query, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    chunk = await viewer(request).pool.call(_file, trial_id, path, offset, limit)
    return web.json_response(chunk)


async def transcript(request: web.Request) -> web.Response:
    trial_id = request.match_info["trial_id"]
    offset = integer(request.query, "offset", 0, 0, 1 << 40)
    limit = integer(request.query, "limit", DEFAULT_MESSAGES, 1, MAX_MESSAGES)
    found = await viewer(request).pool.call(_transcript, trial_id, offset, limit)
    return web.json_response({"trial_id": trial_id, **found})
