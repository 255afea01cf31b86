"""Properties of the services around the broker: the admin endpoint, TLS, STOMP over WebSocket,
authentication and access control, and metrics. Open MQ's names where Open MQ has one."""

from __future__ import annotations

from dataclasses import dataclass

from sluiceway.config.properties import int_parser, parse_bool, prop, size_parser
from sluiceway.config.web import parse_hosts, parse_origins


def parse_optional_path(text: str) -> str:
    """A file path, or empty for "not set"."""
    return text.strip()


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    """The operating side of the broker: what it serves besides plain STOMP, and who may use it."""

    admin_port: int = prop(
        "imq.admin.http.port",
        int_parser(-1, 65535),
        61680,
        "TCP port of the admin endpoint: the HTTP JSON API that `sluiceway cmd` uses, the web "
        "console, and /metrics for Prometheus (0: any free port; -1: no admin endpoint). It "
        "binds to imq.hostname.",
    )
    admin_tls: bool = prop(
        "imq.admin.tls",
        parse_bool,
        False,
        "Serve the admin endpoint over HTTPS, with imq.tls.certfile and imq.tls.keyfile.",
    )
    admin_allowed_hosts: tuple[str, ...] = prop(
        "imq.admin.allowed_hosts",
        parse_hosts,
        (),
        "Names the admin endpoint answers to besides its own (imq.hostname, the address a "
        "request came in on, the machine's host name, and localhost, 127.0.0.1 and ::1 on "
        "loopback): comma-separated host[:port], e.g. a DNS name or a proxy's; * for any. A "
        "request whose Host header names anything else gets 403, before authentication, so a "
        "web page cannot reach the endpoint through DNS rebinding.",
    )
    admin_header_timeout_ms: int = prop(
        "imq.admin.request.header_timeout",
        int_parser(minimum=1),
        10_000,
        "Time, in ms, a connection to the admin endpoint has to send a request's line and "
        "headers (from its first byte, or from the connection's start); then it is closed. "
        "Over HTTPS the TLS handshake has as long again, before.",
    )
    admin_keepalive_timeout_ms: int = prop(
        "imq.admin.keepalive.timeout",
        int_parser(minimum=1),
        30_000,
        "Time, in ms, an admin connection may stay idle between two requests before it is "
        "closed (the web console polls every 2 s; Prometheus scrapes every 15 s by default). "
        "Also the longest a new connection may take to send its first request, when shorter "
        "than imq.admin.request.header_timeout.",
    )
    admin_max_connections: int = prop(
        "imq.admin.max_connections",
        int_parser(minimum=1),
        32,
        "Most connections the admin endpoint holds open at once; one more gets 503 and is closed.",
    )
    tls_certfile: str = prop(
        "imq.tls.certfile",
        parse_optional_path,
        "",
        "PEM file with the broker's certificate (and its chain) for the TLS services.",
    )
    tls_keyfile: str = prop(
        "imq.tls.keyfile",
        parse_optional_path,
        "",
        "PEM file with the private key of imq.tls.certfile (empty: the key is in the certfile).",
    )
    stomp_tls_port: int = prop(
        "imq.stomp.tls.port",
        int_parser(-1, 65535),
        -1,
        "TCP port of STOMP over TLS, with imq.tls.certfile (0: any free port; -1: off).",
    )
    ws_port: int = prop(
        "imq.stomp.ws.port",
        int_parser(-1, 65535),
        -1,
        "TCP port of STOMP over WebSocket, for browser clients such as stomp.js; the endpoint is "
        "/stomp (also /ws and /), subprotocols v10.stomp, v11.stomp, v12.stomp (0: any free "
        "port; -1: off).",
    )
    ws_tls: bool = prop(
        "imq.stomp.ws.tls",
        parse_bool,
        False,
        "Serve STOMP over WebSocket with TLS (wss://), with imq.tls.certfile.",
    )
    ws_allowed_origins: tuple[str, ...] = prop(
        "imq.stomp.ws.allowed_origins",
        parse_origins,
        (),
        "Origins of the web pages that may open STOMP over WebSocket, besides pages of the "
        "endpoint's own host (imq.hostname, the address a request came in on, the machine's "
        "host name, and localhost, 127.0.0.1 and ::1 on loopback): comma-separated "
        "scheme://host[:port] (without a port: 80 for http, 443 for https), * for any. A "
        "handshake with another Origin header gets 403; one without (a client that is not a "
        "browser) is accepted.",
    )
    authentication: bool = prop(
        "imq.authentication.enabled",
        parse_bool,
        False,
        "Check the login and passcode of every STOMP CONNECT, and the credentials of every admin "
        "request, against the users file (imq.user_repository.file.filename). Required when "
        "imq.hostname is not a loopback address, unless imq.authentication.insecure is true.",
    )
    insecure: bool = prop(
        "imq.authentication.insecure",
        parse_bool,
        False,
        "Allow running without authentication on a non-loopback address (anyone who can reach "
        "the port may then produce, consume and administer).",
    )
    users_file: str = prop(
        "imq.user_repository.file.filename",
        parse_optional_path,
        "",
        "The users file: user names, salted password hashes and groups, managed with "
        "`sluiceway cmd user` (empty: passwd in the data directory).",
    )
    access_control: bool = prop(
        "imq.accesscontrol.enabled",
        parse_bool,
        True,
        "With authentication, apply the access rules of imq.accesscontrol.file.filename to "
        "connecting, producing, consuming, browsing and auto-creating destinations.",
    )
    access_file: str = prop(
        "imq.accesscontrol.file.filename",
        parse_optional_path,
        "",
        "The access rules, in Open MQ's accesscontrol.properties syntax (empty: "
        "accesscontrol.properties in the data directory; without that file, every "
        "authenticated user may use every destination, and the admin group administers).",
    )
    auth_workers: int = prop(
        "imq.authentication.workers",
        int_parser(1, 64),
        1,
        "Threads that check passwords, beside the event loop: each check is scrypt, about 40 ms "
        "of CPU and 16 MiB of memory, so this bounds both what password checks take from the "
        "machine and how many run at once. The default leaves the other cores of a small "
        "machine to the broker's event loop and its journal.",
    )
    auth_queue_max: int = prop(
        "imq.authentication.queue.max",
        int_parser(0, 100000),
        128,
        "Password checks that may wait for a free thread (imq.authentication.workers); past "
        "this, a CONNECT is refused with status 503 (too many logins in progress) and an admin "
        "request with HTTP 503, and the client may try again later.",
    )
    auth_cache_ttl_s: int = prop(
        "imq.authentication.cache.ttl",
        int_parser(0, 3600),
        30,
        "Seconds a user name and password that passed the check are remembered, so that the "
        "same credentials are accepted again without a check (a keyed hash of them is kept, "
        "never the password; at most 1024 of them). Every entry is forgotten when the users "
        "file changes. 0: no cache.",
    )
    auth_delay_base_ms: int = prop(
        "imq.authentication.delay.base",
        int_parser(0, 60000),
        100,
        "Milliseconds the answer to a failed login is held back after the first failure from "
        "an address in a row; the delay doubles with each further failure, up to "
        "imq.authentication.delay.max, and a success resets it (0: no delay).",
    )
    auth_delay_max_ms: int = prop(
        "imq.authentication.delay.max",
        int_parser(0, 60000),
        5000,
        "Longest delay, in milliseconds, of the answer to a login from an address whose logins "
        "failed in a row (see imq.authentication.delay.base).",
    )
    metrics_enabled: bool = prop(
        "imq.metrics.enabled",
        parse_bool,
        True,
        "Sample the broker's metrics (rates, peaks, averages) every imq.metrics.interval and keep "
        "their history.",
    )
    metrics_interval_s: int = prop(
        "imq.metrics.interval",
        int_parser(minimum=1),
        10,
        "Seconds between two rows of the metrics history (one row per broker, destination, "
        "connection and consumer).",
    )
    metrics_retention_h: int = prop(
        "imq.metrics.history.retention",
        int_parser(minimum=0),
        24,
        "Hours of metrics history kept under metrics/ in the data directory (JSON lines, one "
        "file per hour); 0: keep no history.",
    )
    metrics_max_size: int = prop(
        "imq.metrics.history.max_size",
        size_parser(),
        256 * 1024 * 1024,
        "Most bytes the metrics history may take on disk; the oldest files go first.",
    )
