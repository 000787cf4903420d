"""Wire formats the gateway understands, and the token usage it reads from each."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from pytest_hemra.core.usage import Usage
from pytest_hemra.resolve.upstreams import SCRIPTED, SCRIPTED_MODEL


class Wire(StrEnum):
    ANTHROPIC = "anthropic-messages"  # POST /v1/messages
    COUNT_TOKENS = "anthropic-count-tokens"  # POST /v1/messages/count_tokens (not billed)
    RESPONSES = "openai-responses"  # POST /v1/responses
    CHAT = "openai-chat"  # POST /v1/chat/completions
    OTHER = "other"  # forwarded and recorded without usage


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
