"""Rewards with provenance: a reward file the task's own verifier did not write scores the trial
`tampered` (reward 0, flagged), never a pass.

Harbor reads `/logs/verifier/reward.json` first, then `reward.txt`. A verifier that runs a program
the agent left (as most do, as root) lets that program write a `reward.json` the verifier never
writes, while test.sh writes its `reward.txt` 0 later. Three checks close that, each on what
HEMRA reads itself, outside the sandbox:

- before test.sh starts, `/logs/verifier` holds no reward file (`refuse_planted`): the room was
  emptied and the folder made new as root, so one there now was planted;
- after it, every reward file there is of a kind the task's verifier writes (`declared_kinds`:
  the names its tests/ files and its `[verifier] env` spell out; both kinds when they name
  neither), and when both are there, they agree (`check_rewards`).

Honest tasks keep Harbor's precedence: these checks only refuse, they never pick another file.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path

from pytest_hemra.core.errors import HemraError, Tampered
from pytest_hemra.core.reward import HEADLINE, parse_rewards

VERIFIER_LOGS = "/logs/verifier"
REWARD_KINDS = ("reward.json", "reward.txt")  # the files Harbor reads a reward from, in order
MAX_SCANNED_BYTES = 16 << 20  # of each tests/ file, for the names it spells out


def declared_kinds(tests: Sequence[Path], env: Iterable[str] = ()) -> frozenset[str]:
    """The reward files the task's verifier writes: those of REWARD_KINDS its tests/ folders'
    files (test.sh and whatever it calls) or its `[verifier] env` values name. A task that names
    neither (a name built at run time) is taken to write either."""
    named = set(_named_in_folders(tuple(str(folder) for folder in tests)))
    named |= {kind for kind in REWARD_KINDS for value in env if kind in value}
    return frozenset(named) if named else frozenset(REWARD_KINDS)


@lru_cache(maxsize=256)
def _named_in_folders(folders: tuple[str, ...]) -> frozenset[str]:
    """REWARD_KINDS named in the folders' regular files (a task's files do not change during
    a run: read once per process)."""
    named: set[str] = set()
    for folder in folders:
        for path in sorted(Path(folder).rglob("*")):
            if path.is_symlink() or not path.is_file():
                continue
            with path.open("rb") as handle:
                text = handle.read(MAX_SCANNED_BYTES)
            named |= {kind for kind in REWARD_KINDS if kind.encode() in text}
            if len(named) == len(REWARD_KINDS):
                return frozenset(named)
    return frozenset(named)


def refuse_planted(files: Mapping[str, bytes]) -> None:
    """Raise Tampered when /logs/verifier holds a reward file before test.sh has started."""
    found = [kind for kind in REWARD_KINDS if kind in files]
    if found:
        raise Tampered(
            f"a reward file was in {VERIFIER_LOGS} before the verifier started",
            tuple(f"{VERIFIER_LOGS}/{kind}: present before test.sh started" for kind in found),
        )


def check_rewards(files: Mapping[str, bytes], kinds: frozenset[str]) -> None:
    """Raise Tampered when /logs/verifier, as test.sh left it, holds a reward file the task's
    verifier does not write (`kinds`), or a reward.json and reward.txt that disagree. A
    reward.json without a `reward` key (several metrics) is not compared."""
    evidence = [
        f"{VERIFIER_LOGS}/{kind}: the task's verifier writes only"
        f" {' and '.join(sorted(kinds))} (named in its tests/)"
        for kind in REWARD_KINDS
        if kind in files and kind not in kinds
    ]
    if not evidence and all(kind in files for kind in REWARD_KINDS):
        disagreement = _disagreement(files)
        if disagreement is not None:
            evidence.append(disagreement)
    if evidence:
        raise Tampered("a reward file the task's verifier did not write", tuple(evidence))


def _disagreement(files: Mapping[str, bytes]) -> str | None:
    """Why reward.json and reward.txt disagree, or None when they agree (or cannot be
    compared: a reward.json without a `reward` key)."""
    json_reward = _reward_of(files, "reward.json")
    if json_reward is None:
        return None
    text_reward = _reward_of(files, "reward.txt")
    if text_reward is not None and math.isclose(json_reward, text_reward, abs_tol=1e-9):
        return None
    shown = "no number" if text_reward is None else f"{text_reward:g}"
    return f"{VERIFIER_LOGS}/reward.json: gives reward {json_reward:g}, reward.txt {shown}"


def _reward_of(files: Mapping[str, bytes], kind: str) -> float | None:
    try:
        return parse_rewards({kind: files[kind]}).get(HEADLINE)
    except HemraError:
        return None
