"""Probes of the hardening table (tests/security/test_hardening.py): browsers: Origin on the
WebSocket endpoint, Host on the admin endpoint, /ws.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from tests.security import webprobe
from tests.security.conftest import USERS, Secured
from tests.security.hardening import Trial

FOREIGN_ORIGIN = "http://evil.example"
WS_ON = {"imq.stomp.ws.port": "0"}
AUTH_OFF = {"imq.authentication.enabled": "false"}


def _ws_port(secured: Secured) -> int:
    services = secured.broker.services
    assert services is not None
    return services.addresses()["ws"][1]


def probe_ws_origin(origin: str | None, path: str = "/stomp") -> Callable[[Trial], object]:
    """A STOMP session over WebSocket from a page of `origin`: CONNECTED, or the HTTP status."""

    def probe(trial: Trial) -> object:
        port = _ws_port(trial.start())
        return webprobe.ws_connect(port, path, origin, "alice", USERS["alice"][0])

    return probe


def probe_ws_refused(path: str) -> Callable[[Trial], object]:
    """A handshake from a page of another site: the status, whether the answer names the
    origin and the property, whether a WARNING says so."""

    def probe(trial: Trial) -> object:
        port = _ws_port(trial.start())
        with webprobe.capture("sluiceway.server.websocket") as records:
            answer = webprobe.ws_handshake(port, path, FOREIGN_ORIGIN)
        body = answer.body.decode()
        named = FOREIGN_ORIGIN in body and "imq.stomp.ws.allowed_origins" in body
        return answer.status, named, FOREIGN_ORIGIN in records.text()

    return probe


def probe_admin_host(*hosts: str) -> Callable[[Trial], object]:
    """GET /api/v1/broker naming each of `hosts` (`{port}` is the admin port): the statuses,
    and for a refusal its JSON error and whether its detail names the property."""

    def probe(trial: Trial) -> object:
        port = trial.start().broker.admin_port
        seen: list[object] = []
        for host in hosts:
            request = webprobe.get_request("/api/v1/broker", host.format(port=port))
            answer = webprobe.http_exchange(port, request)
            if answer.status == 403:
                error = json.loads(answer.body)
                named = "imq.admin.allowed_hosts" in error["detail"]
                seen.append((403, error["error"], error["status"], named))
            else:
                seen.append(answer.status)
        return seen

    return probe
