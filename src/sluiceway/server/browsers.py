"""What keeps a web page from using its visitor's browser against the broker.

A page from any site can make the browser open a WebSocket to any address, sending the page's
origin in `Origin`; and a site whose DNS name is made to point at 127.0.0.1 (DNS rebinding) can
make the browser send HTTP requests to a local port, naming the site in `Host`. With
authentication off (the default on loopback), either would let the page produce, consume or
administer. So:

- the WebSocket handshake must come with no `Origin` (not a browser) or one whose host is a name
  the endpoint serves, or one listed in `imq.stomp.ws.allowed_origins`;
- every admin request must come with no `Host` (HTTP/1.0) or one naming the endpoint (any port),
  or one listed in `imq.admin.allowed_hosts`.

The names an endpoint serves (`served_names`) are its bound address, the local address the
request came in on, the machine's host name, and on loopback `localhost`, `127.0.0.1` and `::1`.
A rebinding site's own name is never among them.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from typing import Final

from sluiceway.config.web import ANY, DEFAULT_PORTS, format_origin, parse_origin, split_host_port

LOOPBACK_NAMES: Final = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARDS: Final = frozenset({"", "0.0.0.0", "::"})  # noqa: S104  (names, not a bind)
SHOWN_MAX: Final = 200  # characters of a refused header shown in a message or the log


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def served_names(addresses: Iterable[str | None], host_name: str | None = None) -> frozenset[str]:
    """The host names and addresses an endpoint bound to and reached at `addresses` answers to
    (normalised; wildcard addresses stand for nothing)."""
    names: set[str] = set()
    for address in addresses:
        if address is None or address in WILDCARDS:
            continue
        try:
            host, _ = split_host_port(address)
        except ValueError:
            continue
        names.add(host)
    if any(_loopback(name) for name in names):
        names |= LOOPBACK_NAMES
    if host_name:
        names.add(host_name.lower())
    return frozenset(names)


def machine_name() -> str:
    """The machine's host name (no DNS lookup)."""
    return socket.gethostname()


def shown(value: str) -> str:
    """A header a client sent, fit for a message or a log line (escaped, cut)."""
    text = repr(value[:SHOWN_MAX])
    return text + " (cut)" if len(value) > SHOWN_MAX else text


class OriginPolicy:
    """Which `Origin` headers may open STOMP over WebSocket (`imq.stomp.ws.allowed_origins`)."""

    def __init__(self, allowed: Iterable[str]) -> None:
        entries = tuple(allowed)
        self.any = ANY in entries
        self.listed = frozenset(entries)  # normalised by config.web.parse_origins

    def allows(self, origin: str | None, served: frozenset[str]) -> bool:
        if origin is None or self.any:
            return True
        try:
            scheme, host, port = parse_origin(origin)
        except ValueError:
            return False  # "null" (a sandboxed page, a file) and malformed values
        return host in served or format_origin(scheme, host, port) in self.listed


class HostPolicy:
    """Which `Host` headers the admin endpoint answers (`imq.admin.allowed_hosts`)."""

    def __init__(self, allowed: Iterable[str]) -> None:
        self.any = False
        self.names: set[str] = set()  # any port
        self.pairs: set[tuple[str, int]] = set()  # this port only
        for entry in allowed:
            if entry == ANY:
                self.any = True
                continue
            host, port = split_host_port(entry)  # normalised by config.web.parse_hosts
            if port is None:
                self.names.add(host)
            else:
                self.pairs.add((host, port))

    def allows(self, host_header: str | None, served: frozenset[str], scheme: str) -> bool:
        if host_header is None or self.any:
            return True
        try:
            host, port = split_host_port(host_header)
        except ValueError:
            return False
        if host in served or host in self.names:
            return True
        return (host, port if port is not None else DEFAULT_PORTS[scheme]) in self.pairs
