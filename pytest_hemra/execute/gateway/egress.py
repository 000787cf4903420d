"""The egress proxy: how a task with a host allowlist (`network_mode = "allowlist"`) reaches
exactly its `allowed_hosts`.

An HTTP proxy on the gateway's loop and addresses, a port of its own: `CONNECT host:port`
tunnels (HTTPS) and absolute-URI plain HTTP requests. Each trial phase gets its own credential
(`open`), presented as proxy Basic auth (`http://hemra:<credential>@<host>:<port>`); a request
without a live one is answered 407, a destination off the phase's allowlist 403 and counted as
refused. A name on the list is resolved once and the connection made to the address that was
checked (`HostAllowlist.refusal`: no link-local, loopback or runner address unless listed
literally), so a name cannot be re-pointed between the check and the connection. The sandbox
itself has no route out (`hemra-gateway`): a program that ignores the proxy reaches nothing.
"""

from __future__ import annotations

import asyncio
import binascii
import contextlib
import hmac
import ipaddress
import json
import secrets
import socket
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import hdrs, web
from yarl import URL

from pytest_hemra.resolve.allowlist import HostAllowlist

PROXY_USER = "hemra"
CONNECT_SECS = 30.0
TUNNEL_CHUNK = 64 * 1024
PAUSE_BYTES = 256 * 1024  # a tunnel's side stops reading while the other holds this much unsent
HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection", "Keep-Alive", "Proxy-Authorization", "Proxy-Authenticate",
        "Proxy-Connection", "TE", "Trailer", "Transfer-Encoding", "Upgrade",
    )
)  # fmt: skip


@dataclass
class EgressPass:
    """One trial phase's access through the proxy: its allowlist and what it asked for."""

    credential: str
    trial_id: str
    allowlist: HostAllowlist
    is_open: bool = True
    allowed: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    reasons: dict[str, str] = field(default_factory=dict)

    def summary(self) -> dict[str, object]:
        """What the trial folder keeps (`agent/egress.json`): never the credential."""
        return {
            "schema_version": 1,
            "allowed_hosts": list(self.allowlist.entries),
            "allowed": dict(sorted(self.allowed.items())),
            "refused": {
                host: {"count": count, "reason": self.reasons.get(host, "")}
                for host, count in sorted(self.refused.items())
            },
        }

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.summary(), indent=1) + "\n")


def proxy_env(proxy_url: str, direct: Sequence[str]) -> dict[str, str]:
    """An allowlist phase's sandbox (the agent's, a verifier's): every HTTP(S) client pointed
    at the egress proxy (both spellings: curl reads only the lower-case `http_proxy`), the
    `direct` hosts reached without it: the gateway, and a multi-container task's services
    (on the trial's own network, as Compose has them)."""
    if not proxy_url:
        return {}
    proxies = {name: proxy_url for name in ("HTTP_PROXY", "HTTPS_PROXY")}
    bypass = ",".join(dict.fromkeys(direct))
    return {
        **proxies,
        **{name.lower(): url for name, url in proxies.items()},
        "NO_PROXY": bypass,
        "no_proxy": bypass,
    }


class Refused(Exception):
    """A destination the phase may not reach (403), with the reason kept for the trial."""


class EgressProxy:
    """Serves on the gateway's loop; `open`/`close` are called from the synchronous side."""

    def __init__(self) -> None:
        self.urls: dict[str, str] = {}  # listening host -> http://host:port
        self._passes: dict[str, EgressPass] = {}
        self._runner: web.ServerRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    def open(self, trial_id: str, hosts: tuple[str, ...]) -> EgressPass:
        credential = "hemra-egress-" + secrets.token_urlsafe(24)
        grant = EgressPass(credential, trial_id, HostAllowlist(hosts))
        self._passes[credential] = grant
        return grant

    def close(self, grant: EgressPass) -> None:
        grant.is_open = False
        self._passes.pop(grant.credential, None)

    def proxy_url(self, grant: EgressPass, host: str) -> str:
        """The proxy as the sandbox's environment names it, credential included."""
        return self.urls[host].replace("http://", f"http://{PROXY_USER}:{grant.credential}@", 1)

    async def serve(self, hosts: list[str]) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, use_dns_cache=False),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_SECS),
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),  # no cookie of one trial's host reaches another
        )
        self._runner = web.ServerRunner(web.Server(self._handle), access_log=None)
        await self._runner.setup()
        port = 0
        for host in hosts:
            site = web.TCPSite(self._runner, host, port)
            try:
                await site.start()
            except OSError:
                if port == 0:
                    raise
                site = web.TCPSite(self._runner, host, 0)  # the first host's port taken here
                await site.start()
            bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            port = port or bound
            self.urls[host] = f"http://{host}:{bound}"

    async def shutdown(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def _pass_of(self, request: web.BaseRequest) -> EgressPass | None:
        """The live pass whose credential the request's Proxy-Authorization presents."""
        header = request.headers.get(hdrs.PROXY_AUTHORIZATION, "")
        try:
            presented = aiohttp.BasicAuth.decode(header).password if header else ""
        except (ValueError, binascii.Error):
            return None
        for credential, grant in list(self._passes.items()):
            if presented and hmac.compare_digest(presented, credential) and grant.is_open:
                return grant
        return None

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        grant = self._pass_of(request)
        if grant is None:
            return web.Response(
                status=407,
                text="HEMRA egress proxy: a live trial credential is required\n",
                headers={hdrs.PROXY_AUTHENTICATE: 'Basic realm="hemra"'},
            )
        target = _target(request)
        if target is None:
            return web.Response(status=400, text="expected CONNECT or an absolute http:// URI\n")
        host, port = target.raw_host or "", target.port or 443
        try:
            address = await self._destination(grant, host, port)
        except Refused as refusal:
            name = host.lower().strip("[]")
            grant.refused[name] += 1
            grant.reasons[name] = str(refusal)
            return web.Response(status=403, text=f"HEMRA egress proxy refused: {refusal}\n")
        grant.allowed[host.lower().strip("[]")] += 1
        if request.method == hdrs.METH_CONNECT:
            return await self._tunnel(request, address, port)
        return await self._forward(request, target, address)

    async def _destination(self, grant: EgressPass, host: str, port: int) -> str:
        """The one address to connect to: the name checked against the list, resolved once,
        and the address checked (`HostAllowlist.refusal`)."""
        name = host.strip("[]")
        if not name or not grant.allowlist.names(name):
            raise Refused(f"{name or '(no host)'} is not on the task's allowed_hosts")
        loop = asyncio.get_running_loop()
        try:
            found = await loop.getaddrinfo(name, port, type=socket.SOCK_STREAM)
        except OSError as error:
            raise Refused(f"{name} does not resolve ({error})") from error
        reasons = []
        for *_, sockaddr in found:
            address = ipaddress.ip_address(str(sockaddr[0]).split("%")[0])
            reason = grant.allowlist.refusal(address)
            if reason is None:
                return str(address)
            reasons.append(reason)
        raise Refused(f"{name}: " + "; ".join(dict.fromkeys(reasons)))

    async def _tunnel(
        self, request: web.BaseRequest, address: str, port: int
    ) -> web.StreamResponse:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(address, port, limit=TUNNEL_CHUNK), CONNECT_SECS
            )
        except (OSError, TimeoutError) as error:
            return web.Response(status=502, text=f"cannot connect: {error}\n")
        response = web.StreamResponse(status=200, reason="Connection established")
        await response.prepare(request)
        client = request.transport
        assert client is not None
        # the client's bytes after the CONNECT are handed to us as aiohttp hands a websocket's
        request.protocol.set_parser(_Upstream(writer, client))  # type: ignore[arg-type]
        try:
            while chunk := await reader.read(TUNNEL_CHUNK):
                await response.write(chunk)
        except (OSError, ConnectionError):
            pass
        finally:
            writer.close()
            request.protocol.force_close()
        return response

    async def _forward(
        self, request: web.BaseRequest, target: URL, address: str
    ) -> web.StreamResponse:
        """A plain HTTP request sent on to the checked address, its Host kept."""
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        headers[hdrs.HOST] = target.raw_authority
        url = target.with_host(address)
        try:
            async with self._session.request(
                request.method,
                url,
                headers=headers,
                data=request.content if request.body_exists else None,
                allow_redirects=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
            ) as upstream:
                response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                for name, value in upstream.headers.items():
                    if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                        response.headers.add(name, value)
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            return web.Response(status=502, text=f"upstream failed: {error}\n")


def _target(request: web.BaseRequest) -> URL | None:
    """Where the client asks to go, from the request line as sent (`raw_path`): `host:port`
    for CONNECT, an absolute `http://` URI otherwise; None for anything else."""
    raw = request.raw_path
    try:
        if request.method == hdrs.METH_CONNECT:
            return URL("//" + raw) if "/" not in raw else None
        if raw[:7].lower() == "http://":
            return URL(raw)
    except ValueError:
        return None
    return None


class _Upstream:
    """The client side of a tunnel, fed by aiohttp's protocol once the CONNECT is answered:
    every byte goes to the destination; reading pauses while the destination lags."""

    def __init__(self, writer: asyncio.StreamWriter, client: asyncio.Transport) -> None:
        self._writer, self._client = writer, client
        self._resuming: set[asyncio.Future[None]] = set()

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        if not self._writer.is_closing():
            self._writer.write(data)
            if self._writer.transport.get_write_buffer_size() > PAUSE_BYTES:
                self._client.pause_reading()
                resuming = asyncio.ensure_future(self._resume())
                self._resuming.add(resuming)
                resuming.add_done_callback(self._resuming.discard)
        return False, b""

    async def _resume(self) -> None:
        with contextlib.suppress(OSError, ConnectionError):
            await self._writer.drain()
        if not self._client.is_closing():
            self._client.resume_reading()

    def feed_eof(self) -> None:
        if not self._writer.is_closing() and self._writer.can_write_eof():
            self._writer.write_eof()
