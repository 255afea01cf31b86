"""Counts a client can make grow, each bounded by a property, and how often each bound refused.

Per connection: its open transactions (imq.stomp.max_transactions, refused at BEGIN), the
messages one transaction sends (imq.transaction.producer.maxNumMsgs), and the messages and
bytes of bodies all its open transactions hold together (imq.stomp.transactions.max_messages,
imq.stomp.transactions.max_bytes), refused at the SEND. Per destination: a topic's cursors
(imq.cursor.max_groups) and a queue's lease groups (imq.lease.max_groups), refused when a new
one would be opened. A refusal is a ResourceFull (status 414) whose `limit` header names the
property, and changes nothing: what was there before stays, and nothing is journalled.

What the journal holds at start counts toward the limits but is never dropped because of them.
"""

from __future__ import annotations

import enum

from sluiceway.errors import ResourceFull


class CountLimit(enum.Enum):
    """A bounded count; its value is the property that bounds it."""

    TRANSACTIONS = "imq.stomp.max_transactions"  # per connection
    TRANSACTION_SENDS = "imq.transaction.producer.maxNumMsgs"  # per transaction
    TRANSACTION_MESSAGES = "imq.stomp.transactions.max_messages"  # per connection
    TRANSACTION_BYTES = "imq.stomp.transactions.max_bytes"  # per connection
    CURSORS = "imq.cursor.max_groups"  # per topic
    LEASE_GROUPS = "imq.lease.max_groups"  # per queue


class CountRefusals:
    """How many requests each count limit refused since the broker started."""

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts = dict.fromkeys(CountLimit, 0)

    def __getitem__(self, limit: CountLimit) -> int:
        return self._counts[limit]

    def refuse(
        self,
        limit: CountLimit,
        value: int,
        summary: str,
        detail: str,
        destination: str | None = None,
    ) -> ResourceFull:
        """Count a refusal by `limit` (in force at `value`); the error to raise for it, which
        names the property in its `limit` header and its text."""
        self._counts[limit] += 1
        return ResourceFull(
            summary,
            detail,
            destination=destination,
            limit=limit.value,
            limit_value=str(value),
        )
