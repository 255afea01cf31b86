"""Probes of the hardening table (tests/security/test_hardening.py): counts: connections,
transactions, cursors and lease groups.
"""

from __future__ import annotations

from tests.security.hardening import Trial

# A frame sent asking for a receipt: command, headers, body.
CountRequest = tuple[str, dict[str, str], bytes]
# What the client sees of the first request past a limit: the failed RECEIPT's status and limit
# header, whether its detail names that property, and whether the same connection and another
# one then still have their requests accepted.
CountRefusal = tuple[str | None, str | None, bool, bool, bool]


def _past_a_count_limit(
    trial: Trial, reach: list[CountRequest], past: CountRequest, then: list[CountRequest]
) -> CountRefusal:
    """As alice, with failed receipts: `reach` the limit, go `past` it, `then` go on."""
    secured = trial.start()
    client = secured.raw("alice")
    for command, headers, body in reach:
        receipt = client.request(command, headers, body)
        assert "status" not in receipt.headers, receipt
    refused = client.request(*past).headers
    limit = refused.get("limit")
    named = limit is not None and limit in refused.get("detail", "")
    goes_on = all("status" not in client.request(*request).headers for request in then)
    other = secured.raw("bob").request("SEND", {"destination": "/queue/scratch"}, b"after")
    return refused.get("status"), limit, named, goes_on, "status" not in other.headers


def _in_tx(tx: str, body: bytes = b"x") -> CountRequest:
    return "SEND", {"destination": "/queue/scratch", "transaction": tx}, body


def _tx(command: str, tx: str) -> CountRequest:
    return command, {"transaction": tx}, b""


def _cursor(group: str, sub_id: str = "") -> CountRequest:
    """A read through cursor `group` (subscription id `sub_id`, else the group)."""
    sub_id = sub_id or group
    headers = {"destination": "/topic/feed", "id": sub_id, "browser": "true", "cursor": group}
    return "SUBSCRIBE", headers, b""


def _lease(name: str) -> CountRequest:
    headers = {"destination": "/queue/scratch", "id": name, "lease": name}
    return "SUBSCRIBE", headers, b""


def begin_past_max_transactions(trial: Trial) -> CountRefusal:
    reach = [_tx("BEGIN", "a"), _tx("BEGIN", "b")]
    return _past_a_count_limit(trial, reach, _tx("BEGIN", "c"), [_in_tx("a"), _tx("COMMIT", "a")])


def send_past_transaction_messages(trial: Trial) -> CountRefusal:
    reach = [_tx("BEGIN", "a"), _tx("BEGIN", "b"), _in_tx("a"), _in_tx("b")]
    return _past_a_count_limit(trial, reach, _in_tx("b"), [_tx("COMMIT", "b")])


def send_past_transaction_bytes(trial: Trial) -> CountRefusal:
    reach = [_tx("BEGIN", "a"), _in_tx("a", b"x" * 1000)]
    return _past_a_count_limit(trial, reach, _in_tx("a", b"y" * 100), [_tx("COMMIT", "a")])


def cursor_past_max_groups(trial: Trial) -> CountRefusal:
    return _past_a_count_limit(
        trial, [_cursor("a"), _cursor("b")], _cursor("c"), [_cursor("a", "again")]
    )


def lease_group_past_max_groups(trial: Trial) -> CountRefusal:
    return _past_a_count_limit(trial, [_lease("g/1")], _lease("h/1"), [_lease("g/2")])
