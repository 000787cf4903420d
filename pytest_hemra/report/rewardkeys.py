"""Reward keys beyond the headline: a reward.json of several metrics, reported key by key.

Every key a task's verifier wrote other than its headline (`core.reward.headline_key`) is an
extra column of its table: each harness's mean of it, with its own 95% interval, over the same
task set as the rest of the row. A scored trial without a key its task's other trials have
(a verifier_error, a tampered trial) counts 0 for it, as Harbor counts a missing key.

A task whose trials have several keys and none is the headline has no headline: its trials'
reward is their lowest key (a pass needs every key at the threshold), the table says so in a
flag naming the keys and the run-file key that picks one, and one table a key compares the
harnesses on that key alone, over those tasks (`key_trials`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pytest_hemra.core.outcome import Outcome
from pytest_hemra.core.records import TrialRecord
from pytest_hemra.core.reward import HEADLINE, has_no_headline, headline_key, is_pass
from pytest_hemra.core.words import plural
from pytest_hemra.report.fairness import Flag
from pytest_hemra.report.stats import Estimate, mean_ci

# the keys named as a task's headline (`StoredPlan.reward_keys` of its dataset)
Named = Callable[[str], tuple[str, ...]]


# each task's distinct key lists (the keys of a trial's rewards, in order) among its scored
# trials, first seen first: what `extra_keys` and `headline_less` read (`reward_shapes`)
Shapes = Mapping[str, Mapping[tuple[str, ...], None]]


def reward_shapes(trials: Iterable[TrialRecord]) -> dict[str, dict[tuple[str, ...], None]]:
    """Each task's scored trials' key lists, told apart once: a task's trials mostly write the
    same keys, and which is the headline depends on the keys alone, not their values."""
    scored = Outcome.SCORED  # read once: a member read off its enum class is slow
    pairs = {(t.task, tuple(t.rewards)): None for t in trials if t.outcome in scored}
    found: dict[str, dict[tuple[str, ...], None]] = defaultdict(dict)
    for task, keys in pairs:
        found[task][keys] = None
    return dict(found)


def extra_keys(trials: Iterable[TrialRecord], named: Named) -> dict[str, list[str]]:
    """Each task's keys that are no trial's headline (nor `reward`), in the order first seen."""
    return shape_extra_keys(reward_shapes(trials), named)


def shape_extra_keys(shapes: Shapes, named: Named) -> dict[str, list[str]]:
    """`extra_keys` from the trials' `reward_shapes`."""
    found = {}
    for task, lists in shapes.items():
        seen: dict[str, None] = {}
        headlines = set()
        for keys in lists:
            seen.update(dict.fromkeys(keys))
            key = headline_key(dict.fromkeys(keys, 0.0), named(task))
            if key is not None:
                headlines.add(key)
        extra = [k for k in seen if k != HEADLINE and k not in headlines]
        if extra:
            found[task] = extra
    return found


def key_estimates(
    trials: Iterable[TrialRecord], extras: Mapping[str, Sequence[str]]
) -> dict[str, Estimate | None]:
    """A row's mean of each extra key with its 95% interval, clustered by task (`mean_ci`),
    over its scored trials of the tasks that have the key (a missing key counts 0)."""
    by_key: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for trial in trials:
        if trial.outcome not in Outcome.SCORED:
            continue
        for key in extras.get(trial.task, ()):
            by_key[key][trial.task].append(trial.rewards.get(key, 0.0))
    names = sorted({key for keys in extras.values() for key in keys})
    return {key: mean_ci(by_key[key]) if by_key.get(key) else None for key in names}


def headline_less(trials: Iterable[TrialRecord], named: Named) -> dict[str, list[str]]:
    """The tasks with a trial of several keys and no headline, each with its keys (sorted)."""
    return shape_headline_less(reward_shapes(trials), named)


def shape_headline_less(shapes: Shapes, named: Named) -> dict[str, list[str]]:
    """`headline_less` from the trials' `reward_shapes`."""
    found: dict[str, set[str]] = defaultdict(set)
    for task, lists in shapes.items():
        for keys in lists:
            if has_no_headline(dict.fromkeys(keys, 0.0), named(task)):
                found[task].update(keys)
    return {task: sorted(keys) for task, keys in sorted(found.items())}


def key_trials(trials: Sequence[TrialRecord], tasks: Iterable[str], key: str) -> list[TrialRecord]:
    """The trials of `tasks` scored on `key` alone: its value is their reward (missing: 0), and
    a pass or fail is whether it reaches the pass threshold; other outcomes stay."""
    wanted = set(tasks)
    found = []
    scored = Outcome.SCORED  # read once: a member read off its enum class is slow
    for trial in [t for t in trials if t.task in wanted]:
        if trial.outcome not in scored:
            found.append(_changed(trial, rewards={}))
            continue
        value = trial.rewards.get(key, 0.0)
        outcome = trial.outcome
        if outcome in (Outcome.PASS, Outcome.FAIL):
            outcome = Outcome.PASS if is_pass(value) else Outcome.FAIL
        found.append(_changed(trial, reward=value, rewards={key: value}, outcome=outcome))
    return found


def _changed(trial: TrialRecord, **changes: Any) -> TrialRecord:
    """`dataclasses.replace` without the frozen __init__: a key's table copies every trial of
    its tasks, and replace's 34 fields set one by one were most of the table's time."""
    copied: TrialRecord = object.__new__(TrialRecord)
    copied.__dict__.update(trial.__dict__, **changes)
    return copied


def no_headline_flag(tasks: Mapping[str, Sequence[str]], run_key: str | None) -> Flag:
    """What the table says of its tasks without a headline: their keys, how their reward was
    made, where each key is compared, and the run-file key that picks one."""
    keys = sorted({key for names in tasks.values() for key in names})
    shown = "; ".join(f"{task}: {', '.join(names)}" for task, names in tasks.items())
    picked = (
        f" ([report] reward_key = {run_key!r} names none of them)" if run_key is not None else ""
    )
    return Flag(
        "no_headline",
        None,
        f"{plural(len(tasks), 'task')} wrote several reward keys and none is the headline"
        f" ({shown}){picked}: each trial's reward is its lowest key (a pass needs every key at"
        f" the threshold), and the tables {', '.join(f'key {k!r}' for k in keys)} compare each"
        f' key alone; to pick one, set [report] reward_key = "{keys[0]}" in the run file',
    )
