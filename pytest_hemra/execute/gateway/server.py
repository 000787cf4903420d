"""The gateway: an aiohttp proxy that attributes every model call to its trial.

A trial gets `http://<gateway>/t/<token>/` as its base URL and the same unguessable token as its
API key. The gateway checks the token, swaps in the real key from the runner's environment (held
in memory only), forwards the request, streams the answer back chunk by chunk as it arrives, reads
the token usage on the way past, and records one row per call as it completes. Calls with an
unknown, ended or other trial's token are refused with 401, and calls that are not model calls
(`wire.ALLOWED_CALLS`: files, batches and the rest) with 403, both before the request's body is
read, and bodies over 64 MiB with 413: every refusal in the provider's own error format and
recorded as a refused call, as is a request outside any trial's base URL. The real key is
scrubbed out of everything the upstream answers (`relay`). A streamed Chat Completions call is
made to carry usage (`chatusage`); a call whose usage could not be read is recorded with unknown
tokens and cost, and a client that hangs up as the client's doing (`calls`).

It runs on its own event loop in a background thread: the rest of HEMRA stays synchronous.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import aiohttp
from aiohttp import web

from pytest_hemra.core.errors import InfraError
from pytest_hemra.core.records import CallRow
from pytest_hemra.core.trial import TrialUsage
from pytest_hemra.execute.gateway.bodies import (
    KEPT_BODY_BYTES,
    KEPT_TRIAL_BYTES,
    error_format,
    error_response,
    json_object,
    keep_bodies,
    note_over_cap,
)
from pytest_hemra.execute.gateway.calls import Call, call_row
from pytest_hemra.execute.gateway.chatusage import with_usage_asked
from pytest_hemra.execute.gateway.egress import EgressProxy
from pytest_hemra.execute.gateway.headers import (
    presented_key,
    redacted_headers,
    upstream_headers,
)
from pytest_hemra.execute.gateway.ledger import Budgets, CallPolicy, same_model
from pytest_hemra.execute.gateway.relay import Relay
from pytest_hemra.execute.gateway.replies import respond
from pytest_hemra.execute.gateway.routes import TrialAccess, TrialRoute
from pytest_hemra.execute.gateway.scripted import Script
from pytest_hemra.execute.gateway.scrub import KeyScrubber
from pytest_hemra.execute.gateway.wire import CallUsage, Wire, allowed_wire, route_call, wire_of
from pytest_hemra.resolve.upstreams import SCRIPTED, SCRIPTED_MODEL, ModelApi

CLOSE_WAIT_SECS = 10.0
# per upstream response: its reader stops reading past twice this (aiohttp), one large read
# (relay.READ_BYTES), so a fast stream is not paused and resumed at every read
STREAM_BUFFER_BYTES = 512 * 1024
MAX_REQUEST_BYTES = 64 * 1024 * 1024  # a larger request body is refused (413), unread


class Gateway:
    """One per runner process. `start()` binds every host in `hosts` on one port if it can."""

    def __init__(
        self,
        providers: Mapping[str, ModelApi],
        record: Callable[[CallRow], None],
        hosts: Sequence[str] = ("127.0.0.1",),
    ) -> None:
        self.providers = dict(providers)
        self.hosts = list(hosts)
        self.base_urls: dict[str, str] = {}
        self._record = record
        self._routes: dict[str, TrialRoute] = {}
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hemra-calls")
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._runners: list[web.AppRunner] = []
        self._session: aiohttp.ClientSession | None = None
        self._scripted_url = ""
        self.egress = EgressProxy()  # allowlist tasks' HTTP proxy: same addresses, its own port

    # -- lifecycle (called from the synchronous side) --------------------------------------

    def start(self) -> Gateway:
        ready: Future[None] = Future()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            try:
                try:
                    self._loop.run_until_complete(self._serve())
                except BaseException as error:
                    with contextlib.suppress(Exception):  # what did listen stops listening
                        self._loop.run_until_complete(self._shutdown())
                    ready.set_exception(error)
                    return
                ready.set_result(None)
                self._loop.run_forever()
            finally:
                self._loop.close()  # its selector's file descriptors with it

        self._thread = threading.Thread(target=run, name="hemra-gateway", daemon=True)
        self._thread.start()
        try:
            ready.result(timeout=30)
        except OSError as error:
            raise InfraError(f"gateway: cannot listen on {self.hosts} ({error})") from error
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._thread = None
        self._writer.shutdown(wait=True)

    def __enter__(self) -> Gateway:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def open_trial(
        self,
        trial_id: str,
        run_id: str,
        *,
        provider: str | None = None,
        keys: Mapping[str, str] | None = None,
        script: Script | None = None,
        policy: CallPolicy | None = None,
        budget: Budgets | None = None,
        calls_dir: Path | None = None,
        role: str = "agent",
    ) -> TrialAccess:
        """Register a trial; `keys` maps provider name to the real key (kept in memory only).

        `role` tells the trial's own harness (`agent`) from a judge scoring it (`judge:NAME`):
        both are attributed to the trial, each token's totals are its own."""
        token = "hemra-" + secrets.token_urlsafe(24)
        self._routes[token] = TrialRoute(
            token,
            trial_id,
            run_id,
            provider,
            dict(keys or {}),
            script,
            policy or CallPolicy(),
            budget,
            calls_dir=calls_dir,
            role=role,
        )
        return TrialAccess(
            token, {host: f"{url}/t/{token}" for host, url in self.base_urls.items()}
        )

    def calls(self, token: str) -> list[CallRow]:
        """A trial's calls in the order they completed (the order of `calls/NNNN.*`)."""
        route = self._routes.get(token)
        return list(route.rows) if route is not None else []

    def close_trial(self, token: str, wait: float = CLOSE_WAIT_SECS) -> TrialUsage:
        """End a trial's token: new calls are refused; in-flight ones finish and are recorded.
        Returns the trial's totals, equal to the sum of its rows in the store."""
        route = self._routes.get(token)
        if route is None:
            return TrialUsage()
        route.is_open = False
        deadline = time.monotonic() + wait
        while route.inflight and time.monotonic() < deadline:
            time.sleep(0.01)
        self._writer.submit(lambda: None).result(timeout=wait)
        route.keys.clear()
        return route.totals

    # -- serving (on the gateway's loop) ---------------------------------------------------

    async def _serve(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
            auto_decompress=False,
            read_bufsize=STREAM_BUFFER_BYTES,
            cookie_jar=aiohttp.DummyCookieJar(),  # nothing an upstream sets reaches another call
        )
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        app.router.add_route("*", "/t/{token}/{tail:.*}", self._handle)
        app.router.add_route("*", "/{tail:.*}", self._stray)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        self._runners.append(runner)
        port = 0
        for host in self.hosts:
            site = web.TCPSite(runner, host, port)
            try:
                await site.start()
            except OSError:
                if port == 0:
                    raise
                site = web.TCPSite(runner, host, 0)
                await site.start()
            bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            port = port or bound
            self.base_urls[host] = f"http://{host}:{bound}"
        scripted = web.Application(client_max_size=MAX_REQUEST_BYTES)
        scripted.router.add_route("POST", "/s/{token}/{tail:.*}", self._scripted)
        scripted_runner = web.AppRunner(scripted, access_log=None, handle_signals=False)
        await scripted_runner.setup()
        self._runners.append(scripted_runner)
        scripted_site = web.TCPSite(scripted_runner, "127.0.0.1", 0)
        await scripted_site.start()
        scripted_port = scripted_site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._scripted_url = f"http://127.0.0.1:{scripted_port}"
        await self.egress.serve(list(self.base_urls))

    async def _shutdown(self) -> None:
        await self.egress.shutdown()
        for runner in self._runners:
            await runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        """Token first, then the allowlist and the body's declared size, and only then the body:
        a call refused for any of them is answered without reading what it sent (a 60 MB upload
        with a bad token costs nothing)."""
        call = Call()
        token = request.match_info["token"]
        tail = request.match_info["tail"]
        allowed = allowed_wire(request.method, tail)
        wire = allowed or Wire.OTHER
        route = self._routes.get(token)
        presented = presented_key(request.headers)
        if (
            route is None
            or not route.is_open
            or (presented is not None and not hmac.compare_digest(presented, token))
        ):
            why = "unknown" if route is None else "ended" if not route.is_open else "mismatched"
            message = "invalid or expired HEMRA trial token"
            return self._refuse(route, call, request, wire, 401, f"{why} trial token", message)
        if allowed is None:
            reason = f"{request.method} /{tail} is not a model call the gateway forwards"
            return self._refuse(route, call, request, wire, 403, reason)
        size = request.content_length
        if size is not None and size > MAX_REQUEST_BYTES:
            return self._refuse(route, call, request, wire, 413, _too_large(size))
        route.inflight += 1
        if route.calls_dir is not None:
            call.kept = bytearray()
        try:
            try:
                body = await request.read()
            except web.HTTPRequestEntityTooLarge:
                return self._refuse(route, call, request, wire, 413, _too_large(None))
            except ConnectionError as error:  # the client hung up while sending
                call.status, call.error = 499, f"client hung up mid-request: {error}"
                self._submit(route, call, request, wire, None, None, b"", None)
                return web.Response(status=499)
            return await self._forward(request, route, wire, tail, body, call)
        finally:
            route.inflight -= 1

    async def _stray(self, request: web.Request) -> web.StreamResponse:
        """A request outside every trial's base URL (`/t/<token>/`): refused, and recorded
        without a trial."""
        wire = allowed_wire(request.method, request.match_info["tail"]) or Wire.OTHER
        message = "not a HEMRA trial URL: use the base URL the trial was given (/t/<token>/)"
        return self._refuse(None, Call(), request, wire, 404, "no trial token in the path", message)

    def _refuse(
        self,
        route: TrialRoute | None,
        call: Call,
        request: web.Request,
        wire: Wire,
        status: int,
        reason: str,
        message: str | None = None,
    ) -> web.Response:
        """A refusal in the provider's error format, recorded as a refused call."""
        call.status = status
        error = f"refused: {reason}"
        self._submit(route, call, request, wire, None, None, b"", None, refused=True, error=error)
        text = message or f"HEMRA refused the call: {reason}"
        return error_response(error_format(wire, request.headers), status, text)

    async def _forward(
        self,
        request: web.Request,
        route: TrialRoute,
        wire: Wire,
        tail: str,
        body: bytes,
        call: Call,
    ) -> web.StreamResponse:
        data = json_object(body) if wire is not Wire.OTHER else {}
        requested = data.get("model") if isinstance(data.get("model"), str) else None
        # a run on the scripted model sends every call there, whatever model a harness asks for
        run_model = route.policy.model or ""
        routed_model = run_model if run_model.startswith(SCRIPTED_MODEL) else requested
        provider_name = route_call(wire, routed_model, route.provider)
        provider = self.providers.get(provider_name)
        relay: Relay | None = None
        reserved: float | None = None
        refused = False
        try:
            refusal = route.refusal(wire, requested)
            if refusal is None and route.budget is not None and wire is not Wire.OTHER:
                reserved = route.budget.reserve(requested, data, len(body))
                if reserved is None:
                    refusal = route.budget.refused_by
                    route.totals = replace(route.totals, stopped_by=refusal)
            if refusal is not None:
                refused = True
                call.status, call.error = 400, f"refused: {refusal}"
                return error_response(
                    error_format(wire, request.headers), 400, f"HEMRA refused the call: {refusal}"
                )
            if provider is None:
                call.status, call.error = 502, f"no provider named {provider_name!r}"
                return error_response(error_format(wire, request.headers), 502, call.error)
            if provider.name == SCRIPTED or provider.base_url is None:
                base = f"{self._scripted_url}/s/{route.token}"
            else:
                base = provider.base_url.rstrip("/")
            url = f"{base}/{tail}" + (f"?{request.query_string}" if request.query_string else "")
            key = route.keys.get(provider.name)
            headers = upstream_headers(request.headers, provider, key, route.token)
            scrubber = KeyScrubber([*route.keys.values(), *([key] if key else [])])
            asked = with_usage_asked(body, data) if wire is Wire.CHAT else None
            assert self._session is not None
            relay = Relay(call, wire, scrubber)
            return await relay.run(
                self._session,
                request,
                url,
                headers,
                asked or body,
                data,
                is_usage_added=asked is not None,
            )
        finally:
            usage = relay.usage() if relay is not None else None
            if call.error is None and call.status >= 400 and call.error_text:
                call.error = call.error_text.decode(errors="replace")
            self._submit(
                route, call, request, wire, provider_name, requested, body, usage, refused=refused
            )
            # a call of unknown usage keeps its reservation: the budget never counts it as free
            is_settled = not call.is_usage_unknown(wire, usage)
            if reserved is not None and route.budget is not None and is_settled:
                route.budget.release(reserved)

    async def _scripted(self, request: web.Request) -> web.StreamResponse:
        route = self._routes.get(request.match_info["token"])
        wire = wire_of(request.match_info["tail"])
        body = json_object(await request.read())
        script = route.script if route is not None and route.script is not None else ()
        return await respond(request, wire, body, script)

    def _submit(
        self,
        route: TrialRoute | None,
        call: Call,
        request: web.Request,
        wire: Wire,
        provider: str | None,
        requested: str | None,
        body: bytes,
        usage: CallUsage | None,
        *,
        refused: bool = False,
        error: str | None = None,
    ) -> None:
        if route is not None and route.calls_dir is not None:
            route.seq += 1
            size = min(len(body), KEPT_BODY_BYTES) + len(call.kept or b"")
            if route.kept_bytes + size <= KEPT_TRIAL_BYTES:
                route.kept_bytes += size
                self._writer.submit(keep_bodies, route.calls_dir, route.seq, body, call.kept)
            elif route.kept_bytes <= KEPT_TRIAL_BYTES:  # the first call over: noted once
                route.kept_bytes = KEPT_TRIAL_BYTES + 1
                self._writer.submit(note_over_cap, route.calls_dir, route.seq)
        record = call_row(
            call,
            usage=usage,
            wire=wire,
            run_id=route.run_id if route else None,
            trial_id=route.trial_id if route else None,
            provider=provider,
            method=request.method,
            path="/" + request.match_info["tail"],
            requested=requested,
            request_bytes=len(body),
            refused=refused,
            error=error,
            headers=redacted_headers(request.headers, route.token if route else ""),
            role=route.role if route else "agent",
        )
        if route is not None:
            route.rows.append(record)
            expected = route.policy.model  # the model that answered counts, else the one asked
            used = record.model or requested  # (the scripted model answers under every name
            if used and used.startswith(SCRIPTED_MODEL):  # asked of it: `models` of a matrix)
                used = requested or used
            is_other = bool(expected) and not same_model(used, expected or "")
            route.totals = route.totals.with_call(record, is_other)
        self._writer.submit(self._record, record)


def _too_large(size: int | None) -> str:
    told = f" ({size} bytes)" if size is not None else ""
    return f"the request body{told} is over the gateway's {MAX_REQUEST_BYTES >> 20} MiB limit"
