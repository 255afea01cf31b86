"""What the password-check tests share: timed refused logins, a flood of wrong passwords, and
a look at the broker's password checks."""

from __future__ import annotations

import threading
import time
from collections import Counter
from types import TracebackType

from sluiceway.security.logins import LoginCounts
from sluiceway.testing import BrokerThread
from tests.admin.adminhttp import AdminHttp
from tests.e2e.rawclient import ConnectionClosed, RawClient

# Long enough for an answer held back by the delays these tests configure, on a loaded machine.
PATIENT_S = 30.0
IDLE = LoginCounts(waiting=0, running=0, held=0, cached=0, addresses=0)


def counts(broker: BrokerThread) -> LoginCounts:
    """What the broker's password checks hold now (read on its event loop)."""
    services = broker.services
    assert services is not None
    assert services.gate is not None
    gate = services.gate
    return broker.call(gate.logins.counts)


def pending(broker: BrokerThread) -> tuple[int, int, int]:
    """Checks waiting, running, and answers held back."""
    now = counts(broker)
    return now.waiting, now.running, now.held


def timed_refusal(port: int, login: str, passcode: str) -> tuple[str, float]:
    """CONNECT with these credentials; the ERROR's status and the seconds it took to come."""
    client = RawClient(port, timeout=PATIENT_S)
    try:
        started = time.monotonic()
        client.send("CONNECT", {"accept-version": "1.2", "login": login, "passcode": passcode})
        error = client.expect("ERROR")
        elapsed = time.monotonic() - started
        client.expect_closed()
    finally:
        client.close()
    return error.headers["status"], elapsed


def timed_admin(port: int, user: str, password: str) -> tuple[int, float]:
    """GET /api/v1/broker with these HTTP Basic credentials: the status, and the seconds it
    took to come."""
    started = time.monotonic()
    status, _, _ = AdminHttp(port, user, password).raw("GET", "/api/v1/broker")
    return status, time.monotonic() - started


class Flood:
    """`attackers` threads, each sending a CONNECT with a wrong password, waiting for the
    answer, and trying again on a new connection, until the flood is stopped (on leaving the
    `with`, whatever happens)."""

    def __init__(self, port: int, attackers: int, login: str = "alice") -> None:
        self.port = port
        self.login = login
        self.answers: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._attack) for _ in range(attackers)]

    def __enter__(self) -> Flood:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(PATIENT_S + 5)

    @property
    def answered(self) -> int:
        with self._lock:
            return sum(self.answers.values())

    def _attack(self) -> None:
        headers = {"accept-version": "1.2", "login": self.login, "passcode": "a-wrong-guess"}
        while not self._stop.is_set():
            client: RawClient | None = None
            try:
                client = RawClient(self.port, timeout=PATIENT_S)
                client.send("CONNECT", headers)
                answer = client.expect("ERROR").headers["status"]
            except (OSError, ConnectionClosed, AssertionError) as exc:
                answer = type(exc).__name__
            finally:
                if client is not None:
                    client.close()
            with self._lock:
                self.answers[answer] += 1
