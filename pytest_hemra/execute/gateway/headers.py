"""Headers on the way through the gateway: what is never forwarded, how a trial presents its
token, how the real key is put in for the upstream, and what is stored (secrets redacted).

Names are judged by pattern, not by a list of known headers: any request header whose name
holds auth, key, token, secret or cookie may carry a credential, so it never goes upstream (the
only key the upstream sees is the one the gateway puts in); those and session headers are stored
as `[redacted]`.
"""

from __future__ import annotations

import re
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
CREDENTIAL_NAME = re.compile(r"auth|key|token|secret|cookie", re.IGNORECASE)
SECRET_NAME = re.compile(r"auth|key|token|secret|cookie|session", re.IGNORECASE)
# which organization or project of the runner's account pays is the runner's choice, not the agent's
ACCOUNT_HEADERS = frozenset({"openai-organization", "openai-project"})
REDACTED = "[redacted]"
# `Content-Encoding` passes only with the bytes it describes (`relay`)
DROPPED_RESPONSE = frozenset({*HOP_BY_HOP, "content-encoding"})


def presented_key(headers: Mapping[str, str]) -> str | None:
    if "x-api-key" in headers:
        return headers["x-api-key"]
    authorization = headers.get("Authorization", "")
    if authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    return None


def upstream_headers(
    headers: Mapping[str, str], provider: ModelApi, key: str | None, token: str
) -> dict[str, str]:
    """The request's headers as the upstream gets them: no credential but the real `key`, and
    nothing that carries the trial's `token` (session ids pass: providers cache prompts by them)."""
    forwarded = {
        name: value
        for name, value in headers.items()
        if name.lower() not in HOP_BY_HOP
        and name.lower() not in ACCOUNT_HEADERS
        and not CREDENTIAL_NAME.search(name)
        and token not in value
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


def redacted_headers(headers: Mapping[str, str], token: str = "") -> dict[str, str]:
    """Request headers as stored: keys, tokens, cookies and session ids never leave memory, nor
    does any value that carries the trial's `token`."""
    return {
        name.lower(): REDACTED if SECRET_NAME.search(name) or (token and token in value) else value
        for name, value in headers.items()
    }
