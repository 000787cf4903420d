"""Rewards read from the verifier's `/logs/verifier/reward.txt` or `reward.json`.

reward.txt holds one number; reward.json a flat map of numbers whose `reward` is the score
(the other keys are kept). NaN, infinities, booleans and non-numbers are rejected.
"""

from __future__ import annotations

import json
import math

from pytest_hemra.core.errors import VerifierError
from pytest_hemra.core.outcome import Outcome

PASS_THRESHOLD = 1.0


def parse_reward(files: dict[str, bytes]) -> tuple[float, dict[str, float]]:
    """Return (score, every key) from the verifier's log folder, or raise VerifierError."""
    if "reward.json" in files:
        return _from_json(files["reward.json"])
    if "reward.txt" in files:
        text = files["reward.txt"].decode(errors="replace").strip()
        try:
            score = _finite(float(text), "reward.txt")
        except ValueError:
            raise VerifierError(f"reward.txt: expected a number, got {text!r}") from None
        return score, {"reward": score}
    raise VerifierError("verifier wrote no /logs/verifier/reward.txt or reward.json")


def _from_json(raw: bytes) -> tuple[float, dict[str, float]]:
    try:
        data = json.loads(raw, parse_constant=float)
    except ValueError as error:
        raise VerifierError(f"reward.json: not valid JSON ({error})") from None
    if not isinstance(data, dict):
        raise VerifierError("reward.json: expected a flat JSON object of numbers")
    rewards = {str(key): _number(value, f"reward.json key {key!r}") for key, value in data.items()}
    if "reward" not in rewards:
        raise VerifierError("reward.json: key 'reward' is missing (it holds the score)")
    return rewards["reward"], rewards


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
