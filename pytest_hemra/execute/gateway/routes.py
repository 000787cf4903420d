"""A trial's route through the gateway: its token, keys, script, policy and running totals, and
the access it is handed (the token and a base URL per listening host)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pytest_hemra.core.records import CallRow
from pytest_hemra.execute.gateway.ledger import CallPolicy, RunBudget, TrialUsage
from pytest_hemra.execute.gateway.scripted import Script


@dataclass
class TrialRoute:
    token: str
    trial_id: str
    run_id: str
    provider: str | None
    keys: dict[str, str]
    script: Script | None
    policy: CallPolicy = field(default_factory=CallPolicy)
    budget: RunBudget | None = None
    is_open: bool = True
    inflight: int = 0
    totals: TrialUsage = field(default_factory=TrialUsage)
    calls_dir: Path | None = None  # where each call's request and response bodies are kept
    seq: int = 0
    rows: list[CallRow] = field(default_factory=list)
    role: str = "agent"  # or "judge:<name>": counted apart from the harness's calls


@dataclass(frozen=True)
class TrialAccess:
    """What a trial is given: its token (also its API key) and base URLs per listening host."""

    token: str
    base_urls: dict[str, str]

    def base_url(self, host: str) -> str:
        return self.base_urls[host]
