"""Token usage read from a model response as it streams through the gateway.

The gateway forwards every chunk and feeds it to a `UsageReader`, which keeps only what it
needs: memory stays bounded whatever the response size. A stream is never read line by line:
a chunk gets at most one C-level byte search for the field name every usage object holds
(`USAGE_MARKERS`), and only the SSE event around a hit is cut out and JSON-decoded. A content
delta is never decoded, and in a JSON string the name is followed by an escaped quote, so text
that mentions it does not match. Where the final usage ends the stream (Anthropic after
`message_start`, Chat), not even that: only the stream's last TAIL_BYTES are kept, by
reference, and searched when it ends.

An event longer than MAX_EVENT_BYTES is not held: it is skipped, but for a Responses stream's
(whose final event holds the whole response, megabytes for a long output), which a
`FieldScanner` reads as it streams past for its type, model and usage, holding none of the rest.

Usage counts only once it is final: Anthropic's `message_delta`, Responses' closing
`response.*` event, a Chat usage chunk (or a whole JSON body). A stream cut before that has no
usage (`result()` is None): the call's tokens are unknown, never the partial counts of
`message_start`, which `partial()` gives apart (the row flags them partial). An Anthropic
`error` event's text (and a failed response's error) is kept in `error_text`.
"""

from __future__ import annotations

import json
from typing import Any

from pytest_hemra.execute.gateway.jsonscan import FieldScanner
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
ERROR_MARKER = b'"error"'  # an Anthropic `error` event's type and key (a JSON string escapes it)
FINAL_FIELDS = frozenset({("type",), ("response", "usage"), ("response", "model")})
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
        self._error_marker = ERROR_MARKER if wire is Wire.ANTHROPIC else None
        self._markers = tuple(m for m in (self._marker, self._error_marker) if m is not None)
        self.error_text: str | None = None  # an error event's, as `type: message`
        self._big: FieldScanner | None = None  # the oversize Responses event being scanned
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
            self._skip_pending()

    def _skip_pending(self) -> None:
        """The unfinished event passed MAX_EVENT_BYTES: dropped, never held whole; a Responses
        stream's is scanned for its final usage as the rest of it streams past."""
        pending = self._pending
        if self._wire is Wire.RESPONSES:
            self._big = FieldScanner(FINAL_FIELDS)
            self._scan_big(pending)
        self._is_skipping = True
        del pending[:-2]

    def _scan_big(self, part: bytes | bytearray) -> None:
        big = self._big
        if big is None:
            return
        big.feed(part)
        is_typed = ("type",) in big.found
        if big.is_given_up or (is_typed and big.value(("type",)) not in FINAL_RESPONSE_EVENTS):
            self._big = None  # not a final event: nothing to read in it

    def _finish_big(self) -> None:
        """The oversize event ended: its usage, if it is a final one."""
        big, self._big = self._big, None
        if big is None or big.value(("type",)) not in FINAL_RESPONSE_EVENTS:
            return
        response_usage = big.value(("response", "usage"))
        self._tokens.set_openai(response_usage, "input_tokens", "input_tokens_details")
        self._tokens.set_model(big.value(("response", "model")))

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
        for marker in self._markers:
            if chunk.find(marker) >= 0:
                return True
            reach = len(marker) - 1
            if self._pending and marker in self._pending[-reach:] + chunk[:reach]:
                return True
        return False

    def _feed_events(self, chunk: bytes) -> None:
        """The unfinished event and `chunk` joined, and every complete event in them read."""
        pending = self._pending
        searched = max(0, len(pending) - 2)  # a blank line may straddle the old end
        carried = len(pending)
        pending += chunk
        if self._is_skipping:
            first = next_boundary(pending, 0, len(pending))
            if first < 0:
                self._scan_big(chunk)
                del pending[:-2]
                return
            if self._big is not None:
                self._scan_big(chunk[: max(0, first - carried)])
                self._finish_big()
            del pending[:first]
            self._is_skipping = False
            searched = 0
        end = last_boundary(pending, searched)
        if end > 0:
            self._read_events(pending, end)
            del pending[:end]
        if len(pending) > MAX_EVENT_BYTES:
            self._skip_pending()
        marker = self._marker
        assert marker is not None
        self._is_pending_marked = not self._is_skipping and (
            marker in pending or (self._error_marker is not None and ERROR_MARKER in pending)
        )

    def result(self) -> CallUsage | None:
        """The final usage, once the last chunk is fed; None if there was none (or none billed,
        or the response ended before its final count)."""
        if self._marker is None:
            return None
        if not self._streaming:
            return self._body_usage()
        if self._big is not None:
            self._finish_big()  # a stream ended before the oversize event's blank line
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

    def partial(self) -> CallUsage | None:
        """What a stream that ended before its final count had said of its tokens (Anthropic's
        `message_start`: input and cache counts; its output is a placeholder, given as 0): None
        when the usage was final, or nothing was said. Call after `result()`."""
        tokens = self._tokens
        if tokens.is_final or not tokens.is_head_read:
            return None
        return CallUsage(tokens.input, 0, tokens.cache_read, tokens.cache_write, tokens.model)

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
            if self._error_marker is not None:
                error = buffer.find(self._error_marker, position, hit if hit >= 0 else end)
                hit = error if error >= 0 else hit
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
            elif kind == "error":
                self.error_text = _error_text(event.get("error"))
        elif self._wire is Wire.RESPONSES:
            if kind in FINAL_RESPONSE_EVENTS:
                response = _dict(event.get("response"))
                if kind == "response.failed" and response.get("error") is not None:
                    self.error_text = _error_text(response.get("error"))
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


def _error_text(error: object) -> str:
    """An error object as `type: message` (or its JSON, cut short)."""
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        kind = error.get("type") or error.get("code")
        return f"{kind}: {error['message']}" if kind else error["message"]
    return json.dumps(error, ensure_ascii=False)[:500]


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _count(value: object) -> int:
    """A token count; missing, null or nonsense counts as 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    return max(0, int(value))
