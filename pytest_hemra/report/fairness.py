"""Fairness flags: everything that makes one dataset's comparison unfair, one line each.

Printed under each table (and exported with it). A flag never changes a number; it says why a
number should not be read at face value.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytest_hemra.core.lifecycle import TrialStatus
from pytest_hemra.core.network import NETWORK_FIX
from pytest_hemra.core.outcome import Cause, Outcome, SweClass
from pytest_hemra.core.records import UPSTREAM_REFUSED, TrialRecord
from pytest_hemra.core.text import printable
from pytest_hemra.core.usage import Usage, disagrees
from pytest_hemra.core.words import plural
from pytest_hemra.report.taskset import TaskSet, one_task_set

# kinds said of a dataset's every trial, whichever table (one per model in a matrix) shows them
WHOLE_DATASET = frozenset({"agent_user_differs", "agent_root", "no_headline", "processes_kept"})


@dataclass(frozen=True)
class Flag:
    kind: str  # task_set, unfinished, other_models, self_report, unknown_price, stopped,
    #            too_few_tasks, timeouts, not_metered, not_isolated, upstream_refused,
    #            tampered, verifier_offline, agent_user_differs, agent_root, usage_unknown,
    #            verifier_error, no_headline, processes_kept
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
    task_set: TaskSet | None = None,
) -> list[Flag]:
    """The flags a dataset's trials raise by themselves (statistics add `too_few_tasks`);
    `harnesses` are the table's rows, the baseline first; `unmetered` names the harnesses whose
    tokens the gateway cannot count, `unisolated` those whose agents ran outside HEMRA's sandbox
    (`StoredPlan`); `task_set`: the table's, found from these trials already (`one_task_set`).
    What several rows share (a cancel leaves every row short) is one line."""
    # read once: a member read off its enum class is slow, and these look at every trial
    deselected = TrialStatus.DESELECTED
    unscored = frozenset({Outcome.TAMPERED, Outcome.VERIFIER_ERROR})
    counted = [t for t in trials if t.status != deselected]
    by_harness: dict[str, list[TrialRecord]] = defaultdict(list)
    for trial in counted:
        by_harness[trial.harness].append(trial)
    found = task_set or one_task_set(by_harness, harnesses, 1)
    flags = _unfinished(harnesses, by_harness) + _task_set(found)
    for harness in harnesses:
        mine = by_harness.get(harness, [])
        # the trials the rarer flags below look for, found in one pass: each reads these alone
        marked = [
            t
            for t in mine
            if t.own_report is not None
            or t.judges
            or t.error
            or t.stopped_by
            or t.swe_class
            or t.cause
            or t.outcome in unscored
        ]
        flags += _other_models(harness, mine, model)
        if harness in unmetered:  # its own numbers have nothing at the wire to agree with
            message = "tokens not counted at the wire: a harbor harness (its agent calls the"
            message += " model directly, not through HEMRA's gateway)"
            flags.append(Flag("not_metered", harness, message))
        else:
            flags += _self_reports(harness, marked)
        if harness in unisolated:  # nothing HEMRA enforces held its agent
            message = "not isolated: its agent ran outside HEMRA's sandbox (Harbor's own"
            message += " containers, without HEMRA's hardening, clean room or limits; trusted"
            message += " by the run's trust_unisolated)"
            flags.append(Flag("not_isolated", harness, message))
        flags += _usage_unknown(harness, mine)
        failed_judges: dict[str, int] = defaultdict(int)
        for trial in [t for t in marked if t.judges]:
            for judge, score in trial.judges.items():
                failed_judges[judge] += score is None
        for judge, count in sorted(failed_judges.items()):
            if count:
                message = f"judge {judge} gave no score on {plural(count, 'trial')}"
                flags.append(Flag("judge_failed", harness, message))
        flags += _upstream_refused(harness, marked)
        stopped = [t for t in marked if t.stopped_by]
        if stopped:
            reasons = ", ".join(sorted({t.stopped_by or "" for t in stopped}))
            message = f"{plural(len(stopped), 'trial')} stopped by {reasons}"
            flags.append(Flag("stopped", harness, message))
        flags += _tampered(harness, marked)
        flags += _unscoreable(harness, marked)
        flags += _verifier_offline(harness, marked)
    return flags + _unpriced(harnesses, by_harness) + _agent_users(counted) + _kept(counted)


def _unpriced(harnesses: Sequence[str], by_harness: dict[str, list[TrialRecord]]) -> list[Flag]:
    """A model without a price, by name, one line each: the cost of every row that called it
    is unknown (never 0). A model is unpriced when a trial that called it has a call without a
    price and no trial whose calls were all priced called it."""
    done = TrialStatus.FINISHED  # read once: a member read off its enum class is slow
    unpriced = [
        t for h in harnesses for t in by_harness.get(h, []) if not t.is_priced and t.status == done
    ]
    if not unpriced:
        return []
    trials = [t for h in harnesses for t in by_harness.get(h, [])]
    priced = {m for t in trials if t.is_priced and t.calls for m in t.models}
    callers: dict[str, list[str]] = defaultdict(list)  # model -> the rows that called it
    for trial in unpriced:
        for model in [m for m in trial.models if m not in priced] or ["(unnamed)"]:
            if trial.harness not in callers[model]:
                callers[model].append(trial.harness)
    flags = []
    for model, rows in sorted(callers.items()):
        name = printable(model)
        message = f"model {name} has no price: its cost is unknown, and so is the cost of"
        message += f' {", ".join(rows)} (a run file\'s [prices."{name}"] sets one)'
        flags.append(Flag("unknown_price", None, message))
    return flags


def _kept(trials: Sequence[TrialRecord]) -> list[Flag]:
    """Trials verified with the agent's processes running (`[hemra] keep_agent_processes`):
    the clean room's first guarantee does not hold for them."""
    kept = [t for t in trials if t.kept_processes]
    if not kept:
        return []
    tasks = sorted({t.task for t in kept})
    message = f"{plural(len(kept), 'trial')} verified with the agent's processes running"
    message += f" ({', '.join(tasks[:3])}{', ...' if len(tasks) > 3 else ''}: keep_agent_processes)"
    message += ": what the agent left running could act while its tests ran (docs/security.md)"
    return [Flag("processes_kept", None, message)]


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
        message = f"the agents ran as different users on {plural(len(differs), 'task')} (e.g."
        message += f" {differs[0]}: {first}): what one could do as its user another could not"
        flags.append(Flag("agent_user_differs", None, message))
    root = [t for t in ran if (t.agent_user or "").startswith("0:")]
    if root:
        message = f"agents ran as root in {len(root)} of {plural(len(ran), 'trial')} (the task's"
        message += ' user or its image\'s, as Harbor runs them; [sandbox] agent_user = "non-root"'
        message += " runs every agent as uid 1000)"
        flags.append(Flag("agent_root", None, message))
    return flags


def _verifier_offline(harness: str, mine: list[TrialRecord]) -> list[Flag]:
    """Trials whose verifier failed with its network cut and printed a network error."""
    cause = Cause.VERIFIER_OFFLINE  # read once: a member read off its enum class is slow
    offline = [t for t in mine if t.cause == cause]
    if not offline:
        return []
    tasks = sorted({t.task for t in offline})
    message = f"{plural(len(offline), 'trial')} failed in a verifier that tried to reach the"
    message += f" network with it cut ({', '.join(tasks[:3])}{', ...' if len(tasks) > 3 else ''}):"
    message += f" they may have failed for lack of it; {NETWORK_FIX}"
    return [Flag("verifier_offline", harness, message)]


def _tampered(harness: str, mine: list[TrialRecord]) -> list[Flag]:
    """Trials whose agent changed what scores them: a reward its verifier did not write, a
    tool or library the verifier runs, what steers the hidden tests (docs/security.md)."""
    outcome, swe_class = Outcome.TAMPERED, SweClass.TAMPERED  # read once: slow off the class
    tampered = [t for t in mine if t.outcome == outcome or t.swe_class == swe_class]
    if not tampered:
        return []
    message = f"{plural(len(tampered), 'trial')} tampered with what scores them (a reward the"
    message += " verifier did not write, a tool it runs, the hidden tests' settings), scored 0;"
    message += f" e.g. {tampered[0].item_id} (hemra show lists what and why)"
    return [Flag("tampered", harness, message)]


def _unscoreable(harness: str, mine: list[TrialRecord]) -> list[Flag]:
    """Trials scored 0 because the verifier gave no reward from the sandbox the agent left (a
    verifier past its timeout, a reward missing or unreadable): the agent's result, labelled."""
    outcome = Outcome.VERIFIER_ERROR  # read once: a member read off its enum class is slow
    found = [t for t in mine if t.outcome == outcome]
    if not found:
        return []
    message = f"{plural(len(found), 'trial')} scored 0 with no reward from the verifier"
    message += " (verifier_error: its timeout, a reward missing or unreadable), e.g."
    message += f" {found[0].item_id}"
    return [Flag("verifier_error", harness, message)]


def _task_set(found: TaskSet) -> list[Flag]:
    """Tasks left out of every row's numbers (`taskset.py`): some row has a trial on them
    without a score (an infra_error past its retries, a cancel, a trial not yet run). One line
    for the table: which tasks, why, and how many the numbers are over."""
    if not found.left_out:
        return []
    alike: dict[tuple[str, ...], list[str]] = defaultdict(list)  # why -> its tasks
    for task, why in sorted(found.left_out.items()):
        alike[why].append(task)
    shown = [f"{_shown(tasks)}: {', '.join(why)}" for why, tasks in alike.items()]
    more = f"; and {len(shown) - 3} more" if len(shown) > 3 else ""
    total = plural(found.tasks, "task")
    message = f"{len(found.left_out)} of {total} left out of every harness's numbers"
    message += f" ({'; '.join(shown[:3])}{more}"
    covered = len(found.counted)
    if not covered:
        message += "): nothing to compare"
    else:
        message += f"): every number is over the same {plural(covered, 'task')}"
    return [Flag("task_set", None, message)]


def _shown(names: Sequence[str], most: int = 5) -> str:
    """The first names, and how many more."""
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def _unfinished(harnesses: Sequence[str], by_harness: dict[str, list[TrialRecord]]) -> list[Flag]:
    """The trials without a score, one line for every row: how many, why, and whose."""
    found: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))  # why -> row -> n
    scored = Outcome.SCORED  # read once: a member read off its enum class is slow
    for harness in harnesses:
        for trial in [t for t in by_harness.get(harness, []) if t.outcome not in scored]:
            found[trial.outcome or trial.status][harness] += 1
    if not found:
        return []
    rows = [h for h in harnesses if any(h in per for per in found.values())]
    total = plural(sum(n for per in found.values() for n in per.values()), "trial")

    def whose(per: dict[str, int]) -> str:
        return "" if len(rows) == 1 else f" ({', '.join(f'{h} {per[h]}' for h in per)})"

    if len(found) == 1:
        ((why, per),) = found.items()
        message = f"{total} {why}{whose(per)}, excluded from scores"
    else:
        each = ", ".join(
            f"{sum(per.values())} {why}{whose(per)}" for why, per in sorted(found.items())
        )
        message = f"{total} unfinished, excluded from scores: {each}"
    return [Flag("unfinished", rows[0] if len(rows) == 1 else None, message)]


def _upstream_refused(harness: str, mine: list[TrialRecord]) -> list[Flag]:
    scored = Outcome.SCORED  # read once: a member read off its enum class is slow
    refused = [
        t for t in mine if t.error and t.error.startswith(UPSTREAM_REFUSED) and t.outcome in scored
    ]
    if not refused:
        return []
    message = f"{plural(len(refused), 'scored trial')} had model calls the upstream refused"
    message += f" (401/403: the runner's key, not the harness), e.g. {refused[0].item_id}"
    return [Flag("upstream_refused", harness, message)]


def _other_models(harness: str, mine: list[TrialRecord], model: str | None) -> list[Flag]:
    if not model:
        return []
    other = sum([t.other_model_tokens for t in mine])
    total = sum([t.tokens for t in mine])
    if not other or not total:
        return []
    models = sorted(
        {printable(m) for t in mine if t.other_model_tokens for m in t.models if m != model}
    )  # names the agent asked for: shown on one line each, never obeyed
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
    unknown = sum([t.usage_unknown for t in mine])
    if not unknown:
        return []
    calls = sum(t.calls for t in mine)
    trials = sum(1 for t in mine if t.usage_unknown)
    message = f"usage unknown on {unknown} of {plural(calls, 'model call')}"
    message += f" ({unknown / max(calls, 1):.1%}, in {plural(trials, 'trial')}): their tokens are"
    message += " not counted and its cost is unknown"
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
            f"its own token counts disagree with the gateway's on {plural(len(off), 'trial')}"
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
