"""One call's trip upstream and back: the request sent, and the upstream's answer passed to the
client a chunk at a time as it arrives, real keys scrubbed out, usage read, the usage the
gateway asked for taken back out, a copy kept for the trial folder.

Per chunk that is a few C-level byte searches and copies, never a Python loop over lines or
events: streams of small events pass at close to the speed of the wire. Who ended a call early
is told apart: a client that hangs up (`CLIENT_GONE`), an upstream that fails mid-response
(`UPSTREAM_FAILED`, the client then sees the reset as it would from the provider), or one that
cannot be reached.

An answer the upstream compressed although asked for `identity` (`encoding`) reaches the client
as the upstream sent it, with its `Content-Encoding`, while the gateway decodes a copy to scrub
and read: a compressed chunk is passed on once its decoded bytes are scrubbed, and one that
holds a key is never passed (the connection is cut, recorded). A compressed Chat stream whose
usage the gateway asked for is the one exception: the usage chunk cannot be taken out of
compressed bytes, so its client gets the decoded stream without the usage (no
`Content-Encoding`), as would a compressed plain answer that held a key, scrubbed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Mapping
from typing import Any

import aiohttp
from aiohttp import web

from pytest_hemra.execute.gateway.bodies import KEPT_BODY_BYTES, error_format, error_response
from pytest_hemra.execute.gateway.calls import CLIENT_GONE, UPSTREAM_FAILED, Call
from pytest_hemra.execute.gateway.chatusage import AddedUsageFilter
from pytest_hemra.execute.gateway.encoding import DECODABLE, Decoder, content_coding
from pytest_hemra.execute.gateway.headers import DROPPED_RESPONSE
from pytest_hemra.execute.gateway.scrub import KeyScrubber
from pytest_hemra.execute.gateway.usage import UsageReader, is_streaming
from pytest_hemra.execute.gateway.wire import CallUsage, Wire

ERROR_TEXT_BYTES = 2048
# One read of the upstream's socket takes up to this much (asyncio's default: 256 KiB), and up to
# this much waits in the client's socket buffer before the relay waits for it (default: 64 KiB):
# a fast stream then passes in a few large reads and writes, and each costs the same whatever its
# size (measured: the gateway's CPU per MiB about 1.7 -> 1.1 ms with 100-byte events). A read
# takes what has arrived, never waits for more, so a slow stream's events pass as they come.
READ_BYTES = 1 << 20
WRITE_BUFFER_BYTES = 512 * 1024
# A plain answer of known length up to this is read whole and passed on in one write, its
# headers with it and its length declared, where a chunked answer takes three (headers, body,
# end): the gateway's system time per plain call fell from about 230 to 140 us
WHOLE_BODY_BYTES = 1 << 20
# a compressed plain answer that held a key leaves decoded and scrubbed, if it decodes to at most
# this; a larger one (a small body can inflate enormously) is a 502, never held whole
SCRUBBED_BODY_BYTES = 32 << 20


class ClientGone(Exception):
    """The client hung up while the gateway was answering it."""


class EchoedKey(Exception):
    """A compressed answer held a real key: it cannot be scrubbed without being decoded."""


class Relay:
    def __init__(self, call: Call, wire: Wire, scrubber: KeyScrubber) -> None:
        self._call = call
        self._wire = wire
        self._scrubber = scrubber
        self._reader: UsageReader | None = None
        self._added_usage: AddedUsageFilter | None = None
        self._response: web.StreamResponse | None = None
        self._decoder: Decoder | None = None  # the answer is compressed: the gateway's copy
        self._is_passed_encoded = False  # the client is passed the compressed bytes
        self._held_raw: list[bytes] = []  # compressed, held while their scrub holds a key's start

    def usage(self) -> CallUsage | None:
        """The answer's final usage, if it was read (call once the relay is over); what the
        answer said short of that is noted on the call: an error event's text, and the counts
        a stream gave before it ended unfinished."""
        if self._reader is None:
            return None
        usage = self._reader.result()
        self._call.stream_error = self._reader.error_text
        self._call.partial = self._reader.partial() if usage is None else None
        return usage

    async def run(
        self,
        session: aiohttp.ClientSession,
        request: web.Request,
        url: str,
        headers: Mapping[str, str],
        body: bytes,
        data: dict[str, Any],
        *,
        is_usage_added: bool = False,
    ) -> web.StreamResponse:
        """Send `body` to `url` and answer `request` with what comes back. `data` is the
        client's request as sent (its `stream` tells an SSE answer without a content type);
        `is_usage_added`: the gateway asked for usage the client did not."""
        call, wire = self._call, self._wire
        try:
            call.is_sent = True
            async with session.request(
                request.method, url, headers=headers, data=body, allow_redirects=False
            ) as upstream:
                call.status = call.upstream_status = upstream.status
                _read_large(upstream)
                streaming = is_streaming(wire, data, upstream.headers.get("Content-Type", ""))
                self._reader = UsageReader(wire, streaming)
                coding = content_coding(upstream.headers)
                if coding:
                    if coding not in DECODABLE:
                        call.status = 502
                        call.error = f"upstream answered in an encoding HEMRA cannot read: {coding}"
                        return error_response(error_format(wire, request.headers), 502, call.error)
                    self._decoder = Decoder(coding)
                length = upstream.content_length
                if not streaming and length is not None and length <= WHOLE_BODY_BYTES:
                    return await self._answer_whole(request, upstream)
                if is_usage_added and streaming and upstream.status < 400:
                    self._added_usage = AddedUsageFilter()
                self._is_passed_encoded = self._decoder is not None and self._added_usage is None
                # what arrived with the headers leaves with them, in one write (an upstream
                # writes its first event just after its headers: one turn of the loop reads it)
                first = upstream.content.read_nowait()
                if not first and streaming:
                    await asyncio.sleep(0)
                    first = upstream.content.read_nowait()
                response = (_Coalesced if first else web.StreamResponse)(
                    status=upstream.status, reason=upstream.reason
                )
                self._copy_headers(upstream, response, self._is_passed_encoded)
                self._response = response
                try:
                    await response.prepare(request)
                except ConnectionError as error:
                    raise ClientGone from error
                if request.transport is not None:
                    request.transport.set_write_buffer_limits(high=WRITE_BUFFER_BYTES)
                if first:
                    await self._pass_on(first)
                async for raw in upstream.content.iter_any():
                    await self._pass_on(raw)
                await self._close()
                return response
        except ClientGone as gone:
            call.error = f"{CLIENT_GONE}: {gone.__cause__ or 'connection closed'}"
            return self._response or web.Response(status=499)
        except EchoedKey:
            call.error = "upstream echoed a key in a compressed answer: not passed on"
            if self._response is None:  # a plain answer too large to be passed on scrubbed
                call.status = 502
                return error_response(error_format(wire, request.headers), 502, call.error)
            if request.transport is not None:
                request.transport.abort()  # a stream is cut before the chunk that holds it
            return self._response
        except aiohttp.ClientConnectorError as error:
            call.is_sent = False
            call.status, call.error = 502, f"upstream unreachable: {error}"
            return error_response(error_format(wire, request.headers), 502, "upstream unreachable")
        except (TimeoutError, aiohttp.ClientError, ConnectionError) as error:
            call.error = f"{UPSTREAM_FAILED}: {type(error).__name__}: {error}"
            if self._response is None:
                call.status = 502
                return error_response(error_format(wire, request.headers), 502, "upstream failed")
            if request.transport is not None:
                request.transport.abort()  # the harness sees the reset, as from the provider
            return self._response

    async def _answer_whole(
        self, request: web.Request, upstream: aiohttp.ClientResponse
    ) -> web.StreamResponse:
        """A plain answer of known length: read whole, scrubbed, read for usage and passed on
        in one write with its headers (compressed: as it came, unless it held a key)."""
        raw = await upstream.read()
        is_encoded = self._decoder is not None
        if self._decoder is None:
            body = self._taken(raw) + self._held_back()
            self._note(body)
        else:
            self._count(raw)
            kept: list[bytes] = []
            size = 0
            for clean in (*self._decoded(raw), self._decoded_end()):
                self._note(clean)
                size += len(clean)
                if size <= SCRUBBED_BODY_BYTES:
                    kept.append(clean)
            is_encoded = not self._scrubber.found
            if not is_encoded and size > SCRUBBED_BODY_BYTES:
                raise EchoedKey
            body = raw if is_encoded else b"".join(kept)
        response = web.Response(status=upstream.status, reason=upstream.reason, body=body)
        self._copy_headers(upstream, response, is_encoded)
        self._response = response
        try:
            await response.prepare(request)
            await response.write_eof()
        except ConnectionError as error:
            raise ClientGone from error
        return response

    def _copy_headers(
        self, upstream: aiohttp.ClientResponse, response: web.StreamResponse, is_encoded: bool
    ) -> None:
        """The upstream's headers, scrubbed; its `Content-Encoding` only with its bytes."""
        for name, value in upstream.headers.items():
            lowered = name.lower()
            if lowered not in DROPPED_RESPONSE or (is_encoded and lowered == "content-encoding"):
                response.headers.add(name, self._scrubber.text(value))

    def _count(self, raw: bytes) -> None:
        call = self._call
        if call.ttfb is None:
            call.ttfb = time.perf_counter() - call.started
        call.response_bytes += len(raw)

    def _taken(self, raw: bytes) -> bytes:
        """Upstream bytes as they arrived: counted, scrubbed and read for usage; what of them
        may be passed on."""
        self._count(raw)
        chunk = self._scrubber.feed(raw)
        assert self._reader is not None
        self._reader.feed(chunk)
        return chunk

    def _decoded(self, raw: bytes) -> Iterator[bytes]:
        """Compressed bytes decoded by the gateway a piece at a time: scrubbed and read for
        usage (a piece is 1 MiB at most, however much the chunk inflates)."""
        assert self._decoder is not None and self._reader is not None
        for piece in self._decoder.feed(raw):
            clean = self._scrubber.feed(piece)
            self._reader.feed(clean)
            yield clean

    def _decoded_end(self) -> bytes:
        """At a compressed answer's end, what the decoder and the scrub held back."""
        assert self._decoder is not None and self._reader is not None
        clean = self._scrubber.feed(self._decoder.flush()) + self._scrubber.flush()
        self._reader.feed(clean)
        return clean

    def _held_back(self) -> bytes:
        """At the answer's end, what the scrub held back (it held no key), read for usage."""
        chunk = self._scrubber.flush()
        assert self._reader is not None
        self._reader.feed(chunk)
        return chunk

    async def _pass_on(self, raw: bytes) -> None:
        """One chunk of the upstream's answer, as it arrived."""
        if self._decoder is not None:
            await self._pass_on_encoded(raw)
            return
        chunk = self._taken(raw)
        if self._added_usage is not None:
            chunk = self._added_usage.feed(chunk)
        await self._send(chunk)

    async def _pass_on_encoded(self, raw: bytes) -> None:
        """A compressed chunk: passed on as it came once its decoded bytes hold no key (nor the
        start of one), or, usage taken out, decoded."""
        self._count(raw)
        found = self._scrubber.found
        if self._is_passed_encoded:
            for clean in self._decoded(raw):
                if self._scrubber.found != found:
                    raise EchoedKey
                self._note(clean)
            self._held_raw.append(raw)
            if not self._scrubber.is_holding:
                held, self._held_raw = b"".join(self._held_raw), []
                await self._send(held, is_noted=False)
            return
        assert self._added_usage is not None
        for clean in self._decoded(raw):
            await self._send(self._added_usage.feed(clean))

    async def _close(self) -> None:
        """The upstream's answer is complete: what was held back, then the end."""
        if self._decoder is None:
            chunk = self._held_back()
        else:
            found = self._scrubber.found
            chunk = self._decoded_end()
            if self._is_passed_encoded:
                if self._scrubber.found != found:
                    raise EchoedKey
                self._note(chunk)
                chunk, self._held_raw = b"".join(self._held_raw), []
        if self._added_usage is not None:
            chunk = self._added_usage.feed(chunk) + self._added_usage.flush()
        await self._send(chunk, is_noted=not self._is_passed_encoded)
        assert self._response is not None
        try:
            await self._response.write_eof()
        except ConnectionError as error:
            raise ClientGone from error

    def _note(self, chunk: bytes) -> None:
        """What the client is sent, kept: an error's text, and the body for the trial folder."""
        call = self._call
        if call.status >= 400 and len(call.error_text) < ERROR_TEXT_BYTES:
            call.error_text += chunk[: ERROR_TEXT_BYTES - len(call.error_text)]
        if call.kept is not None and len(call.kept) < KEPT_BODY_BYTES:
            call.kept += chunk[: KEPT_BODY_BYTES - len(call.kept)]

    async def _send(self, chunk: bytes, *, is_noted: bool = True) -> None:
        if not chunk:
            return
        if is_noted:
            self._note(chunk)
        assert self._response is not None
        try:
            await self._response.write(chunk)
        except ConnectionError as error:
            raise ClientGone from error


class _Coalesced(web.StreamResponse):
    """A streamed answer whose first bytes are at hand: its headers leave with them, in one write
    (aiohttp sends a stream's headers at once, in a write of their own). Measured in the
    benchmark's setting, seven runs each way: the first streamed byte 1.27 ms after direct's
    (median) against 1.47. Should aiohttp drop this attribute, the headers leave on their own."""

    _send_headers_immediately = False


def _read_large(upstream: aiohttp.ClientResponse) -> None:
    """Let the upstream's socket be read READ_BYTES at a time, where its transport reads with a
    `max_size` (asyncio's plain sockets; a TLS transport reads its own way and is left as is)."""
    transport = upstream.connection.transport if upstream.connection is not None else None
    if transport is not None and isinstance(getattr(transport, "max_size", None), int):
        transport.max_size = READ_BYTES  # type: ignore[attr-defined]
