"""What a careless or hostile client meets, one row per case (docs/security.md).

Each row's probe starts a real broker through its Trial (authentication on, the users of USERS,
the rules of RULES or the row's own, the row's properties, and any the probe adds, such as the
files it made in `trial.directory`), does what the row names over real sockets, and returns what
it saw; the row says what that must be. A probe may expect the start itself to fail. What a
probe returns is what a client or an operator can observe (a status, a message, whether the
socket closed, a count), not the broker's internals.

The rows are grouped by what they harden; each group is a list below, and CASES joins them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.security.conftest import Secured, SecuredFactory


@dataclass(frozen=True)
class Case:
    """One row: the broker's properties, what is tried against it, and what must be seen."""

    id: str
    probe: Callable[[Trial], object]
    expected: object
    properties: dict[str, str] = field(default_factory=dict)
    rules: str | None = None  # the access rules file; None: the suite's RULES


@dataclass
class Trial:
    """What a probe starts its broker with."""

    case: Case
    factory: SecuredFactory
    directory: Path  # the test's own directory, for files the probe makes

    def start(self, **properties: str) -> Secured:
        """The row's broker, with `properties` added to the row's."""
        values = {**self.case.properties, **properties}
        if self.case.rules is None:
            return self.factory(**values)
        return self.factory(self.case.rules, **values)


# -- the input budget: partly received frames, frames before CONNECT ------------------------

INPUT_CASES: list[Case] = []


# -- password checks: off the event loop, cached, slowed down for repeated failures ----------

# (Imported here, in this section: each section of the table is edited on its own.)
from sluiceway.security.users import UserFile  # noqa: E402
from tests.e2e.rawclient import RawClient  # noqa: E402
from tests.e2e.support import wait_until  # noqa: E402
from tests.security.conftest import USERS  # noqa: E402
from tests.security.logins_support import (  # noqa: E402
    PATIENT_S,
    Flood,
    timed_admin,
    timed_refusal,
)


def growing_delays(trial: Trial) -> list[tuple[str, bool]]:
    """Four wrong passwords in a row from one address (the row sets base 200 ms, cap 800 ms):
    each ERROR's status, and whether it came no sooner than its delay."""
    port = trial.start().port
    seen = []
    for delay in (0.2, 0.4, 0.8, 0.8):
        status, elapsed = timed_refusal(port, "alice", "not-her-password")
        seen.append((status, elapsed >= delay))
    return seen


def cache_after_changes(trial: Trial) -> tuple[str, ...]:
    """Alice and Bob log in (and are remembered); then Alice's password changes and Bob is
    deleted: what each of their next CONNECTs gets."""
    secured = trial.start()
    secured.raw("alice")
    secured.raw("bob")
    users = UserFile(secured.directory / "passwd")
    users.add("alice", "alice-new-pw-W3", ("writers",))
    users.delete("bob")
    old_password = secured.refused_connect(login="alice", passcode=USERS["alice"][0])
    new_password = secured.raw(connect=False)
    new_password.connect(login="alice", passcode="alice-new-pw-W3")
    deleted = secured.refused_connect(login="bob", passcode=USERS["bob"][0])
    return old_password["status"], "CONNECTED", deleted["status"]


def connect_during_flood(trial: Trial) -> dict[str, object]:
    """20 connections send wrong passwords as fast as the broker answers. Meanwhile a client
    connected before makes 20 SEND/RECEIPT round trips, and a new client connects."""
    secured = trial.start()
    carol = secured.raw("carol")
    with Flood(secured.port, 20) as flood:
        wait_until(lambda: flood.answered >= 20, PATIENT_S)
        for _ in range(20):
            carol.request("SEND", {"destination": "/topic/news"}, b"during the flood")
        newcomer = RawClient(secured.port, timeout=PATIENT_S)
        try:
            connected = newcomer.connect(login="bob", passcode=USERS["bob"][0]).command
        finally:
            newcomer.close()
    return {"round trips": 20, "newcomer": connected, "attackers got": sorted(flood.answers)}


def admin_delays(trial: Trial) -> list[tuple[int, bool]]:
    """Three admin requests with a wrong password, then one with the right one (the row sets
    base 300 ms, cap 1200 ms): each status, and whether it came no sooner than its delay."""
    port = trial.start().broker.admin_port
    seen = []
    for password, delay in (("typo", 0.3), ("typo", 0.6), ("typo", 1.2), (USERS["root"][0], 1.2)):
        status, elapsed = timed_admin(port, "root", password)
        seen.append((status, elapsed >= delay))
    return seen


def overload(trial: Trial) -> tuple[list[str], set[str], bool]:
    """30 CONNECTs at once to a broker with one thread and no queue for checks: the statuses
    they get, the message of the 503s, and whether every connection was closed."""
    port = trial.start().port
    clients = [RawClient(port, timeout=PATIENT_S) for _ in range(30)]
    try:
        for client in clients:
            client.send("CONNECT", {"accept-version": "1.2", "login": "bob", "passcode": "x"})
        errors = [client.expect("ERROR").headers for client in clients]
        for client in clients:
            client.expect_closed()
    finally:
        for client in clients:
            client.close()
    busy = {e["message"] for e in errors if e["status"] == "503"}
    return sorted({e["status"] for e in errors}), busy, all(c.closed for c in clients)


PASSWORD_CASES: list[Case] = [
    Case(
        "wrong passwords from one address are answered after a growing delay",
        growing_delays,
        [("401", True)] * 4,
        properties={
            "imq.authentication.delay.base": "200",
            "imq.authentication.delay.max": "800",
        },
    ),
    Case(
        "the cache lets in neither an old password nor a deleted user",
        cache_after_changes,
        ("401", "CONNECTED", "401"),
    ),
    Case(
        "a CONNECT and round trips during a flood of wrong passwords complete",
        connect_during_flood,
        {"round trips": 20, "newcomer": "CONNECTED", "attackers got": ["401"]},
        properties={"imq.authentication.workers": "1", "imq.authentication.delay.max": "500"},
    ),
    Case(
        "admin requests with a wrong password are answered after a growing delay too",
        admin_delays,
        [(401, True), (401, True), (401, True), (200, True)],
        properties={
            "imq.authentication.delay.base": "300",
            "imq.authentication.delay.max": "1200",
        },
    ),
    Case(
        "past the queue of password checks a CONNECT gets 503 and is closed",
        overload,
        (["401", "503"], {"too many logins in progress"}, True),
        properties={
            "imq.authentication.workers": "1",
            "imq.authentication.queue.max": "0",
            "imq.authentication.delay.base": "0",
        },
    ),
]


# -- listeners and TLS: the plain port off, certificates checked at start --------------------

LISTENER_CASES: list[Case] = []


# -- browsers: Origin on the WebSocket endpoint, Host on the admin endpoint, /ws -------------

BROWSER_CASES: list[Case] = []


# -- the admin endpoint: its rules, slow and idle requests -----------------------------------

ADMIN_CASES: list[Case] = []


# -- access changes: deleted users, revoked rights, connections destroyed --------------------

ACCESS_CHANGE_CASES: list[Case] = []


# -- counts: connections, transactions, cursors and lease groups -----------------------------

COUNT_CASES: list[Case] = []


CASES = [
    *INPUT_CASES,
    *PASSWORD_CASES,
    *LISTENER_CASES,
    *BROWSER_CASES,
    *ADMIN_CASES,
    *ACCESS_CHANGE_CASES,
    *COUNT_CASES,
]


@pytest.mark.parametrize("case", [pytest.param(case, id=case.id) for case in CASES])
def test_case(case: Case, secured_factory: SecuredFactory, tmp_path: Path) -> None:
    assert case.probe(Trial(case, secured_factory, tmp_path)) == case.expected
