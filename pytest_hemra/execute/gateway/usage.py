"""Token usage read from a model response as it streams through the gateway.

The gateway forwards every chunk and feeds it to a `UsageReader`, which keeps only what it
needs: memory stays bounded whatever the response size. A stream is never read line by line:
a chunk gets at most one C-level byte search for the field name every usage object holds
(`USAGE_MARKERS`), and only the SSE event around a hit is cut out and JSON-decoded. A content
delta is never decoded, and in a JSON string the name is followed by an escaped quote, so text
that mentions it does not match. Where the final usage ends the stream (Anthropic after
`message_start`, Chat), not even that: only the stream's last TAIL_BYTES are kept, by
reference, and searched when it ends.

Usage counts only once it is final: Anthropic's `message_delta`, Responses' closing
`response.*` event, a Chat usage chunk (or a whole JSON body). A stream cut before that has no
usage (`result()` is None): the call's tokens are unknown, never the partial counts of
`message_start`.
"""

from __future__ import annotations

import json
from typing import Any

from pytest_hemra.execute.gateway.sse import (
    event_data,
    event_start,
    last_boundary,
    last_boundary_after,
    next_boundary,
)
from pytest_hemra.execute.gateway.wire import CallUsage, Wire

MAX_EVENT_BYTES = 1 << 20  # an SSE event longer than this is skipped, never held whole
MAX_BODY_BYTES = 32 << 20  # a plain JSON body longer than this is given up on
FINAL_RESPONSE_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
# a name every usage object of the wire holds, with the quote that closes it as a JSON key
USAGE_MARKERS = {
    Wire.ANTHROPIC: b'output_tokens"',
    Wire.RESPONSES: b'output_tokens"',
    Wire.CHAT: b'prompt_tokens"',
}
DONE = b"[DONE]"
BILLED_WIRES = frozenset(USAGE_MARKERS)
# Anthropic's final usage (`message_delta`, then `message_stop`) and Chat's (the usage chunk, then
# `[DONE]`) end their streams: once Anthropic's `message_start` is read (a Chat stream: from its
# start) only a stream's last TAIL_BYTES are kept, by reference, and read when it ends. The
# Responses wire's final event holds the whole response, of any size: its streams are searched.
TAIL_WIRES = frozenset({Wire.ANTHROPIC, Wire.CHAT})
TAIL_BYTES = 64 * 1024


class UsageReader:
    """Reads a response body as it streams past (SSE or plain JSON) and finds its token usage."""

    def __init__(self, wire: Wire, streaming: bool) -> None:
        self._wire = wire
        self._streaming = streaming
        self._marker = USAGE_MARKERS.get(wire)
        self._body = bytearray()  # plain JSON, up to MAX_BODY_BYTES
        self._is_too_big = False
        self._pending = bytearray()  # the unfinished SSE event (or, skipping, its last bytes)
        self._is_skipping = False  # the unfinished event is past MAX_EVENT_BYTES: dropped
        self._is_pending_marked = False  # the unfinished event holds the marker
        self._is_done = False  # `data: [DONE]` seen
        self._tokens = _Tokens()
        self._tail: list[bytes] | None = None  # in tail mode: the stream's last chunks
        self._tail_size = 0
        self._is_tail_whole = True  # the tail starts where an event does
        if wire is Wire.CHAT and streaming:
            self._tail = []

    def feed(self, chunk: bytes) -> None:
        """Take the next chunk as forwarded; chunk boundaries may fall anywhere."""
        if self._marker is None or not chunk or self._is_done:
            return
        if not self._streaming:
            self._feed_body(chunk)
            return
        if self._tail is not None:
            self._keep_tail(chunk)
            return
        pending = self._pending
        if self._is_skipping or self._may_hold_usage(chunk):
            self._feed_events(chunk)
            if self._tokens.is_head_read and self._wire in TAIL_WIRES and not self._is_skipping:
                self._tail, self._tail_size = [bytes(pending)], len(pending)
                pending.clear()
            return
        # the common chunk: nothing to read in it, only where its unfinished event starts
        end = last_boundary_after(pending, chunk)
        if end < 0:
            pending += chunk
        else:
            pending[:] = memoryview(chunk)[end:]
        if len(pending) > MAX_EVENT_BYTES:
            self._is_skipping = True
            del pending[:-2]

    def _keep_tail(self, chunk: bytes) -> None:
        """Keep `chunk` by reference, and drop the oldest kept chunk while the rest are enough."""
        tail = self._tail
        assert tail is not None
        tail.append(chunk)
        self._tail_size += len(chunk)
        while self._tail_size - len(tail[0]) >= TAIL_BYTES:
            self._tail_size -= len(tail.pop(0))
            self._is_tail_whole = False

    def _read_tail(self) -> None:
        """The kept end of the stream, read from its first whole event on."""
        assert self._tail is not None
        window = bytearray().join(self._tail)
        self._tail = None
        if not self._is_tail_whole:
            first = next_boundary(window, 0, len(window))
            if first < 0:
                return
            del window[:first]
        self._pending = window
        self._is_pending_marked = False

    def _may_hold_usage(self, chunk: bytes) -> bool:
        """Whether the marker is in `chunk` or straddles its start; or, for a Chat stream whose
        usage was read, whether `[DONE]` might be."""
        assert self._marker is not None
        if self._is_pending_marked or (self._wire is Wire.CHAT and self._tokens.is_final):
            return True
        if chunk.find(self._marker) >= 0:
            return True
        reach = len(self._marker) - 1
        return bool(self._pending) and self._marker in self._pending[-reach:] + chunk[:reach]

    def _feed_events(self, chunk: bytes) -> None:
        """The unfinished event and `chunk` joined, and every complete event in them read."""
        pending = self._pending
        searched = max(0, len(pending) - 2)  # a blank line may straddle the old end
        pending += chunk
        if self._is_skipping:
            first = next_boundary(pending, 0, len(pending))
            if first < 0:
                del pending[:-2]
                return
            del pending[:first]
            self._is_skipping = False
            searched = 0
        end = last_boundary(pending, searched)
        if end > 0:
            self._read_events(pending, end)
            del pending[:end]
        if len(pending) > MAX_EVENT_BYTES:
            self._is_skipping = True
            del pending[:-2]
        marker = self._marker
        assert marker is not None
        self._is_pending_marked = not self._is_skipping and marker in pending

    def result(self) -> CallUsage | None:
        """The final usage, once the last chunk is fed; None if there was none (or none billed,
        or the response ended before its final count)."""
        if self._marker is None:
            return None
        if not self._streaming:
            return self._body_usage()
        if self._tail is not None:
            self._read_tail()
            end = last_boundary(self._pending)
            if end > 0:
                self._read_events(self._pending, end)
                del self._pending[:end]
        if not self._is_done and not self._is_skipping and self._pending:
            self._pending += b"\n\n"  # a stream cut before its last blank line
            self._read_events(self._pending, len(self._pending))
        self._pending.clear()
        return self._tokens.usage()

    def _feed_body(self, chunk: bytes) -> None:
        if self._is_too_big:
            return
        if len(self._body) + len(chunk) > MAX_BODY_BYTES:
            self._is_too_big = True
            self._body = bytearray()
            return
        self._body += chunk

    def _body_usage(self) -> CallUsage | None:
        if self._is_too_big:
            return None
        body = _decode(bytes(self._body))
        if body is None:
            return None
        if self._wire is Wire.ANTHROPIC:
            self._tokens.add_anthropic(body.get("usage"), is_delta=False, is_final=True)
        elif self._wire is Wire.RESPONSES:
            self._tokens.set_openai(body.get("usage"), "input_tokens", "input_tokens_details")
        else:
            self._tokens.set_openai(body.get("usage"), "prompt_tokens", "prompt_tokens_details")
        self._tokens.set_model(body.get("model"))
        return self._tokens.usage()

    def _read_events(self, buffer: bytearray, end: int) -> None:
        """Read the usage-bearing events among the complete ones in `buffer[:end]`."""
        assert self._marker is not None
        position = 0
        while True:
            hit = buffer.find(self._marker, position, end)
            if hit < 0:
                break
            start = event_start(buffer, hit)
            if self._is_done_before(buffer, position, start):
                return
            stop = next_boundary(buffer, hit, end)
            if stop - start <= MAX_EVENT_BYTES:
                event = _decode(event_data(buffer[start:stop]))
                if event is not None:
                    self._read_event(event)
            position = stop
        self._is_done_before(buffer, position, end)

    def _is_done_before(self, buffer: bytearray, start: int, end: int) -> bool:
        """Whether a Chat stream's `data: [DONE]` is among the events in `buffer[start:end]`:
        what follows it is not read. Looked for only once usage was read (what comes after
        `[DONE]` could only overwrite it): until then no chunk pays for the search."""
        if self._wire is not Wire.CHAT or not self._tokens.is_final:
            return False
        at = buffer.find(DONE, start, end)
        while at >= 0:
            first = event_start(buffer, at)
            stop = next_boundary(buffer, at, len(buffer))
            if event_data(buffer[first : stop if stop > 0 else len(buffer)]).strip() == DONE:
                self._is_done = True
                return True
            at = buffer.find(DONE, at + 1, end)
        return False

    def _read_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if self._wire is Wire.ANTHROPIC:
            if kind == "message_start":
                self._tokens.is_head_read = True
                message = _dict(event.get("message"))
                self._tokens.add_anthropic(message.get("usage"), is_delta=False, is_final=False)
                self._tokens.set_model(message.get("model"))
            elif kind == "message_delta":
                self._tokens.add_anthropic(event.get("usage"), is_delta=True, is_final=True)
        elif self._wire is Wire.RESPONSES:
            if kind in FINAL_RESPONSE_EVENTS:
                response = _dict(event.get("response"))
                self._tokens.set_openai(
                    response.get("usage"), "input_tokens", "input_tokens_details"
                )
                self._tokens.set_model(response.get("model"))
        elif event.get("usage") is not None:
            self._tokens.set_openai(event.get("usage"), "prompt_tokens", "prompt_tokens_details")
            self._tokens.set_model(event.get("model"))


def is_streaming(wire: Wire, request_body: dict[str, object], content_type: str) -> bool:
    """Whether a response is SSE: its content type says so; without one, the request's `stream`.

    An error answers a streaming request with plain JSON, so the content type wins when present.
    """
    if wire is Wire.COUNT_TOKENS:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "text/event-stream":
        return True
    if media == "application/json" or media.endswith("+json"):
        return False
    return request_body.get("stream") is True


class _Tokens:
    """The counts found so far, in each provider's terms until `usage()` normalizes them."""

    def __init__(self) -> None:
        self.is_final = False  # the response's final counts were read
        self.is_head_read = False  # Anthropic's `message_start` was read
        self.input = 0  # excluding cached input
        self.output = 0
        self.cache_read = 0
        self.cache_write = 0
        self.model: str | None = None

    def add_anthropic(self, usage: object, *, is_delta: bool, is_final: bool) -> None:
        """Anthropic reports cached input apart; a `message_delta` overrides what it carries
        and is the final count (`message_start`'s output is a placeholder)."""
        if not isinstance(usage, dict):
            return
        self.is_final = self.is_final or is_final
        fields = {
            "input": "input_tokens",
            "output": "output_tokens",
            "cache_read": "cache_read_input_tokens",
            "cache_write": "cache_creation_input_tokens",
        }
        for attribute, key in fields.items():
            # in a delta an absent or null field means "unchanged", not zero
            if not is_delta or usage.get(key) is not None:
                setattr(self, attribute, _count(usage.get(key)))

    def set_openai(self, usage: object, input_key: str, details_key: str) -> None:
        """OpenAI's input count includes `cached_tokens`: they move to cache reads here."""
        if not isinstance(usage, dict):
            return
        self.is_final = True
        cached = _count(_dict(usage.get(details_key)).get("cached_tokens"))
        self.input = max(0, _count(usage.get(input_key)) - cached)
        self.cache_read = cached
        self.cache_write = 0
        output_key = "output_tokens" if input_key == "input_tokens" else "completion_tokens"
        self.output = _count(usage.get(output_key))

    def set_model(self, model: object) -> None:
        if isinstance(model, str) and model:
            self.model = model

    def usage(self) -> CallUsage | None:
        if not self.is_final:
            return None
        return CallUsage(
            input_tokens=self.input,
            output_tokens=self.output,
            cache_read_tokens=self.cache_read,
            cache_write_tokens=self.cache_write,
            model=self.model,
        )


def _decode(data: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _count(value: object) -> int:
    """A token count; missing, null or nonsense counts as 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    return max(0, int(value))
