"""Headers on the way through the gateway: what is never forwarded, how a trial presents its
token, how the real key is put in for the upstream, and what is stored (keys redacted)."""

from __future__ import annotations

from collections.abc import Mapping

from pytest_hemra.resolve.upstreams import ModelApi

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
KEY_HEADERS = frozenset({"authorization", "x-api-key", "api-key", "cookie"})
DROPPED_RESPONSE = frozenset({*HOP_BY_HOP, "content-encoding"})


def presented_key(headers: Mapping[str, str]) -> str | None:
    if "x-api-key" in headers:
        return headers["x-api-key"]
    authorization = headers.get("Authorization", "")
    if authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    return None


def upstream_headers(
    headers: Mapping[str, str], provider: ModelApi, key: str | None
) -> dict[str, str]:
    forwarded = {
        name: value
        for name, value in headers.items()
        if name.lower() not in HOP_BY_HOP
        and name.lower() not in KEY_HEADERS
        and not name.lower().startswith("x-hemra")
        and name.lower() != "accept-encoding"
    }
    forwarded["Accept-Encoding"] = "identity"  # usage is read from the bytes as they pass
    if key:
        if provider.auth == "x-api-key":
            forwarded["x-api-key"] = key
        else:
            forwarded["Authorization"] = f"Bearer {key}"
    return forwarded


def redacted_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Request headers as stored: keys, tokens and cookies never leave memory."""
    return {
        name.lower(): "[redacted]" if name.lower() in KEY_HEADERS else value
        for name, value in headers.items()
    }
