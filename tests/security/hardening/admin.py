"""Probes of the hardening table (tests/security/test_hardening.py): the admin endpoint: its rules,
slow and idle requests.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable

from tests.e2e.support import wait_until
from tests.security import access_support as access
from tests.security import webprobe
from tests.security.conftest import USERS
from tests.security.hardening import Trial


def worked_example_root_creates_orders(trial: Trial) -> object:
    """docs/security.md's worked example as written (its users, its rules file verbatim): root
    runs the `sluiceway cmd create dst` it prescribes, after which shop may send to the queue."""
    secured = trial.start(**access.worked_users(trial.directory))
    shop = access.client(secured, "shop", access.WORKED_USERS, failed_receipts="true")
    before = shop.request("SEND", {"destination": "/queue/orders"}).headers.get("message")
    result = access.run_as_written(secured, access.worked_example().create_command)
    after = shop.request("SEND", {"destination": "/queue/orders"}).headers.get("status")
    return before, result.status, result.out, result.err, after


def worked_example_billing_administers(trial: Trial) -> object:
    secured = trial.start(**access.worked_users(trial.directory))
    result = access.cmd_as(secured, "billing", "list", "dst", users=access.WORKED_USERS)
    return result.status, result.error_line.split(": ", 3)[1:3]


def admin_statuses(*users: str) -> Callable[[Trial], object]:
    """A probe: the HTTP status of GET /broker for each of `users`, in order."""

    def probe(trial: Trial) -> object:
        port = trial.start().broker.admin_port
        return [access.admin_status(port, user) for user in users]

    return probe


ADMIN_LINE = "connection.ADMIN.allow.group=admin"


def _half_requests(count: int, port: int) -> list[socket.socket]:
    opened = []
    try:
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=webprobe.TIMEOUT)
            opened.append(sock)
            sock.sendall(b"GET /api/v1/broker HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    except BaseException:
        for sock in opened:
            sock.close()
        raise
    return opened


def probe_half_requests(trial: Trial) -> object:
    """Many connections that send half a request's head: how many the broker closes, and
    whether each was held at least the header timeout."""
    port = trial.start().broker.admin_port
    started = time.monotonic()
    sockets = _half_requests(20, port)
    try:
        deadline = started + webprobe.TIMEOUT
        closed = [webprobe.closed_within(sock, deadline) for sock in sockets]
        held = time.monotonic() - started >= 0.3
    finally:
        for sock in sockets:
            sock.close()
    return sum(closed), held


def probe_idle_keepalive(trial: Trial) -> object:
    """A kept-alive connection that goes quiet after its answer: the answer, then closed."""
    port = trial.start().broker.admin_port
    request = webprobe.get_request(
        "/api/v1/broker",
        "127.0.0.1",
        close=False,
        Authorization=webprobe.basic("root", USERS["root"][0]),
    )
    with socket.create_connection(("127.0.0.1", port), timeout=webprobe.TIMEOUT) as sock:
        answer = webprobe.http_exchange(port, request, sock=sock)
        closed = webprobe.closed_within(sock, time.monotonic() + webprobe.TIMEOUT)
    return answer.status, closed


def probe_connection_cap(trial: Trial) -> object:
    """Three kept-alive connections fill imq.admin.max_connections=3: the fourth is answered 503
    and closed; once one of the three closes, a new one is served."""
    port = trial.start().broker.admin_port
    authorization = webprobe.basic("root", USERS["root"][0])
    request = webprobe.get_request(
        "/api/v1/broker", "127.0.0.1", close=False, Authorization=authorization
    )
    held = [
        socket.create_connection(("127.0.0.1", port), timeout=webprobe.TIMEOUT) for _ in range(3)
    ]
    try:
        statuses: list[object] = [
            webprobe.http_exchange(port, request, sock=s).status for s in held
        ]
        with socket.create_connection(("127.0.0.1", port), timeout=webprobe.TIMEOUT) as extra:
            refused = webprobe.read_answer(extra)
            closed = webprobe.closed_within(extra, time.monotonic() + webprobe.TIMEOUT)
        statuses += [refused.status, json.loads(refused.body)["error"], closed]
        held.pop().close()
        final = webprobe.get_request("/api/v1/broker", "127.0.0.1", Authorization=authorization)
        answers: list[int] = []

        def served() -> bool:
            try:
                answers.append(webprobe.http_exchange(port, final).status)
            except ConnectionError:  # still refused: the broker has not seen the close yet
                return False
            return answers[-1] == 200

        wait_until(served)
        return [*statuses, answers[-1]]
    finally:
        for sock in held:
            sock.close()
