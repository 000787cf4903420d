"""Every streamed Chat Completions call carries usage, and its client still gets the stream it
asked for.

OpenAI streams Chat Completions without usage unless the request sets
`stream_options.include_usage`, and LiteLLM (under aider and mini-swe-agent) and many other
clients never set it: such a call would be counted as nothing. The gateway sets it when the
client did not (`with_usage_asked`), and `AddedUsageFilter` takes back out of what the client
receives what the option added: the usage-only chunk before `[DONE]` (or the `usage` of a chunk
that also carries choices, where a compatible server puts it there) and the `"usage": null`
that every other chunk then carries. The gateway reads the usage from the stream as the
upstream sent it, before this filter.
"""

from __future__ import annotations

import json
from typing import Any

from pytest_hemra.execute.gateway.sse import (
    event_data,
    event_start,
    last_boundary_after,
    next_boundary,
)
from pytest_hemra.execute.gateway.usage import MAX_EVENT_BYTES, USAGE_MARKERS
from pytest_hemra.execute.gateway.wire import Wire

ASKED = b'"stream_options":{"include_usage":true}'
# how `"usage": null` is spelled on every chunk: OpenAI's compact JSON, and Python's default
NULL_USAGE = (b',"usage":null', b', "usage": null')
MARKER = USAGE_MARKERS[Wire.CHAT]


def with_usage_asked(body: bytes, data: dict[str, Any]) -> bytes | None:
    """The request body with `stream_options.include_usage` set, or None when it is set already
    or the call does not stream. `data` is `body` parsed."""
    if data.get("stream") is not True:
        return None
    options = data.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return None
    opened = body.lstrip()
    if options is None and opened.startswith(b"{"):  # the common case: one key put in front,
        rest = opened[1:]  # the rest of the client's bytes kept as they were
        return b"{" + ASKED + (b"" if rest.lstrip().startswith(b"}") else b",") + rest
    asked = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    return json.dumps({**data, "stream_options": asked}).encode()


class AddedUsageFilter:
    """A Chat stream as the client would have had it without `include_usage`: fed what the
    upstream sent, it returns what to forward. Whole events only: a started event is held back
    until its blank line arrives (a usage chunk is known only whole); an event past
    MAX_EVENT_BYTES, and all after it, passes as it comes."""

    def __init__(self) -> None:
        self._pending = bytearray()
        self._is_passing = False
        self._null_usage: bytes | None = None  # as this upstream spells it, once seen
        self._is_spelling_known = False

    def feed(self, chunk: bytes) -> bytes:
        if self._is_passing:
            return chunk
        pending = self._pending
        end = last_boundary_after(pending, chunk)
        if end < 0:  # no event ends here
            pending += chunk
            if len(pending) > MAX_EVENT_BYTES:
                self._is_passing = True
                return self.flush()
            return b""
        view = memoryview(chunk)
        if pending:
            events = b"".join((pending, view[:end]))
        else:
            events = chunk if end == len(chunk) else bytes(view[:end])
        pending[:] = view[end:]
        return self._cleaned(events)

    def flush(self) -> bytes:
        """What is held back: at the stream's end, an unfinished event as it came."""
        held = bytes(self._pending)
        self._pending.clear()
        return held

    def _cleaned(self, events: bytes) -> bytes:
        if not self._is_spelling_known:
            self._null_usage = next((null for null in NULL_USAGE if null in events), None)
            self._is_spelling_known = True
        if self._null_usage is not None:  # split and join: a fifth faster than replace here
            events = b"".join(events.split(self._null_usage))
        hit = events.find(MARKER)
        if hit < 0:
            return events
        pieces, position = [], 0
        while hit >= 0:
            start = event_start(events, hit)
            stop = next_boundary(events, hit, len(events))
            pieces += [events[position:start], _without_usage(events[start:stop])]
            position = stop
            hit = events.find(MARKER, position)
        pieces.append(events[position:])
        return b"".join(pieces)


def _without_usage(event: bytes) -> bytes:
    """An event without the usage the gateway asked for: gone when usage is all its chunk
    carries (no choices), else the chunk re-encoded without its `usage`."""
    try:
        chunk = json.loads(event_data(event))
    except ValueError:
        return event
    if not isinstance(chunk, dict) or not isinstance(chunk.get("usage"), dict):
        return event
    if not chunk.get("choices"):
        return b""
    del chunk["usage"]
    ending = b"\r\n\r\n" if event.endswith(b"\r\n") else b"\n\n"
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + ending
