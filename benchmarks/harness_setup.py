"""Per-trial setup overhead of the installed CLI harnesses, against the oracle floor.

For each harness, trials of one hemra-offline task run through HEMRA (sandbox, gateway,
scripted model, verifier, store). Overhead = trial wall time - the harness's own run time
(the agent phase) - the floor (the same container made, the oracle's solve and test scripts
run, and removed, by plain docker SDK calls; see oracle_trial.py), measured in the same run.
Installs are cached: the first trial of each harness only warms the cache. Target: under 1 s.

    python benchmarks/harness_setup.py [--rounds 5] [--task create-file]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from oracle_trial import floor_trial

from pytest_hemra.core.records import PlannedTrial
from pytest_hemra.execute.context import TrialContext
from pytest_hemra.execute.gateway.server import Gateway
from pytest_hemra.execute.installs import ensure_installed
from pytest_hemra.execute.sandbox.docker import DockerProvider
from pytest_hemra.resolve.datasets import bundled_dir, load_task
from pytest_hemra.resolve.harnesses import resolve_harness
from pytest_hemra.resolve.spec import RunSpec
from pytest_hemra.resolve.upstreams import BUILTIN_UPSTREAMS
from pytest_hemra.run.trial import run_trial
from pytest_hemra.store import Store

HARNESSES = ("claude-code", "codex", "pi")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--task", default="create-file")
    args = parser.parse_args()
    task = load_task(bundled_dir("datasets") / "hemra-offline" / args.task)
    provider = DockerProvider()
    spec = RunSpec(harnesses=list(HARNESSES), datasets=["hemra-offline"], model="hemra/scripted")
    image = provider.prepare(task, spec.sandbox.image)
    harnesses = [resolve_harness(name, Path.cwd(), "benchmark", spec.model) for name in HARNESSES]
    for harness in harnesses:
        ensure_installed(harness)
    host = provider.gateway_host() or "127.0.0.1"
    with tempfile.TemporaryDirectory() as scratch:
        store = Store(Path(scratch) / "bench.db")
        plan = [
            PlannedTrial("hemra-offline", task.name, h.name, n)
            for h in harnesses
            for n in range(args.rounds + 1)
        ]
        store.record_plan("bench", "bench", {}, Path(scratch), plan)
        floors: list[float] = []
        overheads: dict[str, list[float]] = {h.name: [] for h in harnesses}
        agents: dict[str, list[float]] = {h.name: [] for h in harnesses}
        with Gateway(BUILTIN_UPSTREAMS, store.record_call, ["127.0.0.1", host]) as gateway:
            seq = 0
            for round_ in range(args.rounds + 1):
                floor = floor_trial(provider, image, task.path)
                for harness in harnesses:
                    trial_id = f"bench.{seq:05d}"
                    seq += 1
                    context = TrialContext(
                        "bench",
                        trial_id,
                        task,
                        harness,
                        spec,
                        provider,
                        Path(scratch) / trial_id,
                        gateway,
                        host,
                    )
                    result = run_trial(context)
                    store.finish_trial(trial_id, result)
                    assert result.outcome == "pass", result
                    if round_:  # round 0 warms caches
                        agent = result.phases["agent"]
                        agents[harness.name].append(agent)
                        overheads[harness.name].append(result.duration - agent - floor)
                if round_:
                    floors.append(floor)
    print(f"task hemra-offline/{task.name}, {args.rounds} rounds, cached images and installs")
    print(f"floor (plain docker SDK, oracle scripts)   median {statistics.median(floors):.3f} s")
    for name in HARNESSES:
        print(
            f"{name:12} agent median {statistics.median(agents[name]):.3f} s   setup overhead "
            f"median {statistics.median(overheads[name]):+.3f} s (target < 1 s)"
        )


if __name__ == "__main__":
    main()
