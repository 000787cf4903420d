"""A verifier's model, as judges get one (`[verifier] model_access = true`): never a provider's
key (the verifier runs code the agent left, so a key in its sandbox is the agent's too), but the
gateway's URL and a token of the trial's, `HEMRA_BASE_URL` and `HEMRA_API_KEY`, its calls
recorded under the role `verifier` in `verifier/calls/` and its totals in `verifier/usage.json`
(apart from the harness's own: the task's calls, not the agent's). The sandbox keeps only
HEMRA's gateway network, which has no route out; where it has none (a pool's engine) the
verifier runs without a model, and `verifier/model.txt` says so.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from pytest_hemra.execute.context import TrialContext
from pytest_hemra.execute.gateway.ledger import CallPolicy
from pytest_hemra.execute.gateway.scripted import TextStep
from pytest_hemra.execute.sandbox import Sandbox
from pytest_hemra.resolve.upstreams import SCRIPTED_MODEL

SCRIPTED_REPLY = "a scripted reply to the verifier"
SCRIPTED_CALLS = 64  # replies the scripted model gives a verifier before it runs out


@contextmanager
def verifier_model(
    context: TrialContext, sandbox: Sandbox, folder: Path, keys: dict[str, str], public: bool
) -> Iterator[dict[str, str]]:
    """The variables that give the verifier its model (none unless the run asks), for as long
    as it runs; `keys` are the real keys by provider, which stay in the gateway. A verifier
    that keeps the sandbox's network (`public`) reaches the gateway through it."""
    gateway = context.gateway
    if not context.spec.verifier.model_access or gateway is None:
        yield {}
        return
    if not public and not sandbox.only_gateway_network():
        (folder / "model.txt").write_text(
            "no model: this sandbox has no HEMRA gateway network (a pool's engine)\n"
        )
        yield {}
        return
    scripted = (context.spec.model or "").startswith(SCRIPTED_MODEL)
    access = gateway.open_trial(
        context.trial_id,
        context.run_id,
        keys=keys,
        script=(TextStep(SCRIPTED_REPLY),) * SCRIPTED_CALLS if scripted else None,
        policy=CallPolicy(model=context.spec.model),
        calls_dir=folder / "calls",
        role="verifier",
    )
    try:
        yield {
            "HEMRA_BASE_URL": access.base_url(context.gateway_host),
            "HEMRA_API_KEY": access.token,
            "HEMRA_MODEL": context.spec.model or "",
        }
    finally:
        usage = gateway.close_trial(access.token)
        (folder / "usage.json").write_text(json.dumps(asdict(usage), indent=1) + "\n")
