"""Probes of the hardening table (tests/security/test_hardening.py): password checks: off the event
loop, cached, slowed down for repeated failures.
"""

from __future__ import annotations

from sluiceway.security.users import UserFile
from tests.e2e.rawclient import RawClient
from tests.e2e.support import wait_until
from tests.security.conftest import USERS
from tests.security.hardening import Trial
from tests.security.logins_support import (
    PATIENT_S,
    Flood,
    timed_admin,
    timed_refusal,
)

# (Imported here, in this section: each section of the table is edited on its own.)


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
