"""Rewards read from the verifier's `/logs/verifier/reward.txt` or `reward.json`, and which of
them is the trial's headline.

reward.txt holds one number (the key `reward`); reward.json any flat object of numbers, as
Harbor records it. NaN, infinities, booleans and non-numbers are rejected.

The headline is the reward the tables, intervals, pass@k and comparisons use: the key `reward`
when there is one, else the first key named (the run file's `[report] reward_key`, then the
task's `[hemra] reward_key`) that is there, else the object's only key. Several keys and none
named: the trial has no headline, its reward is its lowest key (so it passes only when every key
reaches the pass threshold), and reports compare each key apart (docs/reports.md).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence

from pytest_hemra.core.errors import VerifierError
from pytest_hemra.core.outcome import Outcome

PASS_THRESHOLD = 1.0
HEADLINE = "reward"  # the key that is the headline wherever it is present


def parse_reward(
    files: dict[str, bytes], named: Sequence[str] = ()
) -> tuple[float, dict[str, float]]:
    """(the trial's reward, every key) from the verifier's log folder, or raise VerifierError;
    the reward is the headline's value under `named` (`trial_reward`)."""
    rewards = parse_rewards(files)
    return trial_reward(rewards, named), rewards


def parse_rewards(files: dict[str, bytes]) -> dict[str, float]:
    """Every reward key the verifier wrote (reward.json wins over reward.txt), or raise."""
    if "reward.json" in files:
        return _from_json(files["reward.json"])
    if "reward.txt" in files:
        text = files["reward.txt"].decode(errors="replace").strip()
        try:
            score = _finite(float(text), "reward.txt")
        except ValueError:
            raise VerifierError(f"reward.txt: expected a number, got {text!r}") from None
        return {HEADLINE: score}
    raise VerifierError("verifier wrote no /logs/verifier/reward.txt or reward.json")


def headline_key(rewards: Mapping[str, float], named: Sequence[str] = ()) -> str | None:
    """The key whose value is the trial's headline: `reward`, else the first of `named` that is
    present, else the only key; None for several keys and none of them named (or none at all)."""
    for key in (HEADLINE, *named):
        if key in rewards:
            return key
    return next(iter(rewards)) if len(rewards) == 1 else None


def trial_reward(rewards: Mapping[str, float], named: Sequence[str] = ()) -> float:
    """The headline's value; with no headline, the lowest key: a trial without a headline
    passes only when every key reaches the pass threshold."""
    key = headline_key(rewards, named)
    if key is not None:
        return rewards[key]
    if not rewards:
        raise VerifierError("the verifier gave no reward keys")
    return min(rewards.values())


def has_no_headline(rewards: Mapping[str, float], named: Sequence[str] = ()) -> bool:
    """Several keys and none of them the headline: reports compare each key apart."""
    return len(rewards) > 1 and headline_key(rewards, named) is None


def _from_json(raw: bytes) -> dict[str, float]:
    try:
        data = json.loads(raw, parse_constant=float)
    except ValueError as error:
        raise VerifierError(f"reward.json: not valid JSON ({error})") from None
    if not isinstance(data, dict):
        raise VerifierError("reward.json: expected a flat JSON object of numbers")
    if not data:
        raise VerifierError("reward.json: expected a flat JSON object of numbers, got {}")
    return {str(key): _number(value, f"reward.json key {key!r}") for key, value in data.items()}


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise VerifierError(f"{where}: expected a number, got {value!r}")
    return _finite(float(value), where)


def _finite(number: float, where: str) -> float:
    if not math.isfinite(number):
        raise VerifierError(f"{where}: expected a finite number, got {number!r}")
    return number


def is_pass(reward: float) -> bool:
    return reward >= PASS_THRESHOLD


def shown_reward(outcome: str | None, reward: float | None) -> str:
    """A trial's reward in words: `reward 0.5`, `no reward`, and for a verifier_error (scored 0
    though its verifier gave nothing) `no reward, scored 0`."""
    if outcome == Outcome.VERIFIER_ERROR:
        return "no reward, scored 0"
    return "no reward" if reward is None else f"reward {reward:g}"
