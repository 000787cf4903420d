"""The `cli` harness kind: an agent's command line (Claude Code, Codex, pi...) run in the sandbox.

Its `command` runs as the sandbox user with the gateway's URL and a per-trial token as its
base URL and key, so every model call it makes is seen and counted at the gateway.
"""

from __future__ import annotations

from pytest_hemra.execute.kinds import SandboxKind


class CliKind(SandboxKind):
    """`command` runs in the sandbox within the deadline; its model calls pass the gateway."""
