"""Wire formats the gateway understands, the calls it forwards at all (its allowlist), and the
token usage it reads from each."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from pytest_hemra.core.usage import Usage
from pytest_hemra.resolve.upstreams import SCRIPTED, SCRIPTED_MODEL


class Wire(StrEnum):
    ANTHROPIC = "anthropic-messages"  # POST /v1/messages
    COUNT_TOKENS = "anthropic-count-tokens"  # POST /v1/messages/count_tokens (not billed)
    RESPONSES = "openai-responses"  # POST /v1/responses
    CHAT = "openai-chat"  # POST /v1/chat/completions
    OTHER = "other"  # model listing (forwarded, recorded without usage), or a refused path


def wire_of(path: str) -> Wire:
    """The wire format of a request path as a harness sends it (`v1/messages`, `/v1/...`)."""
    clean = "/" + path.split("?", 1)[0].strip("/")
    if clean.endswith("/v1/messages/count_tokens") or clean == "/messages/count_tokens":
        return Wire.COUNT_TOKENS
    if clean.endswith("/v1/messages") or clean == "/messages":
        return Wire.ANTHROPIC
    if clean.endswith("/v1/responses") or clean == "/responses":
        return Wire.RESPONSES
    if clean.endswith("/v1/chat/completions") or clean == "/chat/completions":
        return Wire.CHAT
    return Wire.OTHER


# Every call the gateway forwards, as a harness sends it under its base URL (with or without
# `/v1`): the model endpoints, token counting and model listing. Anything else (files, batches,
# fine-tuning, admin...) is refused: the runner's key is for model calls only. A model id is
# one path segment of plain characters, never `.` or `..` (a URL would fold those into a
# different path on its way upstream).
_V1 = r"(?:/v1)?"
_MODEL_ID = r"(?!\.\.?$)[A-Za-z0-9._:@+-]{1,200}"
ALLOWED_CALLS: tuple[tuple[str, re.Pattern[str], Wire], ...] = (
    ("POST", re.compile(_V1 + r"/messages"), Wire.ANTHROPIC),
    ("POST", re.compile(_V1 + r"/messages/count_tokens"), Wire.COUNT_TOKENS),
    ("POST", re.compile(_V1 + r"/responses"), Wire.RESPONSES),
    ("POST", re.compile(_V1 + r"/chat/completions"), Wire.CHAT),
    ("GET", re.compile(_V1 + r"/models"), Wire.OTHER),
    ("GET", re.compile(_V1 + r"/models/" + _MODEL_ID), Wire.OTHER),
)


def allowed_wire(method: str, path: str) -> Wire | None:
    """The wire format of a call the gateway forwards, or None: refused, never forwarded.
    `path` is the decoded path after the trial's base URL, without its query."""
    clean = "/" + path.strip("/")
    for allowed_method, pattern, wire in ALLOWED_CALLS:
        if method == allowed_method and pattern.fullmatch(clean):
            return wire
    return None


@dataclass(frozen=True)
class CallUsage(Usage):
    """Tokens of one call, normalized across providers (`core.usage`), and the model that
    answered it."""

    model: str | None = None


def route_call(wire: Wire, model: str | None, trial_provider: str | None) -> str:
    """Where a call goes: the scripted model by name, else the trial's provider, else by wire."""
    if model and model.startswith(SCRIPTED_MODEL):
        return SCRIPTED
    if trial_provider:
        return trial_provider
    return "anthropic" if wire in (Wire.ANTHROPIC, Wire.COUNT_TOKENS) else "openai"
