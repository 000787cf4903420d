"""What every request handler shares: the store's worker threads, the report cache, and the
token rules. (Cancelling a run removes its sandboxes with the provider that run names.)"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from pytest_hemra.viewer.pool import StorePool
from pytest_hemra.viewer.reports import ReportCache


@dataclass(frozen=True)
class Viewer:
    pool: StorePool
    reports: ReportCache
    token: str | None  # required on every request when set
    is_loopback: bool  # bound to a loopback address


VIEWER = web.AppKey("viewer", Viewer)


def viewer(request: web.Request) -> Viewer:
    return request.app[VIEWER]
