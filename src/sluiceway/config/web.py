"""The syntax of the properties that name web origins and host names.

`imq.stomp.ws.allowed_origins` lists the origins of the pages that may open STOMP over WebSocket
(`scheme://host[:port]`, as a browser writes its `Origin` header); `imq.admin.allowed_hosts`
lists the names the admin endpoint answers to besides its own address (`host[:port]`, as a
client writes its `Host` header). Both accept `*` for anything. The values are normalised here
(lower case, no brackets around IPv6 addresses, the default port of http and https written
out), so that the server compares them with what a request carries by plain equality.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Final
from urllib.parse import urlsplit

ANY: Final = "*"
DEFAULT_PORTS: Final = {"http": 80, "https": 443, "ws": 80, "wss": 443}
_SCHEME: Final = re.compile(r"^[a-z][a-z0-9+.-]*$")
# A DNS name or an IPv4 address: letters, digits, hyphens, dots (underscores occur in practice).
_NAME: Final = re.compile(
    r"^[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*$"
)


def normalize_host(host: str) -> str:
    """`host` as the broker compares it: lower case, without IPv6 brackets or a final dot, an
    IP address in its canonical form. Raises ValueError for something that is no host."""
    text = host.strip().lower()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    text = text.removesuffix(".")
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        pass
    if not _NAME.match(text):
        raise ValueError(f"{host!r} is not a host name or IP address")
    return text


def split_host_port(text: str) -> tuple[str, int | None]:
    """`host`, `host:port`, `[v6]` or `[v6]:port` -> (normalised host, port or None); a bare
    IPv6 address without brackets is taken whole. Raises ValueError when malformed."""
    text = text.strip()
    if any(c in text for c in "/@?#"):
        raise ValueError(f"{text!r} is not host[:port] (no scheme, user or path)")
    port_text = ""
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(f"{text!r} is not host[:port]")
        port_text = rest[1:]
        if rest and not port_text:
            raise ValueError(f"{text!r} has an empty port")
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
        if not port_text:
            raise ValueError(f"{text!r} has an empty port")
    else:
        host = text
    port = None
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ValueError(f"{text!r} has a port that is not a number from 1 to 65535")
        port = int(port_text)
    return normalize_host(host), port


def parse_origin(text: str) -> tuple[str, str, int | None]:
    """An origin (`scheme://host[:port]`) -> (scheme, normalised host, port); the port is the
    scheme's default when it has one and none is written. Raises ValueError when malformed."""
    text = text.strip()
    try:
        parts = urlsplit(text)
    except ValueError:  # an unclosed [ of an IPv6 address
        raise ValueError(f"{text!r} is not an origin of the form scheme://host[:port]") from None
    scheme = parts.scheme.lower()
    if not _SCHEME.match(scheme) or not text.lower().startswith(f"{scheme}://"):
        raise ValueError(f"{text!r} is not an origin of the form scheme://host[:port]")
    if parts.path not in ("", "/") or parts.query or parts.fragment or "@" in parts.netloc:
        raise ValueError(f"{text!r} is not an origin: an origin has no user, path or query")
    host, port = split_host_port(parts.netloc)
    return scheme, host, port if port is not None else DEFAULT_PORTS.get(scheme)


def format_origin(scheme: str, host: str, port: int | None) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}" if port is None else f"{scheme}://{shown}:{port}"


def _entries(text: str) -> list[str]:
    return [entry.strip() for entry in text.split(",") if entry.strip()]


def parse_origins(text: str) -> tuple[str, ...]:
    """`imq.stomp.ws.allowed_origins`: comma-separated origins, or `*`; normalised."""
    entries = _entries(text)
    if ANY in entries:
        return (ANY,)
    accepted = "comma-separated origins such as https://app.example.com:8443, or * for any"
    try:
        return tuple(format_origin(*parse_origin(entry)) for entry in entries)
    except ValueError as exc:
        raise ValueError(f"{accepted} ({exc})") from None


def parse_hosts(text: str) -> tuple[str, ...]:
    """`imq.admin.allowed_hosts`: comma-separated `host[:port]`, or `*`; normalised."""
    entries = _entries(text)
    if ANY in entries:
        return (ANY,)
    accepted = "comma-separated host names or addresses, each with an optional :port, or *"
    normalised: list[str] = []
    for entry in entries:
        try:
            host, port = split_host_port(entry)
        except ValueError as exc:
            raise ValueError(f"{accepted} ({exc})") from None
        shown = f"[{host}]" if ":" in host else host
        normalised.append(shown if port is None else f"{shown}:{port}")
    return tuple(normalised)
