"""Probes of the hardening table (tests/security/test_hardening.py): access changes: deleted users,
revoked rights, connections destroyed.
"""

from __future__ import annotations

from tests.security import access_support as access
from tests.security.hardening import Trial


def deleted_user(trial: Trial) -> object:
    """alice is deleted with `sluiceway cmd user delete` while connected."""
    secured = trial.start()
    alice = access.client(secured, "alice")
    users = str(secured.directory / "passwd")
    deleted = access.run_cmd("user", "delete", "-u", "alice", "--file", users)
    assert deleted.status == 0, deleted.err
    status, message, _, closed = access.closed_with(alice)
    return status, message, closed


def revoked_produce(trial: Trial) -> object:
    """alice may produce to /queue/scratch, then the rule is removed: her next SEND (on a
    connection without failed receipts) gets ERROR 403 and the connection closes."""
    secured = trial.start()
    alice = access.client(secured, "alice")
    sent = alice.request("SEND", {"destination": "/queue/scratch"}, b"before").command
    rule = "queue.scratch.produce.allow.user=*"
    access.replace_file(secured.access_file, access.without_line(access.RULES, rule))
    carol = access.client(secured, "carol", failed_receipts="true")  # noticed once she is refused
    access.wait_refused(carol, "SEND", {"destination": "/queue/scratch"})
    alice.send("SEND", {"destination": "/queue/scratch", "receipt": "r-after"}, b"after")
    status, message, _, closed = access.closed_with(alice)
    return sent, status, message, closed


def revoked_connect(trial: Trial) -> object:
    """alice joins eve in connection.NORMAL.deny.user while she is connected."""
    secured = trial.start()
    alice = access.client(secured, "alice")
    deny = "connection.NORMAL.deny.user=eve"
    rules = access.without_line(access.RULES, deny) + f"{deny},alice\n"
    access.replace_file(secured.access_file, rules)
    status, message, _, closed = access.closed_with(alice)
    return status, message, closed


def destroyed_connection(trial: Trial) -> object:
    """root runs `sluiceway cmd destroy cxn -n ID -reason TEXT -f` on alice's connection."""
    secured = trial.start()
    alice = access.client(secured, "alice")
    number = access.connection_id(secured, "alice")
    args = ("destroy", "cxn", "-n", str(number), "-reason", "maintenance window", "-f")
    result = access.cmd_as(secured, "root", *args)
    output = result.out.replace(f"connection {number} ", "connection ID ")
    status, message, body, closed = access.closed_with(alice)
    return result.status, output.split(" (")[0], status, message, body.strip(), closed
