"""One oracle trial through HEMRA against the floor: the same work by plain docker SDK calls.

The floor creates the same container (same image, user, limits, network), copies the solution
in, runs solve.sh, copies the tests in, runs test.sh, reads the reward and removes the
container with force. HEMRA's trial does that plus what makes it a trial: the instruction file
(in one archive with the solution), the before/after snapshot of /app for the diff (the one
before kept per image: `execute/sandbox/snapshot.py`), the clean room's sweep, the agent's logs,
the verifier's network cut, the trial folder, result.json and the store writes. Rounds alternate
so all see the same machine; a third series drops the kept snapshot before each trial (the first
trial of an image in a run).

    python benchmarks/oracle_trial.py [--rounds 10] [--task create-file]
"""

from __future__ import annotations

import argparse
import io
import statistics
import tarfile
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from pytest_hemra.core.records import PlannedTrial
from pytest_hemra.execute.context import TrialContext
from pytest_hemra.execute.sandbox import AGENT_USER, ROOT_USER, WORKDIR
from pytest_hemra.execute.sandbox.docker import DockerProvider
from pytest_hemra.execute.sandbox.snapshot import SNAPSHOTS
from pytest_hemra.resolve.datasets import bundled_dir, load_task
from pytest_hemra.resolve.harness_spec import HarnessSpec
from pytest_hemra.resolve.harnesses import Harness
from pytest_hemra.resolve.spec import RunSpec
from pytest_hemra.run.trial import run_trial
from pytest_hemra.store import Store


def tar_of(folder: Path, name: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.add(folder, arcname=name)
    return buffer.getvalue()


def floor_trial(provider: DockerProvider, image: str, task_dir: Path) -> float:
    started = time.perf_counter()
    client = provider.client
    container = client.containers.run(
        image,
        entrypoint=["sleep", "infinity"],
        command=[],
        user=AGENT_USER,
        working_dir=WORKDIR,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        pids_limit=1024,
        network_mode="bridge",
        detach=True,
        labels={"hemra": "1"},
    )
    try:
        container.put_archive("/", tar_of(task_dir / "solution", "solution"))
        container.exec_run(["bash", "/solution/solve.sh"], user=AGENT_USER, workdir=WORKDIR)
        container.put_archive("/", tar_of(task_dir / "tests", "tests"))
        container.exec_run(["bash", "/tests/test.sh"], user=ROOT_USER, workdir=WORKDIR)
        chunks, _ = container.get_archive("/logs/verifier/reward.txt")
        b"".join(chunks)
    finally:
        container.remove(force=True)
    return time.perf_counter() - started


def hemra_trial(
    provider: DockerProvider, store: Store, run_id: str, seq: int, context: TrialContext
) -> float:
    started = time.perf_counter()
    trial_id = f"{run_id}.{seq:05d}"
    store.claim(trial_id, "bench", 600)
    result = run_trial(context)
    store.finish_trial(trial_id, result)
    assert result.outcome == "pass", result
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--task", default="create-file")
    parser.add_argument(
        "--agent-user",
        default="task",
        choices=("task", "non-root"),
        help="task: the image's user (root here: its sandbox is emptied whole and started"
        " again); non-root: uid 1000, as the floor (its processes killed as its user)",
    )
    args = parser.parse_args()

    task = load_task(bundled_dir("datasets") / "hemra-offline" / args.task)
    provider = DockerProvider()
    spec = RunSpec(harnesses=["oracle"], datasets=["hemra-offline"])
    spec = spec.model_copy(
        update={"sandbox": spec.sandbox.model_copy(update={"agent_user": args.agent_user})}
    )
    oracle = Harness(
        "oracle",
        Path("oracle.toml"),
        HarnessSpec(kind="program", command=["bash", "/solution/solve.sh"], uses_solution=True),
    )
    image = provider.prepare(task, spec.sandbox.image)  # cached image, as the target says
    with tempfile.TemporaryDirectory() as scratch:
        store = Store(Path(scratch) / "bench.db")
        run_id = "bench"
        store.record_plan(
            run_id,
            "bench",
            {},
            Path(scratch),
            [
                PlannedTrial("hemra-offline", task.name, "oracle", n + 1)
                for n in range(2 * (args.rounds + 1))
            ],
        )
        floors, hemras, firsts = [], [], []
        floor_trial(provider, image, task.path)  # warm both paths once
        for seq in range(args.rounds + 1):
            context = TrialContext(
                run_id,
                f"{run_id}.{seq:05d}",
                task,
                oracle,
                spec,
                provider,
                Path(scratch) / f"trial-{seq}",
            )
            hemras.append(hemra_trial(provider, store, run_id, seq, context))
            floors.append(floor_trial(provider, image, task.path))
            SNAPSHOTS.clear()
            later = seq + args.rounds + 1
            context = replace(
                context, trial_id=f"{run_id}.{later:05d}", trial_dir=Path(scratch) / f"t-{later}"
            )
            firsts.append(hemra_trial(provider, store, run_id, later, context))
        floors, hemras, firsts = floors[1:], hemras[1:], firsts[1:]

    floor, hemra, first = (statistics.median(series) for series in (floors, hemras, firsts))
    print(
        f"task hemra-offline/{task.name}, {args.rounds} rounds, cached image, agent user"
        f" {args.agent_user}"
    )
    print(f"floor (plain docker SDK)      median {floor * 1000:7.1f} ms")
    print(f"hemra oracle trial            median {hemra * 1000:7.1f} ms")
    print(f"  first of its image in a run median {first * 1000:7.1f} ms")
    print(f"ratio hemra / floor           {hemra / floor:.2f}x  (target <= 1.5x)")
    print(f"  first of its image          {first / floor:.2f}x")


if __name__ == "__main__":
    main()
