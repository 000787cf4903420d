"""`hemra clean`: what HEMRA left on the engine that no live trial owns is listed (`--dry-run`)
and removed; a live trial's sandbox and another store's are left alone."""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import BASE_IMAGE, TaskMaker
from pytest_hemra.cli import main
from pytest_hemra.core.records import PlannedTrial
from pytest_hemra.store import Store
from pytest_hemra.store.owner import owner_name

pytestmark = pytest.mark.usefixtures("docker_test")


@contextlib.contextmanager
def leftovers(client: Any, run_id: str, trials: list[str]) -> Iterator[dict[str, Any]]:
    """A sleeping container labelled as each trial's sandbox, a run network no sandbox is on,
    and a firewall chain of a bridge that does not exist; all removed at the end, whatever
    `hemra clean` did."""
    made: dict[str, Any] = {}
    chain = f"HEMRA-br-{uuid.uuid4().hex[:12]}"
    try:
        for trial in trials:
            labels = {"hemra": "1", "hemra.run": run_id, "hemra.trial": trial}
            made[trial] = client.containers.run(
                BASE_IMAGE, ["sleep", "infinity"], detach=True, labels=labels, network_mode="none"
            )
        network_run = f"clean-{uuid.uuid4().hex[:8]}"
        made["network"] = client.networks.create(
            f"hemra-{network_run}", labels={"hemra": "1", "hemra.run": network_run}
        )
        subprocess.run(["iptables", "-w", "10", "-N", chain], check=True)
        made["chain"] = chain
        yield made
    finally:
        for trial in trials:
            if trial in made:
                with contextlib.suppress(Exception):
                    made[trial].remove(force=True)
        if "network" in made:
            with contextlib.suppress(Exception):
                made["network"].remove()
        subprocess.run(["iptables", "-w", "10", "-X", chain], check=False, capture_output=True)


def exists(client: Any, container: Any) -> bool:
    return bool(client.containers.list(all=True, filters={"id": container.id}))


def has_network(client: Any, name: str) -> bool:
    return any(network.name == name for network in client.networks.list(names=[name]))


def listed_why(listed: str, name: str) -> str:
    """Why a dry run said it would remove `name`."""
    return next(line for line in listed.splitlines() if f" {name}: " in line).split(": ", 1)[1]


def has_chain(chain: str) -> bool:
    listed = subprocess.run(["iptables", "-S"], capture_output=True, text=True, check=True)
    return f"-N {chain}" in listed.stdout.splitlines()


def test_clean_lists_then_removes_only_what_no_live_trial_owns(
    tmp_path: Path, docker_client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    store_path = tmp_path / "s.db"
    run_id = f"clean-{uuid.uuid4().hex[:8]}"
    with Store(store_path) as store:
        plan = [PlannedTrial("ds", f"task-{n}", "oracle", 1) for n in range(2)]
        store.record_plan(run_id, "run", {}, tmp_path, plan)
        over, live = (f"{run_id}.{n:05d}" for n in range(2))
        assert store.claim(live, owner_name(), 600).is_leased  # this process runs it
    unknown = f"other-{uuid.uuid4().hex[:8]}.00000"  # another store's trial
    with leftovers(docker_client, run_id, [over, live, unknown]) as made:
        network, chain = made["network"].name, made["chain"]
        assert main(["clean", "--dry-run", "--store", str(store_path)]) in (0, 1)
        listed = capsys.readouterr().out
        assert f"would remove container {made[over].name}: trial {over} is over" in listed
        # another runner's start on this engine (a test beside this one) reaps run networks
        # no sandbox is on and chains of gone bridges too: each is listed, or gone by then
        assert f"would remove network {network}: no sandbox of run" in listed or not has_network(
            docker_client, network
        )
        assert f"would remove firewall chain {chain}: bridge" in listed or not has_chain(chain)
        assert made[live].name not in listed and made[unknown].name not in listed
        assert exists(docker_client, made[over])  # a dry run removes nothing
        code = main(["clean", "--store", str(store_path)])
        done = capsys.readouterr().out
        assert code == (1 if "could not remove" in done else 0), done
        assert f"removed container {made[over].name}: trial {over} is over" in done
        assert not exists(docker_client, made[over])
        assert exists(docker_client, made[live]) and exists(docker_client, made[unknown])
        # gone: removed by this clean (said so above), or meanwhile by another runner's start
        assert not has_network(docker_client, network)
        assert not has_chain(chain)
        for kind, name in (("network", network), ("firewall chain", chain)):
            said = [line for line in done.splitlines() if name in line]
            assert not said or said == [f"removed {kind} {name}: {listed_why(listed, name)}"]


def test_a_run_network_the_engine_keeps_is_named_with_what_to_do_until_it_is_gone(
    tmp_path: Path, docker_client: Any, make_task: TaskMaker
) -> None:
    """A run's network no sandbox of the run is on, which HEMRA cannot remove (a container not
    HEMRA's sits on it): each runner's start tries again, and `hemra runs` and the viewer name
    it with what to do; once freed, the next run's start removes it and the warning is gone."""
    make_task("one")
    (tmp_path / "run.toml").write_text('harnesses = ["oracle"]\ndatasets = ["ds"]\n')
    old_run = f"kept-{uuid.uuid4().hex[:8]}"
    network = docker_client.networks.create(
        f"hemra-{old_run}", labels={"hemra": "1", "hemra.run": old_run}
    )
    squatter = docker_client.containers.run(
        BASE_IMAGE, ["sleep", "infinity"], detach=True, network=network.name
    )

    def run_and_list() -> list[str]:
        """A run, then `hemra runs`' lines about this test's network (the engine may keep
        another's too: a run network stuck by a Docker fault under load, named as well)."""
        for argv in (["run", "run.toml"], ["runs", "--wide"]):
            done = subprocess.run(
                ["hemra", *argv, "--store", "s.db"], cwd=tmp_path, capture_output=True, text=True
            )
            assert done.returncode == 0, done.stdout + done.stderr
        return [line for line in done.stdout.splitlines() if network.name in line]

    try:
        (said,) = run_and_list()
        assert said.startswith(
            f"! the engine kept network {network.name}: containers not HEMRA's sit on it"
            f" ({squatter.name}); disconnect them (`docker network disconnect {network.name}"
        ), said
        assert said.endswith("then `hemra clean`")
        with Store(tmp_path / "s.db") as store:
            kept = store.engine_kept()
        assert kept[f"network {network.name}"] == said.split(f"{network.name}: ", 1)[1]
        squatter.remove(force=True)  # what the warning says to do
        assert run_and_list() == []
        assert not docker_client.networks.list(names=[network.name])  # the next start's reap
    finally:
        with contextlib.suppress(Exception):
            squatter.remove(force=True)
        with contextlib.suppress(Exception):
            network.remove()


def test_a_firewall_chain_iptables_keeps_is_named_with_what_to_do_until_it_is_gone(
    tmp_path: Path, make_task: TaskMaker, capsys: pytest.CaptureFixture[str]
) -> None:
    """A chain of a bridge that is gone, which iptables refuses to delete (a rule HEMRA did not
    make jumps to it): each runner's start tries again, `hemra runs` names it with what to do,
    `hemra clean` says it could not remove it (exit 1); once the rule is gone, the next run's
    start removes the chain and the warning is gone."""
    make_task("one")
    (tmp_path / "run.toml").write_text('harnesses = ["oracle"]\ndatasets = ["ds"]\n')
    tag = uuid.uuid4().hex[:12]
    chain, theirs = f"HEMRA-br-{tag}", f"KEEPS-{tag}"
    jump = [theirs, "-j", chain]

    def run_and_list() -> list[str]:
        for argv in (["run", "run.toml"], ["runs", "--wide"]):
            done = subprocess.run(
                ["hemra", *argv, "--store", "s.db"], cwd=tmp_path, capture_output=True, text=True
            )
            assert done.returncode == 0, done.stdout + done.stderr
        return [line for line in done.stdout.splitlines() if chain in line]

    def iptables(*args: str) -> None:
        subprocess.run(["iptables", "-w", "10", *args], check=True, capture_output=True)

    try:
        iptables("-N", chain)
        iptables("-N", theirs)
        iptables("-A", *jump)
        (said,) = run_and_list()
        assert said == (
            f"! the engine kept firewall chain {chain}: iptables refuses to delete it: a rule"
            f" HEMRA did not make still jumps to it (`iptables -S | grep -- '-j {chain}'`"
            " shows it); delete that rule, then `hemra clean`"
        )
        assert main(["clean", "--store", str(tmp_path / "s.db")]) == 1
        assert f"could not remove firewall chain {chain}: iptables refuses" in (
            capsys.readouterr().out
        )
        iptables("-D", *jump)  # what the warning says to do
        assert run_and_list() == []
        assert not has_chain(chain)  # the next start's reap
    finally:
        for args in (["-D", *jump], ["-X", theirs], ["-X", chain]):
            subprocess.run(["iptables", "-w", "10", *args], check=False, capture_output=True)
