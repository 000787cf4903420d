"""One model call as the gateway records it: what it knows while the call is in flight, and the
row it becomes."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pytest_hemra.core.records import CallRow
from pytest_hemra.execute.gateway.prices import cost_of
from pytest_hemra.execute.gateway.usage import BILLED_WIRES
from pytest_hemra.execute.gateway.wire import CallUsage, Wire

CLIENT_GONE = "client hung up mid-response"  # how such a call's error starts
UPSTREAM_FAILED = "upstream failed mid-response"
STREAM_ERROR = "upstream error event"  # an error the upstream sent inside a 200 stream
PARTIAL = "usage partial"  # what a stream that ended early had counted, in the row's error


@dataclass
class Call:
    started: float = field(default_factory=time.perf_counter)
    at: float = field(default_factory=time.time)
    ttfb: float | None = None
    response_bytes: int = 0  # as the upstream sent them
    status: int = 0  # what the client was answered
    upstream_status: int | None = None  # what the upstream answered, if it did
    is_sent: bool = False  # the request reached an upstream, which may bill for it
    error: str | None = None
    error_text: bytes = b""
    kept: bytearray | None = None  # the response body, kept for the trial folder (capped)
    stream_error: str | None = None  # an error event's text, from a stream answered 200
    partial: CallUsage | None = None  # the counts a stream gave before it ended unfinished

    def is_usage_unknown(self, wire: Wire, usage: CallUsage | None) -> bool:
        """A billed call an upstream took and did not refuse, whose usage could not be read
        (a cut stream, a client that hung up, an answer without usage): unknown, not zero.
        Refused, unreachable and error-answered calls are known to cost nothing."""
        answered = self.upstream_status is None or self.upstream_status < 400
        return usage is None and wire in BILLED_WIRES and self.is_sent and answered


def call_row(
    call: Call,
    *,
    usage: CallUsage | None,
    wire: Wire,
    run_id: str | None,
    trial_id: str | None,
    provider: str | None,
    method: str,
    path: str,
    requested: str | None,
    request_bytes: int,
    refused: bool,
    error: str | None,
    headers: dict[str, str],
    role: str,
) -> CallRow:
    """The row of a finished call: tokens and cost NULL when its usage is unknown, a cost of
    None when its model has no price. A stream that ended before its final count stays unknown;
    what it had counted (Anthropic's `message_start`: input and cache) is kept in the row's
    error, flagged `usage partial`, with an error event's text."""
    is_usage_known = not call.is_usage_unknown(wire, usage)
    counted = usage or CallUsage(model=call.partial.model if call.partial else None)
    notes = [text for text in (error or call.error,) if text]
    if call.stream_error:
        notes.append(f"{STREAM_ERROR}: {call.stream_error}")
    if not is_usage_known and call.partial is not None:
        counts = " ".join(
            f"{name}={getattr(call.partial, name)}"
            for name in ("input_tokens", "cache_read_tokens", "cache_write_tokens")
        )
        ended = "the stream ended before its final count"
        notes.append(f"{PARTIAL} ({ended}): {counts}, output unknown")
    cost = cost_of(counted).usd if counted.total_tokens else 0.0
    return CallRow(
        run_id=run_id,
        trial_id=trial_id,
        at=call.at,
        provider=provider,
        wire=wire.value,
        method=method,
        path=path,
        model_requested=requested,
        model=counted.model,
        status=call.status,
        **counted.tokens.counts(),
        cost=cost if is_usage_known else None,
        latency=time.perf_counter() - call.started,
        ttfb=call.ttfb,
        request_bytes=request_bytes,
        response_bytes=call.response_bytes,
        error="; ".join(notes) or None,
        refused=refused,
        headers=headers,
        role=role,
        is_usage_known=is_usage_known,
    )
