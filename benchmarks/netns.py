"""What a sandbox's network costs the engine, in Docker alone (no HEMRA): N trial-shaped
containers at once, three ways, against N containers sleeping 10 s on Docker's default bridge
(created, started, waited for, removed), measured in the same run:

- **on a network of its own making**: each container created on a user-defined bridge network
  (as HEMRA's run network and `hemra-gateway` are), PID 1 a keeper, its "agent" an exec that
  sleeps 10 s, its network cut, a "verifier" exec, then removed: a HEMRA trial's engine
  requests, without HEMRA;
- **on the default bridge**: the same on Docker's `bridge` (no embedded DNS; no isolation
  between sandboxes either, so not an option for HEMRA as it is);
- **in a held network namespace**: the same, each container joining the network namespace of
  a long-lived holder container on the user-defined network (`network_mode=container:...`,
  one holder a trial at once, made before the clock starts), the holder cut and joined again
  around the "verifier".

Docker 20.10 sets up the embedded DNS resolver of a container on a user-defined network
(iptables rules inside its namespace) at each start; a held namespace pays it once. Prints
each time and its ratio to Docker alone.

The held namespaces here are made before the clock starts. Made by the run itself, each of the
first N trials at once pays two starts (its holder's, then its own): built into HEMRA and
measured at 64 trials at once, 40.7-46.0 s against 25-29 s without (docs/runs.md), so holders
could only pay across waves of trials, or if kept from run to run on the engine.

    python benchmarks/netns.py [--trials 64] [--sleep 10] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import docker
import docker.errors

BASE_IMAGE = "debian:bookworm-slim"
LABELS = {"hemra-bench": "1"}
KEEPER = ["perl", "-e", '$0 = "keeper"; $SIG{CHLD} = sub {}; for (;;) { sleep 1 if wait() == -1 }']


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--sleep", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    client = docker.from_env(timeout=300, max_pool_size=args.trials + 8)
    # a name of its own each run: Docker 20.10 sometimes keeps a removed container's endpoint on
    # a network it then will not remove, and a second network of the same name makes starts
    # on either fail ("network ... is ambiguous")
    name = f"hemra-bench-netns-{os.getpid()}"
    network = client.networks.create(name, driver="bridge", labels=LABELS)
    sleep = ["sleep", f"{args.sleep:g}"]
    try:
        holders = [  # one network namespace a trial at once, made before the clock starts
            _started(client, ["sleep", "infinity"], network=network.id) for _ in range(args.trials)
        ]

        def alone(_: int) -> None:
            container = client.containers.create(BASE_IMAGE, sleep, labels=LABELS)
            container.start()
            container.wait()
            container.remove(force=True)

        def trial(container: Any, cut: Callable[[], None]) -> None:
            container.reload()  # HEMRA reads it once (its storage, its PID 1)
            assert container.exec_run(sleep).exit_code == 0
            cut()
            assert container.exec_run(["sh", "-c", "echo 1 > /tmp/reward"]).exit_code == 0
            container.remove(force=True)

        def own_network(_: int) -> None:
            container = _started(client, None, network=network.id, entrypoint=KEEPER)
            trial(container, lambda: network.disconnect(container, force=True))

        def default_bridge(_: int) -> None:
            container = _started(client, None, entrypoint=KEEPER)
            trial(container, lambda: client.networks.get("bridge").disconnect(container))

        def held(index: int) -> None:
            holder = holders[index]
            mode = f"container:{holder.id}"
            container = _started(client, None, network_mode=mode, entrypoint=KEEPER)
            trial(container, lambda: network.disconnect(holder, force=True))
            network.connect(holder)  # for its next trial

        ways = {
            "docker alone, sleeping": alone,
            "on a network of its own making": own_network,
            "on the default bridge": default_bridge,
            "in a held network namespace": held,
        }
        print(f"{args.trials} at once, {args.sleep:g} s each, Docker {client.version()['Version']}")
        for round_ in range(args.rounds):
            times = {name: _timed(way, args.trials) for name, way in ways.items()}
            base = times["docker alone, sleeping"]
            for name, seconds in times.items():
                print(f"  round {round_ + 1}: {name:32s} {seconds:6.1f} s  {seconds / base:.2f}x")
    finally:
        for container in client.containers.list(all=True, filters={"label": "hemra-bench=1"}):
            container.remove(force=True)
        for _ in range(20):  # the engine may hold a removed container's endpoint a moment
            try:
                network.remove()
                break
            except docker.errors.APIError:
                time.sleep(0.5)


def _started(client: docker.DockerClient, command: list[str] | None, **options: Any) -> Any:
    container = client.containers.create(BASE_IMAGE, command, labels=LABELS, **options)
    container.start()
    return container


def _timed(way: Callable[[int], None], trials: int) -> float:
    started = time.monotonic()
    with ThreadPoolExecutor(trials) as pool:
        list(pool.map(way, range(trials)))
    return time.monotonic() - started


if __name__ == "__main__":
    main()
