"""The gateway: an aiohttp proxy that attributes every model call to its trial.

A trial gets `http://<gateway>/t/<token>/` as its base URL and the same unguessable token as its
API key. The gateway checks the token, swaps in the real key from the runner's environment (held
in memory only), forwards the request, streams the answer back chunk by chunk as it arrives, reads
the token usage on the way past, and records one row per call as it completes. Calls with an
unknown, ended or other trial's token are refused with 401, and calls that are not model calls
(`wire.ALLOWED_CALLS`: files, batches and the rest) with 403, both before the request's body is
read, and recorded as refused. The real key is scrubbed out of everything the upstream answers.

It runs on its own event loop in a background thread: the rest of HEMRA stays synchronous.
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import aiohttp
from aiohttp import web

from pytest_hemra.core.errors import InfraError
from pytest_hemra.core.records import CallRow
from pytest_hemra.execute.gateway.bodies import (
    KEPT_BODY_BYTES,
    error_format,
    error_response,
    json_object,
    keep_bodies,
)
from pytest_hemra.execute.gateway.egress import EgressProxy
from pytest_hemra.execute.gateway.headers import (
    DROPPED_RESPONSE,
    presented_key,
    redacted_headers,
    upstream_headers,
)
from pytest_hemra.execute.gateway.ledger import CallPolicy, RunBudget, TrialUsage, same_model
from pytest_hemra.execute.gateway.prices import cost_of
from pytest_hemra.execute.gateway.replies import respond
from pytest_hemra.execute.gateway.routes import TrialAccess, TrialRoute
from pytest_hemra.execute.gateway.scripted import Script
from pytest_hemra.execute.gateway.scrub import KeyScrubber
from pytest_hemra.execute.gateway.usage import UsageReader, is_streaming
from pytest_hemra.execute.gateway.wire import CallUsage, Wire, allowed_wire, route_call, wire_of
from pytest_hemra.resolve.upstreams import SCRIPTED, SCRIPTED_MODEL, ModelApi

ERROR_TEXT_BYTES = 2048
CLOSE_WAIT_SECS = 10.0
STREAM_BUFFER_BYTES = 64 * 1024  # per upstream response: what one stream may hold in memory


@dataclass
class _Call:
    started: float = field(default_factory=time.perf_counter)
    at: float = field(default_factory=time.time)
    ttfb: float | None = None
    response_bytes: int = 0
    status: int = 0
    error: str | None = None
    error_text: bytes = b""
    kept: bytearray | None = None  # the response body, kept for the trial folder (capped)


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
                self._loop.run_until_complete(self._serve())
            except BaseException as error:
                ready.set_exception(error)
                return
            ready.set_result(None)
            self._loop.run_forever()

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
        budget: RunBudget | None = None,
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
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/t/{token}/{tail:.*}", self._handle)
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
        scripted = web.Application(client_max_size=64 * 1024 * 1024)
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
        """Token first, then the allowlist, and only then the body: a call refused for either is
        answered without reading what it sent (a 60 MB upload with a bad token costs nothing)."""
        call = _Call()
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
            call.status = 401
            why = "unknown" if route is None else "ended" if not route.is_open else "mismatched"
            self._submit(
                route,
                call,
                request,
                wire,
                None,
                None,
                b"",
                None,
                refused=True,
                error=f"refused: {why} trial token",
            )
            return error_response(
                error_format(wire, request.headers), 401, "invalid or expired HEMRA trial token"
            )
        if allowed is None:
            call.status = 403
            reason = f"{request.method} /{tail} is not a model call the gateway forwards"
            self._submit(
                route, call, request, wire, None, None, b"", None, refused=True, error=reason
            )
            return error_response(
                error_format(wire, request.headers), 403, f"HEMRA refused the call: {reason}"
            )
        route.inflight += 1
        if route.calls_dir is not None:
            call.kept = bytearray()
        try:
            body = await request.read()
            return await self._forward(request, route, wire, tail, body, call)
        finally:
            route.inflight -= 1

    async def _forward(
        self,
        request: web.Request,
        route: TrialRoute,
        wire: Wire,
        tail: str,
        body: bytes,
        call: _Call,
    ) -> web.StreamResponse:
        data = json_object(body) if wire is not Wire.OTHER else {}
        requested = data.get("model") if isinstance(data.get("model"), str) else None
        # a run on the scripted model sends every call there, whatever model a harness asks for
        run_model = route.policy.model or ""
        routed_model = run_model if run_model.startswith(SCRIPTED_MODEL) else requested
        provider_name = route_call(wire, routed_model, route.provider)
        provider = self.providers.get(provider_name)
        reader: UsageReader | None = None
        reserved: float | None = None
        refused = False
        try:
            refusal = self._refusal(route, wire, requested)
            if refusal is None and route.budget is not None and wire is not Wire.OTHER:
                reserved = route.budget.reserve(requested, data, len(body))
                if reserved is None:
                    refusal = "run budget"
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
            assert self._session is not None
            response: web.StreamResponse | None = None
            try:
                async with self._session.request(
                    request.method, url, headers=headers, data=body, allow_redirects=False
                ) as upstream:
                    call.status = upstream.status
                    response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                    for name, value in upstream.headers.items():
                        if name.lower() not in DROPPED_RESPONSE:
                            response.headers.add(name, scrubber.text(value))
                    reader = UsageReader(
                        wire, is_streaming(wire, data, upstream.headers.get("Content-Type", ""))
                    )
                    await response.prepare(request)
                    async for raw in upstream.content.iter_any():
                        if call.ttfb is None:
                            call.ttfb = time.perf_counter() - call.started
                        call.response_bytes += len(raw)
                        await self._pass_on(scrubber.feed(raw), call, reader, response)
                    await self._pass_on(scrubber.flush(), call, reader, response)
                    await response.write_eof()
                    return response
            except aiohttp.ClientConnectorError as error:
                call.status, call.error = 502, f"upstream unreachable: {error}"
                return error_response(
                    error_format(wire, request.headers), 502, "upstream unreachable"
                )
            except (TimeoutError, aiohttp.ClientError, ConnectionError) as error:
                call.error = f"upstream failed mid-response: {type(error).__name__}: {error}"
                if response is None:
                    call.status = 502
                    return error_response(
                        error_format(wire, request.headers), 502, "upstream failed"
                    )
                if request.transport is not None:
                    request.transport.abort()  # the harness sees the reset, as from the provider
                return response
        finally:
            usage = reader.result() if reader is not None else None
            if call.error is None and call.status >= 400 and call.error_text:
                call.error = call.error_text.decode(errors="replace")
            self._submit(
                route,
                call,
                request,
                wire,
                provider_name,
                requested,
                body,
                usage,
                refused=refused,
            )
            if reserved is not None and route.budget is not None:
                route.budget.release(reserved)

    @staticmethod
    async def _pass_on(
        chunk: bytes, call: _Call, reader: UsageReader, response: web.StreamResponse
    ) -> None:
        """One scrubbed piece of the upstream's answer: read for usage, kept, sent on."""
        if not chunk:
            return
        reader.feed(chunk)
        if call.status >= 400 and len(call.error_text) < ERROR_TEXT_BYTES:
            call.error_text += chunk[: ERROR_TEXT_BYTES - len(call.error_text)]
        if call.kept is not None and len(call.kept) < KEPT_BODY_BYTES:
            call.kept += chunk[: KEPT_BODY_BYTES - len(call.kept)]
        await response.write(chunk)

    def _refusal(self, route: TrialRoute, wire: Wire, requested: str | None) -> str | None:
        """Why the run's rules refuse this call, if they do."""
        policy, totals = route.policy, route.totals
        if wire is Wire.OTHER:
            return None
        if policy.max_tokens is not None and totals.total_tokens >= policy.max_tokens:
            route.totals = replace(totals, stopped_by="token cap")
            return f"the trial's token cap ({policy.max_tokens}) is reached"
        if policy.max_cost_usd is not None and (totals.cost or 0.0) >= policy.max_cost_usd:
            route.totals = replace(totals, stopped_by="cost cap")
            return f"the trial's cost cap (${policy.max_cost_usd:g}) is reached"
        if policy.refuse_other_models and policy.model and not same_model(requested, policy.model):
            return f"model {requested!r} is not this run's model {policy.model!r}"
        return None

    async def _scripted(self, request: web.Request) -> web.StreamResponse:
        route = self._routes.get(request.match_info["token"])
        wire = wire_of(request.match_info["tail"])
        body = json_object(await request.read())
        script = route.script if route is not None and route.script is not None else ()
        return await respond(request, wire, body, script)

    def _submit(
        self,
        route: TrialRoute | None,
        call: _Call,
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
        usage = usage or CallUsage()
        if route is not None and route.calls_dir is not None:
            route.seq += 1
            self._writer.submit(keep_bodies, route.calls_dir, route.seq, body, call.kept)
        record = CallRow(
            run_id=route.run_id if route else None,
            trial_id=route.trial_id if route else None,
            at=call.at,
            provider=provider,
            wire=wire.value,
            method=request.method,
            path="/" + request.match_info["tail"],
            model_requested=requested,
            model=usage.model,
            status=call.status,
            **usage.tokens.counts(),
            cost=cost_of(usage).usd if usage.total_tokens else 0.0,
            latency=time.perf_counter() - call.started,
            ttfb=call.ttfb,
            request_bytes=len(body),
            response_bytes=call.response_bytes,
            error=error or call.error,
            refused=refused,
            headers=redacted_headers(request.headers, route.token if route else ""),
            role=route.role if route else "agent",
        )
        if route is not None:
            route.rows.append(record)
            expected = route.policy.model  # the model that answered counts, else the one asked
            used = record.model or requested
            is_other = bool(expected) and not same_model(used, expected or "")
            route.totals = route.totals.with_call(record, is_other)
        self._writer.submit(self._record, record)
