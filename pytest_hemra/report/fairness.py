"""Fairness flags: everything that makes one dataset's comparison unfair, one line each.

Printed under each table (and exported with it). A flag never changes a number; it says why a
number should not be read at face value.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytest_hemra.core.network import NETWORK_FIX
from pytest_hemra.core.outcome import Outcome
from pytest_hemra.core.records import UPSTREAM_REFUSED, TrialRecord
from pytest_hemra.core.usage import Usage, disagrees


@dataclass(frozen=True)
class Flag:
    kind: str  # task_set, unfinished, other_models, self_report, unknown_price, stopped,
    #            too_few_tasks, timeouts, not_metered, not_isolated, upstream_refused,
    #            tampered, verifier_offline, agent_user_differs, agent_root, usage_unknown
    harness: str | None
    message: str

    def __str__(self) -> str:
        return f"! {self.harness}: {self.message}" if self.harness else f"! {self.message}"


def dataset_flags(
    trials: Sequence[TrialRecord],
    harnesses: Sequence[str],
    model: str | None,
    unmetered: frozenset[str] = frozenset(),
    unisolated: frozenset[str] = frozenset(),
) -> list[Flag]:
    """The flags a dataset's trials raise by themselves (statistics add `too_few_tasks`);
    `unmetered` names the harnesses whose tokens the gateway cannot count, `unisolated` those
    whose agents ran outside HEMRA's sandbox (`StoredPlan`)."""
    counted = [t for t in trials if t.status != "deselected"]
    by_harness: dict[str, list[TrialRecord]] = defaultdict(list)
    for trial in counted:
        by_harness[trial.harness].append(trial)
    every_task = {t.task for t in counted}
    flags: list[Flag] = []
    for harness in harnesses:
        mine = by_harness.get(harness, [])
        flags += _task_set(harness, mine, every_task)
        flags += _unfinished(harness, mine)
        flags += _other_models(harness, mine, model)
        if harness in unmetered:  # its own numbers have nothing at the wire to agree with
            message = "tokens not counted at the wire: a harbor harness (its agent calls the"
            message += " model directly, not through HEMRA's gateway)"
            flags.append(Flag("not_metered", harness, message))
        else:
            flags += _self_reports(harness, mine)
        if harness in unisolated:  # nothing HEMRA enforces held its agent
            message = "not isolated: its agent ran outside HEMRA's sandbox (Harbor's own"
            message += " containers, without HEMRA's hardening, clean room or limits; trusted"
            message += " by the run's trust_unisolated)"
            flags.append(Flag("not_isolated", harness, message))
        flags += _usage_unknown(harness, mine)
        if any(t.status == "finished" and not t.is_priced for t in mine):
            models = sorted({m for t in mine if not t.is_priced for m in t.models})
            flags.append(
                Flag(
                    "unknown_price",
                    harness,
                    f"cost unknown: no price for {', '.join(models) or 'a model it called'}",
                )
            )
        failed_judges: dict[str, int] = defaultdict(int)
        for trial in mine:
            for judge, score in trial.judges.items():
                failed_judges[judge] += score is None
        for judge, count in sorted(failed_judges.items()):
            if count:
                message = f"judge {judge} gave no score on {count} trial(s)"
                flags.append(Flag("judge_failed", harness, message))
        flags += _upstream_refused(harness, mine)
        stopped = [t for t in mine if t.stopped_by]
        if stopped:
            reasons = ", ".join(sorted({t.stopped_by or "" for t in stopped}))
            flags.append(Flag("stopped", harness, f"{len(stopped)} trial(s) stopped by {reasons}"))
        flags += _tampered(harness, mine)
        flags += _verifier_offline(harness, mine)
    return flags + _agent_users(counted)


def _agent_users(trials: Sequence[TrialRecord]) -> list[Flag]:
    """Who the agents ran as (`[sandbox] agent_user`, execute/identity.py): `agent_user_differs`
    when one task's agents ran as different users (one could install packages, another not),
    `agent_root` naming how many ran as root (the task's user or its image's, as Harbor)."""
    ran = [t for t in trials if t.agent_user]
    users: dict[str, dict[str, str]] = defaultdict(dict)  # task -> harness -> user
    for trial in ran:
        users[trial.task][trial.harness] = (trial.agent_user or "").split(" ")[0]
    flags = []
    differs = sorted(task for task, seen in users.items() if len(set(seen.values())) > 1)
    if differs:
        first = ", ".join(f"{h} as {u}" for h, u in sorted(users[differs[0]].items()))
        message = f"the agents ran as different users on {len(differs)} task(s) (e.g. {differs[0]}:"
        message += f" {first}): what one could do as its user another could not"
        flags.append(Flag("agent_user_differs", None, message))
    root = [t for t in ran if (t.agent_user or "").startswith("0:")]
    if root:
        message = f"agents ran as root in {len(root)} of {len(ran)} trial(s) (the task's user or"
        message += ' its image\'s, as Harbor runs them; [sandbox] agent_user = "non-root" runs'
        message += " every agent as uid 1000)"
        flags.append(Flag("agent_root", None, message))
    return flags


def _verifier_offline(harness: str, mine: list[TrialRecord]) -> list[Flag]:
    """Trials whose verifier failed with its network cut and printed a network error."""
    offline = [t for t in mine if t.error_class == "verifier_offline"]
    if not offline:
        return []
    tasks = sorted({t.task for t in offline})
    message = f"{len(offline)} trial(s) failed in a verifier that tried to reach the network with"
    message += f" it cut ({', '.join(tasks[:3])}{', ...' if len(tasks) > 3 else ''}): they may"
    message += f" have failed for lack of it; {NETWORK_FIX}"
    return [Flag("verifier_offline", harness, message)]


def _tampered(harness: str, mine: list[TrialRecord]) -> list[Flag]:
    """SWE trials whose agent changed what steers the hidden tests (docs/tracks.md)."""
    tampered = [t for t in mine if t.error_class == "tampered"]
    if not tampered:
        return []
    message = f"{len(tampered)} trial(s) tampered with what steers the hidden tests (conftest.py,"
    message += f" pytest settings, test files; run as shipped instead), e.g. {tampered[0].item_id}"
    return [Flag("tampered", harness, message)]


def _task_set(harness: str, mine: list[TrialRecord], every_task: set[str]) -> list[Flag]:
    scored_tasks = {t.task for t in mine if t.outcome in Outcome.SCORED}
    missing = sorted(every_task - scored_tasks)
    if not missing:
        return []
    shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
    return [
        Flag(
            "task_set",
            harness,
            f"no scored trial on {len(missing)} of {len(every_task)} tasks ({shown}):"
            " compared on the tasks both ran",
        )
    ]


def _unfinished(harness: str, mine: list[TrialRecord]) -> list[Flag]:
    unfinished: dict[str, int] = defaultdict(int)
    for trial in mine:
        if trial.outcome not in Outcome.SCORED:
            unfinished[trial.outcome or trial.status] += 1
    if not unfinished:
        return []
    counts = ", ".join(f"{count} {name}" for name, count in sorted(unfinished.items()))
    return [Flag("unfinished", harness, f"unfinished cells: {counts} (excluded from scores)")]


def _upstream_refused(harness: str, mine: list[TrialRecord]) -> list[Flag]:
    refused = [
        t
        for t in mine
        if t.outcome in Outcome.SCORED and (t.error or "").startswith(UPSTREAM_REFUSED)
    ]
    if not refused:
        return []
    message = f"{len(refused)} scored trial(s) had model calls the upstream refused (401/403:"
    message += f" the runner's key, not the harness), e.g. {refused[0].item_id}"
    return [Flag("upstream_refused", harness, message)]


def _other_models(harness: str, mine: list[TrialRecord], model: str | None) -> list[Flag]:
    if not model:
        return []
    other = sum(t.other_model_tokens for t in mine)
    total = sum(t.tokens for t in mine)
    if not other or not total:
        return []
    models = sorted({m for t in mine if t.other_model_tokens for m in t.models if m != model})
    return [
        Flag(
            "other_models",
            harness,
            f"{other / total:.0%} of its tokens went to other models than {model}"
            f" ({', '.join(models) or 'unnamed'})",
        )
    ]


def _usage_unknown(harness: str, mine: list[TrialRecord]) -> list[Flag]:
    """Calls the gateway could not read usage from (a stream cut or hung up on before its final
    count, an answer without usage): their tokens and cost are unknown, not 0."""
    unknown = sum(t.usage_unknown for t in mine)
    if not unknown:
        return []
    calls = sum(t.calls for t in mine)
    trials = sum(1 for t in mine if t.usage_unknown)
    message = f"usage unknown on {unknown} of {calls} model calls ({unknown / max(calls, 1):.1%},"
    message += f" in {trials} trial(s)): their tokens are not counted and its cost is unknown"
    return [Flag("usage_unknown", harness, message)]


def _self_reports(harness: str, mine: list[TrialRecord]) -> list[Flag]:
    """A trial with calls of unknown usage is left out: the gateway's count there is short; so
    is a harness's own estimate (its tokenizer's count, not the server's: aider while it
    streams)."""
    off = [
        t
        for t in mine
        if t.own_report is not None
        and not t.usage_unknown
        and not t.own_report.get("is_estimate")
        and disagrees(Usage.of(t.own_report).total_tokens, t.tokens)
    ]
    if not off:
        return []
    first = off[0]
    own = Usage.of(first.own_report or {}).total_tokens
    return [
        Flag(
            "self_report",
            harness,
            f"its own token counts disagree with the gateway's on {len(off)} trial(s)"
            f" (e.g. {first.item_id}: reports {own}, the gateway counted {first.tokens})",
        )
    ]


def calibration_flags(
    judges: Sequence[tuple[str, str | None]], calibrations: dict[str, dict[str, Any] | None]
) -> list[Flag]:
    """A model judge never calibrated against its model (`hemra calibrate`), or that drifted.

    `judges` are (name, model) pairs, model None for program judges; `calibrations` maps a
    judge's name to its latest calibration against that model, if any."""
    flags = []
    for name, model in judges:
        if model is None:
            continue
        found = calibrations.get(name)
        if found is None:
            flags.append(
                Flag(
                    "judge_uncalibrated",
                    None,
                    f"judge {name} was not calibrated against {model} (hemra calibrate)",
                )
            )
        elif not found["reliable"]:
            flags.append(
                Flag(
                    "judge_drift",
                    None,
                    f"judge {name} drifted against {model}: mean absolute error"
                    f" {found['mae']:.2f} > {found['threshold']:.2f} on {found['anchors']} anchors",
                )
            )
    return flags
