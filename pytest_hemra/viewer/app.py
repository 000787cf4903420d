"""The viewer's aiohttp application: its pages, its JSON API, and who may ask.

Bound to loopback, requests must name a loopback host (a page elsewhere cannot reach the API
by rebinding a name to 127.0.0.1). Bound elsewhere, or with HEMRA_VIEWER_TOKEN set, every
request needs the token: `?token=` (which also sets an HttpOnly cookie, so the page's own
requests carry it), the cookie, or `Authorization: Bearer TOKEN`; without it, 401. A POST must
be JSON from the viewer's own origin. Every page is plain HTML and JavaScript from `static/`,
with a content security policy that allows only the viewer's own scripts.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from pytest_hemra.core.errors import HemraError, InfraError, StoreError
from pytest_hemra.viewer import api, trials
from pytest_hemra.viewer.context import VIEWER, Viewer, viewer
from pytest_hemra.viewer.params import BadRequest, NotFound
from pytest_hemra.viewer.pool import StorePool
from pytest_hemra.viewer.reports import ReportCache

STATIC = Path(__file__).parent / "static"
COOKIE = "hemra_viewer_token"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
        " connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none';"
        " form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def make_app(store_path: str | Path, *, token: str | None, is_loopback: bool) -> web.Application:
    app = web.Application(middlewares=[guard])
    pool = StorePool(store_path)
    app[VIEWER] = Viewer(pool, ReportCache(pool), token, is_loopback)

    async def close_pool(app: web.Application) -> None:
        pool.close()

    app.on_cleanup.append(close_pool)
    routes = app.router
    for path in ("/", "/runs/{run_id}", "/trials/{trial_id}", "/compare"):
        routes.add_get(path, page)
    routes.add_static("/static/", STATIC)
    routes.add_get("/api/outcomes", api.outcomes)
    routes.add_get("/api/runs", api.runs)
    routes.add_get("/api/runs/{run_id}", api.run)
    routes.add_get("/api/runs/{run_id}/report", api.report)
    routes.add_get("/api/runs/{run_id}/trials", api.trials)
    routes.add_post("/api/runs/{run_id}/cancel", api.cancel)
    routes.add_get("/api/trials/{trial_id}", trials.trial)
    routes.add_get("/api/trials/{trial_id}/calls", trials.calls)
    routes.add_get("/api/trials/{trial_id}/transcript", trials.transcript)
    routes.add_get("/api/trials/{trial_id}/files", trials.files)
    routes.add_get("/api/trials/{trial_id}/files/{path:.+}", trials.file)
    routes.add_get("/api/compare/runs", api.compare_run_pair)
    routes.add_get("/api/compare/harnesses", api.compare_harness_pair)
    return app


async def page(request: web.Request) -> web.FileResponse:
    """Every page is the one document; its script reads the address and draws the page."""
    return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})


@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    refused = _refusal(request)
    if refused is not None:
        return _secured(refused)
    try:
        response = await handler(request)
    except web.HTTPException as failure:
        if not request.path.startswith("/api/"):
            failure.headers.update(SECURITY_HEADERS)
            raise
        response = _error(failure.status, f"{request.path}: {failure.reason}")
    except (NotFound, StoreError) as failure:
        response = _error(404, str(failure))
    except (BadRequest, json.JSONDecodeError) as failure:
        response = _error(400, str(failure))
    except InfraError as failure:
        response = _error(502, str(failure))
    except HemraError as failure:
        response = _error(400, str(failure))
    context = viewer(request)
    given = request.query.get("token")
    if context.token is not None and given is not None and not response.prepared:
        response.set_cookie(COOKIE, given, httponly=True, samesite="Strict", path="/")
    if request.path.startswith("/api/"):
        response.headers["Cache-Control"] = "no-store"
    return _secured(response)


def _refusal(request: web.Request) -> web.Response | None:
    """Why this request may not be answered, or None when it may."""
    context = viewer(request)
    if context.token is not None:
        if not _has_token(request, context.token):
            return _error(
                401,
                "this viewer needs its token: open the address `hemra serve` or `hemra view`"
                " printed (ending ?token=...), or send 'Authorization: Bearer TOKEN'",
            )
    elif context.is_loopback:
        host = request.headers.get("Host", "")
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        if name not in LOOPBACK_NAMES:
            return _error(403, f"Host {host!r}: expected 127.0.0.1, localhost or [::1]")
    if request.method == "POST":
        if request.content_type != "application/json":
            return _error(415, f"POST {request.path}: expected Content-Type application/json")
        origin = request.headers.get("Origin")
        if origin is not None and origin != f"{request.scheme}://{request.host}":
            return _error(403, f"Origin {origin!r}: expected this viewer's own address")
    return None


def _has_token(request: web.Request, token: str) -> bool:
    header = request.headers.get("Authorization", "")
    offered = [
        request.query.get("token"),
        request.cookies.get(COOKIE),
        header[len("Bearer ") :] if header.startswith("Bearer ") else None,
    ]
    return any(o is not None and hmac.compare_digest(o.encode(), token.encode()) for o in offered)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _secured(response: web.StreamResponse) -> web.StreamResponse:
    if not response.prepared:
        response.headers.update(SECURITY_HEADERS)
    return response
