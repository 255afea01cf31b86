"""What the admin endpoint checks before authentication: the `Host` a request names, and the
limits on its connections (server.httpguard).

A request whose `Host` header names neither the endpoint (server.browsers.served_names) nor a
name of `imq.admin.allowed_hosts` is refused with 403 `unknown host`: a web page that had its DNS
name pointed at the broker's address (DNS rebinding) would otherwise reach the API through its
visitor's browser, which matters most with authentication off, the default on loopback.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

from aiohttp import hdrs, web

from sluiceway.config import BrokerConfig
from sluiceway.errors import Forbidden, Status
from sluiceway.server.browsers import HostPolicy, machine_name, served_names, shown
from sluiceway.server.httpguard import GuardLimits

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class HostCheck:
    """The middleware that refuses requests naming a host the endpoint does not serve."""

    def __init__(self, config: BrokerConfig, scheme: str) -> None:
        self.policy = HostPolicy(config.admin_allowed_hosts)
        self.bound = config.host
        self.scheme = scheme
        self.machine = machine_name()

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        host = request.headers.get(hdrs.HOST)
        transport = request.transport
        local = transport.get_extra_info("sockname") if transport is not None else None
        served = served_names(
            (self.bound, local[0] if isinstance(local, tuple) else None), self.machine
        )
        if not self.policy.allows(host, served, self.scheme):
            assert host is not None
            log.warning(
                "admin request %s %s from %s refused: Host %s is not a name this endpoint "
                "serves (imq.admin.allowed_hosts)",
                request.method,
                request.path,
                request.remote,
                shown(host),
            )
            raise Forbidden(
                "unknown host",
                f"this admin endpoint does not answer to the host {shown(host)}: name the "
                "broker by its address or its machine's host name (localhost when it listens "
                "on loopback), or have its administrator add that name to "
                "imq.admin.allowed_hosts",
            )
        return await handler(request)


def admin_limits(config: BrokerConfig) -> GuardLimits:
    """The admin endpoint's connection limits, and its answer to a connection beyond the cap."""
    cap = config.admin_max_connections
    body = json.dumps(
        {
            "error": "too many connections",
            "detail": f"the admin endpoint already holds {cap} connections, the most it "
            "allows (imq.admin.max_connections); try again later, or close idle ones",
            "status": int(Status.RESOURCE_FULL),
        }
    ).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\n"
        "Content-Type: application/json; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Retry-After: 1\r\n"
        "Connection: close\r\n\r\n"
    )
    return GuardLimits(
        header_timeout_s=config.admin_header_timeout_ms / 1000,
        header_timeout_property="imq.admin.request.header_timeout",
        max_connections=cap,
        max_connections_property="imq.admin.max_connections",
        refusal=head.encode() + body,
    )
