"""HEMRA's cache on the host: `$HEMRA_CACHE_DIR`, else `~/.cache/hemra` of the account.

Harness installs (`harnesses/`), Harbor's runner image context (`harbor/`), git repositories
(`git/`) and the datasets fetched from a registry (`datasets/`) live under it.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path


def user_home() -> Path:
    """The account's home, even where HOME was changed (pytester, tox): one cache a user."""
    return Path(pwd.getpwuid(os.getuid()).pw_dir)


def cache_root() -> Path:
    configured = os.environ.get("HEMRA_CACHE_DIR")
    return Path(configured) if configured else user_home() / ".cache" / "hemra"
