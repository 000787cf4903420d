"""The forms of run and trial ids, and what to say when one is malformed or not in a store.

A run id is the time the run was recorded and six random hex digits (`20261201-123646-b60d93`);
a trial id is its run's id and the trial's number in the run (`20261201-123646-b60d93.00003`),
as the JUnit `trial` property, `hemra show` and the viewer give it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

RUN_ID_PATTERN = re.compile(r"\d{8}-\d{6}-[0-9a-f]{6}")
TRIAL_ID_PATTERN = re.compile(r"(?P<run>[^.]+)\.(?P<seq>\d{5,})")
RUN_ID_FORM = "YYYYMMDD-HHMMSS-xxxxxx, e.g. 20261201-123646-b60d93, as `hemra runs` lists them"
TRIAL_ID_FORM = (
    "RUN_ID.NNNNN, the run's id and the trial's number in it, e.g. 20261201-123646-b60d93.00003;"
    " the JUnit 'trial' property and the viewer give it"
)
LISTED_RUNS = 5


def is_run_id(text: str) -> bool:
    return RUN_ID_PATTERN.fullmatch(text) is not None


def malformed_run_id(text: str) -> str:
    return f"{text!r} is not a run id (expected {RUN_ID_FORM})"


def malformed_trial_id(text: str) -> str:
    return f"{text!r} is not a trial id (expected {TRIAL_ID_FORM})"


def unknown_run(run_id: str, where: str, known: Sequence[str]) -> str:
    """No run `run_id` in the store `where` describes; `known` its runs, oldest first."""
    if not is_run_id(run_id):
        return malformed_run_id(run_id) + f"; looked in {where}"
    if not known:
        return f"no run {run_id!r} in {where}: it holds no runs"
    latest = ", ".join(known[-LISTED_RUNS:])
    more = f" (`hemra runs` lists all {len(known)})" if len(known) > LISTED_RUNS else ""
    return f"no run {run_id!r} in {where}; its latest runs: {latest}{more}"


def unknown_trial(trial_id: str, run_id: str, trials: int) -> str:
    """Run `run_id` holds `trials` trials (numbered from 0), none numbered as `trial_id`."""
    span = f"{run_id}.00000 to {run_id}.{trials - 1:05d}" if trials else "none"
    return f"no trial {trial_id!r} in run {run_id} (its trials: {span})"
