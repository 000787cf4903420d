"""What the package managers' own records say a file should hold: dpkg's `md5sums`, the
conffiles' checksums in dpkg's status, the paths a package lists (`<package>.list`), and a
wheel's `RECORD`. Pure parsers over text, kept for the paths asked about (tamper evidence,
`score/tamper.py`)."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field

MERGED = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")  # /usr-merge: /bin -> /usr/bin ...


@dataclass
class Records:
    """By absolute path: dpkg's md5 digests, RECORD's sha256 digests (urlsafe base64 without
    padding; "" for an entry listed without a hash, a .pyc pip compiled), and the paths a
    package lists (dpkg's .list, RECORD: links included); `notes` says what went unread."""

    md5: dict[str, set[str]] = field(default_factory=dict)
    sha256: dict[str, set[str]] = field(default_factory=dict)
    listed: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    read: int = 0  # bytes streamed to read them

    def explains(self, path: str, md5: str, sha256: str) -> bool:
        """Whether a file with these digests at `path` is what a package installed there."""
        if any(md5 in self.md5.get(alias, ()) for alias in aliases(path)):
            return True
        listed = self.sha256.get(path, set())
        return sha256 in listed or (path.endswith(".pyc") and "" in listed)

    def lists(self, path: str) -> bool:
        return any(alias in self.listed for alias in aliases(path))

    def add(self, digests: dict[str, set[str]], found: Mapping[str, set[str]]) -> None:
        for path, values in found.items():
            digests.setdefault(path, set()).update(values)


def aliases(path: str) -> tuple[str, ...]:
    """`path` and its other name under /usr-merge (/bin/cat and /usr/bin/cat), as dpkg may
    record either."""
    parts = path.split("/", 3)  # "", "usr", "bin", rest
    if len(parts) > 3 and parts[1] == "usr" and parts[2] in MERGED:
        return (path, path[len("/usr") :])
    if len(parts) > 2 and parts[1] in MERGED:
        return (path, "/usr" + path)
    return (path,)


def parse_md5sums(text: str, wanted: set[str]) -> dict[str, set[str]]:
    """dpkg's `<package>.md5sums` ("<md5>  <path without its leading slash>" a line), kept for
    the `wanted` absolute paths (under either name /usr-merge gives them)."""
    found: dict[str, set[str]] = {}
    for line in text.splitlines():
        digest, _, relative = line.partition("  ")
        if not relative or len(digest) != 32:
            continue
        for alias in aliases("/" + relative.lstrip("/")):
            if alias in wanted:
                found.setdefault(alias, set()).add(digest.lower())
    return found


def parse_list(text: str, wanted: set[str]) -> set[str]:
    """dpkg's `<package>.list` (an absolute path a line: files, links, folders), kept for the
    `wanted` paths."""
    return {
        alias for line in text.splitlines() for alias in aliases(line.strip()) if alias in wanted
    }


def parse_conffiles(status: str, wanted: set[str]) -> dict[str, set[str]]:
    """The conffiles' md5 digests dpkg keeps in its status file (" <path> <md5>[ obsolete]")."""
    found: dict[str, set[str]] = {}
    for line in status.splitlines():
        if not line.startswith(" /"):
            continue
        fields = line.split()
        if len(fields) >= 2 and fields[0] in wanted and len(fields[1]) == 32:
            found.setdefault(fields[0], set()).add(fields[1].lower())
    return found


def parse_record(text: str, record_path: str, wanted: set[str]) -> dict[str, set[str]]:
    """A wheel's `<dist>.dist-info/RECORD` (csv: path, "sha256=<urlsafe b64, no padding>",
    size), its paths relative to the folder holding the dist-info (`../../../bin/x` for a
    script) or absolute, kept for the `wanted` paths; an entry without a hash maps to ""."""
    site = posixpath.dirname(posixpath.dirname(record_path))
    found: dict[str, set[str]] = {}
    for row in csv.reader(io.StringIO(text)):
        if not row or not row[0]:
            continue
        path = posixpath.normpath(posixpath.join(site, row[0]))
        if path not in wanted:
            continue
        algorithm, _, digest = (row[1] if len(row) > 1 else "").partition("=")
        if algorithm == "sha256":
            found.setdefault(path, set()).add(digest)
        elif not algorithm:
            found.setdefault(path, set()).add("")
    return found


def record_digest(content: bytes) -> str:
    """A digest as RECORD writes it: sha256, urlsafe base64 without padding."""
    return base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
