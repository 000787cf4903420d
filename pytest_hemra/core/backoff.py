"""How long a runner waits out an outage (its Docker engine not answering, its store's disk full
or locked) before giving up: waits that double, with jitter, under a total.

The bounds are the product's contract (docs/runs.md, "Faults"), each an environment variable
read when a runner starts (an xdist worker inherits them):

| variable                     | default | what                                                   |
|------------------------------|---------|--------------------------------------------------------|
| `HEMRA_BACKOFF_FIRST_SECS`   | 1       | the first wait before asking again                     |
| `HEMRA_BACKOFF_MAX_SECS`     | 30      | waits double up to this                                |
| `HEMRA_ENGINE_GIVE_UP_SECS`  | 300     | an engine not answering this long: its trials give up  |
| `HEMRA_STORE_GIVE_UP_SECS`   | 300     | the store unwritable this long: the session stops      |
| `HEMRA_ENGINE_SETTLE_SECS`   | 3       | how long a lost engine must answer on end to be back;  |
|                              |         | after it refused a trial, how long it must keep        |
|                              |         | answering for that to count as the trial's own fault   |
| `HEMRA_REMOVE_TIMEOUT_SECS`  | 120     | one request to remove a sandbox: its answer awaited    |
| `HEMRA_REMOVE_PATIENCE_SECS` | 600     | a removal slowed by the sandbox's content, in all      |
| `HEMRA_ENGINE_TIMEOUT_SECS`  | 120     | any other request to the engine: its answer awaited    |
| `HEMRA_START_SLOW_SECS`      | 10      | a sandbox start answered later slows the starts        |
|                              |         | in flight on its engine (`run/admission.py`)           |

Each wait is drawn between half and all of its bound (jitter), so runners that lost an engine at
the same moment do not all ask it again at the same moment.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from pytest_hemra.core.errors import SpecError

FIRST_SECS = ("HEMRA_BACKOFF_FIRST_SECS", 1.0)
MAX_SECS = ("HEMRA_BACKOFF_MAX_SECS", 30.0)
ENGINE_GIVE_UP_SECS = ("HEMRA_ENGINE_GIVE_UP_SECS", 300.0)
STORE_GIVE_UP_SECS = ("HEMRA_STORE_GIVE_UP_SECS", 300.0)
# A daemon shutting down answers for seconds (it stops its containers first) while it refuses
# to start new ones: an error then is its outage, seen as such once it stops answering.
SETTLE_SECS = ("HEMRA_ENGINE_SETTLE_SECS", 3.0)
SETTLE_POLL_SECS = 0.25
# Removing a sandbox: the engine's client gives up on one answer after its own timeout (120 s)
# unless this says less; a removal given up on while the engine still answers pings is slow for
# what the agent left in the sandbox (100k files): it is waited for up to the patience, as the
# trial's own time, never an outage.
REMOVE_TIMEOUT_SECS = ("HEMRA_REMOVE_TIMEOUT_SECS", 120.0)
REMOVE_PATIENCE_SECS = ("HEMRA_REMOVE_PATIENCE_SECS", 600.0)
ENGINE_TIMEOUT_SECS = ("HEMRA_ENGINE_TIMEOUT_SECS", 120.0)
START_SLOW_SECS = ("HEMRA_START_SLOW_SECS", 10.0)


@dataclass(frozen=True)
class Backoff:
    """Waits from `first_secs` doubling to `max_secs`, for at most `give_up_secs` in all."""

    first_secs: float = FIRST_SECS[1]
    max_secs: float = MAX_SECS[1]
    give_up_secs: float = ENGINE_GIVE_UP_SECS[1]

    def delays(self, rng: random.Random | None = None) -> Iterator[float]:
        """Endless: each wait drawn between half and all of a bound that doubles to the max."""
        draw = rng or random.Random()
        bound = min(self.first_secs, self.max_secs)
        while True:
            yield bound / 2 + draw.uniform(0, bound / 2)
            bound = min(bound * 2, self.max_secs)


def engine_backoff(environ: Mapping[str, str] | None = None) -> Backoff:
    """The waits for an engine that does not answer, as the environment sets them."""
    return _backoff(ENGINE_GIVE_UP_SECS, os.environ if environ is None else environ)


def engine_settle_secs(environ: Mapping[str, str] | None = None) -> float:
    """How long an engine must keep answering after refusing a trial (an error of its API) for
    the error to be the trial's own (`HEMRA_ENGINE_SETTLE_SECS`)."""
    return seconds(*SETTLE_SECS, os.environ if environ is None else environ)


def removal_secs(environ: Mapping[str, str] | None = None) -> tuple[float, float]:
    """How long one request to remove a sandbox waits for its answer, and how long a removal
    slowed by the sandbox's content is waited for in all (`HEMRA_REMOVE_TIMEOUT_SECS`,
    `HEMRA_REMOVE_PATIENCE_SECS`)."""
    environ = os.environ if environ is None else environ
    return seconds(*REMOVE_TIMEOUT_SECS, environ), seconds(*REMOVE_PATIENCE_SECS, environ)


def engine_timeout_secs(environ: Mapping[str, str] | None = None) -> float:
    """How long a request to the engine waits for its answer (`HEMRA_ENGINE_TIMEOUT_SECS`)."""
    return seconds(*ENGINE_TIMEOUT_SECS, os.environ if environ is None else environ)


def start_slow_secs(environ: Mapping[str, str] | None = None) -> float:
    """A sandbox start answered later than this slows its engine's starts
    (`HEMRA_START_SLOW_SECS`)."""
    return seconds(*START_SLOW_SECS, os.environ if environ is None else environ)


def store_backoff(environ: Mapping[str, str] | None = None) -> Backoff:
    """The waits for a store that cannot be written (disk full, locked), as the environment
    sets them."""
    return _backoff(STORE_GIVE_UP_SECS, os.environ if environ is None else environ)


def _backoff(give_up: tuple[str, float], environ: Mapping[str, str]) -> Backoff:
    first, ceiling = seconds(*FIRST_SECS, environ), seconds(*MAX_SECS, environ)
    if ceiling < first:
        raise SpecError(
            f"{MAX_SECS[0]}: expected at least {FIRST_SECS[0]} ({first:g}), got {ceiling:g}"
        )
    return Backoff(first, ceiling, seconds(*give_up, environ))


def seconds(name: str, default: float, environ: Mapping[str, str]) -> float:
    """A number of seconds > 0 from environment variable `name`, else `default`."""
    text = environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise SpecError(f"{name}: expected a number of seconds greater than 0, got {text!r}")
    return value
