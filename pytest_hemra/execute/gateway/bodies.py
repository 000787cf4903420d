"""Bodies on the way through the gateway: a request read as JSON, an error answered in the
upstream's own format, and each call's bodies kept in the trial folder (capped)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from pytest_hemra.execute.gateway.wire import Wire

KEPT_BODY_BYTES = 4 * 1024 * 1024  # per body in the trial folder; longer ones are cut
# per trial: past this, a call's bodies are no longer kept (its row is), so a harness making
# call after call cannot fill the runner's disk through its trial folder
KEPT_TRIAL_BYTES = 256 * 1024 * 1024
OVER_CAP_NOTE = "over-cap.txt"


def keep_bodies(folder: Path, seq: int, request: bytes, response: bytearray | None) -> None:
    """`calls/0001.request.json` and `.response` in the trial folder: what the harness sent
    and got (bodies hold no keys: those travel in headers, which are not kept here)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{seq:04d}.request.json").write_bytes(request[:KEPT_BODY_BYTES])
    (folder / f"{seq:04d}.response").write_bytes(bytes(response or b""))


def note_over_cap(folder: Path, seq: int) -> None:
    """`calls/over-cap.txt`: from which call on the bodies were not kept."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / OVER_CAP_NOTE).write_text(
        f"bodies of call {seq} and later not kept: the trial's calls reached"
        f" {KEPT_TRIAL_BYTES} bytes of kept bodies\n"
    )


def json_object(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body) if body else {}
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


ANTHROPIC_KINDS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
}
OPENAI_KINDS = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_denied",
    404: "invalid_request_error",
    413: "invalid_request_error",
}


def error_response(wire: Wire, status: int, message: str) -> web.Response:
    """An error in the provider's own format, so harnesses handle it as they would upstream's."""
    if wire in (Wire.ANTHROPIC, Wire.COUNT_TOKENS):
        kind = ANTHROPIC_KINDS.get(status, "api_error")
        payload: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": message}}
    else:
        kind = OPENAI_KINDS.get(status, "server_error")
        payload = {"error": {"message": message, "type": kind, "code": None, "param": None}}
    return web.json_response(payload, status=status)


def error_format(wire: Wire, headers: Mapping[str, str]) -> Wire:
    """The wire whose error format answers a call: its own, or for a path that is no model
    endpoint, Anthropic's when the client speaks Anthropic (its SDKs send `anthropic-version`)."""
    if wire is not Wire.OTHER:
        return wire
    if "anthropic-version" in headers or "x-api-key" in headers:
        return Wire.ANTHROPIC
    return Wire.CHAT
