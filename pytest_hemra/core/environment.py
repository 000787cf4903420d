"""The runner's environment, read whole from any thread.

A process running trials on threads (`run/lanes.py`) shares its environment with pytest, which
sets and unsets `PYTEST_CURRENT_TEST` around every item's phases: a copy of `os.environ` taken
while another thread changes it fails midway (a key listed, then gone). `snapshot` copies it
whole, trying again until no change came in between.
"""

from __future__ import annotations

import os


def snapshot() -> dict[str, str]:
    """A copy of `os.environ`."""
    while True:
        try:
            return dict(os.environ)
        except (KeyError, RuntimeError):  # a key unset mid-copy; the mapping resized meanwhile
            continue
