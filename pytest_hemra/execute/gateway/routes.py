"""A trial's route through the gateway: its token, keys, script, policy and running totals, and
the access it is handed (the token and a base URL per listening host)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from pytest_hemra.core.records import CallRow
from pytest_hemra.core.trial import TrialUsage
from pytest_hemra.execute.gateway.ledger import Budgets, CallPolicy, same_model
from pytest_hemra.execute.gateway.scripted import Script
from pytest_hemra.execute.gateway.wire import Wire


@dataclass
class TrialRoute:
    token: str
    trial_id: str
    run_id: str
    provider: str | None
    keys: dict[str, str]
    script: Script | None
    policy: CallPolicy = field(default_factory=CallPolicy)
    budget: Budgets | None = None
    is_open: bool = True
    inflight: int = 0
    totals: TrialUsage = field(default_factory=TrialUsage)
    calls_dir: Path | None = None  # where each call's request and response bodies are kept
    seq: int = 0
    kept_bytes: int = 0  # of bodies kept in calls_dir (at most KEPT_TRIAL_BYTES)
    rows: list[CallRow] = field(default_factory=list)
    role: str = "agent"  # or "judge:<name>": counted apart from the harness's calls

    def refusal(self, wire: Wire, requested: str | None) -> str | None:
        """Why the run's rules refuse a call of this trial, if they do; a cap it reached is
        noted in its totals. Caps count the calls whose usage was read."""
        policy, totals = self.policy, self.totals
        if wire is Wire.OTHER:
            return None
        if policy.max_tokens is not None and totals.total_tokens >= policy.max_tokens:
            self.totals = replace(totals, stopped_by="token cap")
            return f"the trial's token cap ({policy.max_tokens}) is reached"
        if policy.max_cost_usd is not None and (totals.cost or 0.0) >= policy.max_cost_usd:
            self.totals = replace(totals, stopped_by="cost cap")
            return f"the trial's cost cap (${policy.max_cost_usd:g}) is reached"
        if policy.refuse_other_models and policy.model and not same_model(requested, policy.model):
            return f"model {requested!r} is not this run's model {policy.model!r}"
        return None


@dataclass(frozen=True)
class TrialAccess:
    """What a trial is given: its token (also its API key) and base URLs per listening host."""

    token: str
    base_urls: dict[str, str]

    def base_url(self, host: str) -> str:
        return self.base_urls[host]
