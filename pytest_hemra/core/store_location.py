"""Where the store is: one rule for `pytest --hemra-run` and every `hemra` command.

`--store PATH|URL` (`--hemra-store` under pytest) when given, else the `HEMRA_STORE` environment
variable, else `.hemra/hemra.db` in the current folder. A run writes there and every command
reads there, so what a run recorded is found from the folder it was started in, whichever folder
its run file is in.

A store is a SQLite file (one machine; trial folders go beside it, `.hemra/runs/RUN_ID/...`) or
a PostgreSQL database named by a `postgresql://` URL (a store several machines share; trial
folders go where the run file's `trials_dir` says). Its address (the absolute path, or the URL)
is what a process hands another to open the same store; `describe()` never shows a password.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

STORE_VARIABLE = "HEMRA_STORE"
TRIALS_DIR_VARIABLE = "HEMRA_TRIALS_DIR"  # where trial folders go, when a run file names none
SERVER_SCHEMES = ("postgresql", "postgres")
SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


@dataclass(frozen=True)
class StoreLocation:
    """A store's address (a SQLite file's absolute path, or a `postgresql://` URL) and what
    named it: an option (`--store`), `HEMRA_STORE`, or the default."""

    address: str
    named_by: str

    @property
    def is_default(self) -> bool:
        return self.named_by == "default"

    @property
    def is_server(self) -> bool:
        """Whether the store is a database server's (PostgreSQL), not a file."""
        return is_server_address(self.address)

    @property
    def path(self) -> Path | None:
        """The SQLite file; None for a server's store."""
        return None if self.is_server else Path(self.address)

    def exists(self) -> bool:
        """Whether there is a store to read: the file is there (a server's store is asked when
        opened)."""
        return self.is_server or Path(self.address).is_file()

    def describe(self) -> str:
        """The address (a password hidden) and why it is the one: for messages that say where
        HEMRA looked."""
        if self.is_default:
            return (
                f"{redacted(self.address)} (the default store: .hemra/hemra.db in the current"
                f" folder; --store PATH or {STORE_VARIABLE} names another)"
            )
        return f"{redacted(self.address)} (from {self.named_by})"


def store_location(option: str | None, flag: str = "--store") -> StoreLocation:
    """The store an option names, else `$HEMRA_STORE`'s, else the current folder's. A URL that
    cannot name a store (an unknown scheme, a bad port) is refused here, in one line."""
    if option:
        return StoreLocation(store_address(option, flag), flag)
    named = os.environ.get(STORE_VARIABLE, "")
    if named:
        return StoreLocation(store_address(named, STORE_VARIABLE), STORE_VARIABLE)
    from pytest_hemra.core.records import DEFAULT_STORE  # the options module reads this one's
    # help texts: what it imports at the top stays light (tests/test_plugins.py)

    return StoreLocation(str(Path.cwd() / DEFAULT_STORE), "default")


def store_address(text: str, named_by: str = "--store") -> str:
    """A store's address as every process opens it: a file's absolute path, or the URL checked
    (`postgresql://[user[:password]@][host][:port][/database][?param=value...]`)."""
    from pytest_hemra.core.errors import StoreError

    scheme = SCHEME.match(text)
    if scheme is None:
        return str(Path(text).absolute())
    name = scheme.group(1).lower()
    shown = redacted(text)
    if name not in SERVER_SCHEMES:
        raise StoreError(
            f"{named_by}: {shown}: unknown store scheme {name!r} (expected a file path or"
            " postgresql://USER@HOST:PORT/DATABASE)"
        )
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 (parsing it is the check)
    except ValueError as error:
        raise StoreError(f"{named_by}: {shown}: malformed PostgreSQL URL ({error})") from None
    if parts.fragment:
        raise StoreError(f"{named_by}: {shown}: malformed PostgreSQL URL (a '#' fragment)")
    return text


def is_server_address(address: str) -> bool:
    scheme = SCHEME.match(address)
    return scheme is not None and scheme.group(1).lower() in SERVER_SCHEMES


def redacted(address: str) -> str:
    """An address fit to print, whatever its scheme or typo: a `scheme://user:password@` form's
    password (everything up to its last `@`, when it does not parse) and any `password=`
    parameter as `***`; the user name is kept."""
    head, sep, rest = address.partition("://")
    text = address
    if sep and "@" in rest:
        userinfo, _, host = rest.rpartition("@")
        name, colon, _ = userinfo.partition(":")
        if colon or "/" in userinfo or "?" in userinfo:
            text = f"{head}://{name if colon and '/' not in name else ''}:***@{host}"
    elif not sep:  # `postgresql:/user:pw@host`, `mysql:user:pw@host`: a scheme's typo
        text = UNPARSED_CREDENTIALS.sub(r"\1:***@", address)
    return PASSWORD_PARAMETER.sub(r"\1***", text)


UNPARSED_CREDENTIALS = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):[^@\s]*@")
PASSWORD_PARAMETER = re.compile(r"(?i)((?:password|passwd|pwd)=)[^&\s]*")


STORE_DEFAULT = f"default: ${STORE_VARIABLE}, else .hemra/hemra.db in the current folder"
STORE_HELP = (
    f"the store: a SQLite file, or a PostgreSQL database that several machines share"
    f" (postgresql://USER@HOST:PORT/DATABASE) ({STORE_DEFAULT})"
)
