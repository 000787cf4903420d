"""What a program prints when it needs a network it does not have: name lookups and connections
that fail because the sandbox's network was cut (glibc and bash, curl, apt, Python, Node).

"Connection refused" is left out on purpose: with the network cut, an outside address is
unreachable, never refused; a refusal is a local server that is not running, which no network
setting fixes.
"""

from __future__ import annotations

NETWORK_ERRORS = (
    "Temporary failure in name resolution",
    "Temporary failure resolving",
    "Could not resolve host",
    "Name or service not known",
    "No address associated with hostname",
    "Network is unreachable",
    "getaddrinfo failed",
    "getaddrinfo EAI_AGAIN",
    "getaddrinfo ENOTFOUND",
)
OUTPUT_TAIL_BYTES = 64 << 10  # the end of each output file that is searched
NETWORK_FIX = (
    'let it reach the network: `network_mode = "public"` in the task\'s [verifier] table'
    ' (task.toml), or `[verifier] network = "bridge"` in a run file'
)


def network_error(output: str) -> str | None:
    """The first of `NETWORK_ERRORS` the output holds (case aside), as listed."""
    lowered = output.lower()
    return next((e for e in NETWORK_ERRORS if e.lower() in lowered), None)
