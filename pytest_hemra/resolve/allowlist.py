"""Harbor's host allowlist (`allowed_hosts`): its entries normalized at resolve, and the checks
HEMRA's egress proxy makes against it.

An entry is a hostname (`pypi.org`), a wildcard over a name's subdomains (`*.github.com`: not
`github.com` itself), an IPv4 or IPv6 address, or a CIDR range; lower-case, no trailing dot, no
scheme, port or path. A destination passes when its name matches (exactly, or under a
wildcard), or when it is an address within an address or range entry. Then the address it
resolved to is checked too: never link-local (cloud metadata) or unspecified, and never the
runner's own addresses or loopback unless an address or range entry names it literally (a name
on the list that resolves to 127.0.0.1, or to the gateway's address, is refused).
"""

from __future__ import annotations

import errno
import ipaddress
import re
import socket
from dataclasses import dataclass

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
LINK_LOCAL = (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"))


def normalize_host(entry: str) -> str:
    """One `allowed_hosts` entry in Harbor's normal form; ValueError naming what is wrong."""
    host = entry.strip().lower()
    if not host:
        raise ValueError("an empty entry")
    if "://" in host or (any(c in host for c in "/?#@[] ") and not _is_network(host)):
        raise ValueError(f"{entry!r} is not a host (no URL, port or path: e.g. 'pypi.org')")
    if "/" in host:
        return str(ipaddress.ip_network(host, strict=False))
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    name = host.rstrip(".")
    bare = name.removeprefix("*.")
    labels = bare.split(".")
    if len(name) > 253 or not all(LABEL.match(label) for label in labels) or "*" in bare:
        hint = " (a port?)" if ":" in host else ""
        raise ValueError(f"{entry!r} is not a hostname, '*.suffix', IP address or CIDR{hint}")
    if name.startswith("*.") and len(labels) < 2:
        raise ValueError(f"{entry!r}: a wildcard needs a suffix of two labels at least")
    return name


def normalize_hosts(entries: list[str]) -> list[str]:
    """Every entry normalized, duplicates dropped, order kept."""
    return list(dict.fromkeys(normalize_host(entry) for entry in entries))


def _is_network(text: str) -> bool:
    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError:
        return False
    return "/" in text


def is_own_address(address: IpAddress) -> bool:
    """Whether `address` is one of this machine's (binding to it succeeds)."""
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((str(address), 0))
        except OSError as error:
            return error.errno != errno.EADDRNOTAVAIL
    return True


@dataclass(frozen=True)
class HostAllowlist:
    """A phase's normalized `allowed_hosts`."""

    entries: tuple[str, ...]

    @property
    def networks(self) -> tuple[IpNetwork, ...]:
        found = []
        for entry in self.entries:
            try:
                found.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                continue
        return tuple(found)

    def names(self, host: str) -> bool:
        """Whether the destination `host` (a name or an address, as the client asked) is on
        the list."""
        host = host.strip().lower().rstrip(".").strip("[]")
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return any(
                host == entry or (entry.startswith("*.") and host.endswith(entry[1:]))
                for entry in self.entries
            )
        return any(address in network for network in self.networks)

    def refusal(self, address: IpAddress) -> str | None:
        """Why the proxy must not connect to `address` (what a listed name resolved to), or
        None when it may."""
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if address.is_unspecified or any(address in network for network in LINK_LOCAL):
            return f"{address} is a link-local or unspecified address"
        literal = any(address in network for network in self.networks)
        if address.is_loopback and not literal:
            return f"{address} is loopback (allowlist the address itself to reach it)"
        if not literal and is_own_address(address):
            return f"{address} is the runner's own (allowlist the address itself to reach it)"
        return None
