"""What a session is to its consumers and producers: acknowledgement modes and transactions,
as in JMS. (`session.Session` adds the making of producers, consumers and browsers.)

Every consumer subscribes with `ack:client-individual`, so the broker counts a message as consumed
only when this session acknowledges it, and the client's buffer never holds more than the
consumer's window. When the acknowledgement is sent depends on the mode:

- AUTO: when the message is handed to the application (`receive` returns it, or the listener
  returns). With prefetch disabled, a message that `receive` returned is acknowledged at the next
  `receive` call (or when the consumer closes), so the broker sends one message at a time.
- DUPS_OK: lazily, in batches (every DUPS_OK_BATCH messages, or when the consumer's buffer is
  empty); a crash may redeliver the last few.
- CLIENT: when the application calls `acknowledge()` (on the session or any message): every
  message the session has handed over so far is acknowledged.
- transacted: acknowledgements and sends join the session's transaction; `commit()` makes them
  take effect, `rollback()` undoes them (the acknowledged messages are delivered again).
"""

from __future__ import annotations

import enum
import logging
from typing import Final, Protocol

from sluiceway.client.link import Link
from sluiceway.client.message import Message
from sluiceway.errors import ConnectionClosedError, TransactionRolledBackError
from sluiceway.protocol.frames import Frame

log = logging.getLogger(__name__)

DUPS_OK_BATCH: Final = 16  # acknowledgements a DUPS_OK session may hold back


class AckMode(enum.Enum):
    AUTO = "auto"
    CLIENT = "client"
    DUPS_OK = "dups-ok"


class SessionConsumer(Protocol):
    """What a session asks of its consumers: how many messages they hold, and to close."""

    @property
    def buffered(self) -> int: ...

    async def close(self) -> None: ...


class SessionState:
    """A single-threaded context for producing and consuming: its acknowledgements, its
    transaction and its consumers."""

    def __init__(self, connection: Link, ack_mode: AckMode, *, transacted: bool) -> None:
        self.connection = connection
        self.ack_mode = ack_mode
        self.transacted = transacted
        self._consumers: list[SessionConsumer] = []
        # (consumer, connection generation, ack id) handed over and not yet acknowledged
        self._unacked: list[tuple[SessionConsumer, int, str]] = []
        self._transaction: str | None = None
        self._rolled_back: str | None = None  # why the open transaction was lost, if it was
        self.closed = False

    # -- acknowledging -------------------------------------------------------------------------

    def handed_over(self, consumer: SessionConsumer, message: Message, generation: int) -> None:
        """`message` reached the application: acknowledge it as the session's mode says."""
        if self.transacted:
            self._send_ack(message.ack_id, generation, self.transaction())
        elif self.ack_mode is AckMode.AUTO:
            self._send_ack(message.ack_id, generation, None)
        else:
            self._unacked.append((consumer, generation, message.ack_id))
            if self.ack_mode is AckMode.DUPS_OK and (
                len(self._unacked) >= DUPS_OK_BATCH or not consumer.buffered
            ):
                self._flush_acks()

    def _send_ack(self, ack_id: str, generation: int, transaction: str | None) -> None:
        if generation != self.connection.generation:
            return  # delivered before a reconnection: the broker sends it again anyway
        headers = {"id": ack_id}
        if transaction is not None:
            headers["transaction"] = transaction
        self.connection.send_nowait(Frame("ACK", headers))

    def _flush_acks(self) -> int:
        """Acknowledge every held-back message; return how many were lost to a reconnection."""
        pending, self._unacked = self._unacked, []
        stale = 0
        for _, generation, ack_id in pending:
            if generation == self.connection.generation:
                self._send_ack(ack_id, generation, None)
            else:
                stale += 1
        return stale

    async def acknowledge(self) -> None:
        """Acknowledge every message this session has handed over (CLIENT and DUPS_OK modes).

        Returns once the broker has processed the acknowledgements. Raises ConnectionClosedError
        if some messages were delivered before the connection was lost and reopened: the broker
        will deliver those again.
        """
        stale = self._flush_acks()
        await self._confirm()
        if stale:
            raise ConnectionClosedError(
                f"{stale} messages were delivered before the connection was lost; they could not "
                "be acknowledged and will be delivered again"
            )

    async def _confirm(self) -> None:
        """Wait until the broker has processed every frame written so far on this connection."""
        tx = self.connection.next_id("confirm")
        await self.connection.request(Frame("BEGIN", {"transaction": tx}))
        await self.connection.send(Frame("ABORT", {"transaction": tx}))

    def forget_consumer_acks(self, consumer: SessionConsumer) -> None:
        """A closed consumer's messages go back to the broker: do not acknowledge them."""
        self._unacked = [entry for entry in self._unacked if entry[0] is not consumer]

    async def recover(self) -> None:
        """Deliver again every message handed over and not acknowledged (JMS session.recover)."""
        pending, self._unacked = self._unacked, []
        for _, generation, ack_id in pending:
            if generation == self.connection.generation:
                await self.connection.send(Frame("NACK", {"id": ack_id}))

    # -- transactions --------------------------------------------------------------------------

    def transaction(self) -> str:
        """The open transaction's id, beginning one if needed (transacted sessions only)."""
        if not self.transacted:
            raise RuntimeError("this session is not transacted")
        if self._transaction is None:
            tx = self.connection.next_id("tx")
            if not self.connection.send_nowait(Frame("BEGIN", {"transaction": tx})):
                raise ConnectionClosedError("no connection to begin a transaction on")
            self._transaction = tx
        return self._transaction

    async def commit(self, timeout: float | None = None) -> None:
        """Make the transaction's sends and acknowledgements take effect."""
        self._check_rolled_back()
        if self._transaction is None:
            return  # nothing was done in this transaction
        tx, self._transaction = self._transaction, None
        try:
            await self.connection.request(Frame("COMMIT", {"transaction": tx}), timeout)
        except ConnectionClosedError as exc:
            raise TransactionRolledBackError(
                f"the connection was lost before the broker confirmed the commit of {tx}: {exc}"
            ) from exc

    async def rollback(self, timeout: float | None = None) -> None:
        """Undo the transaction: sends are dropped, acknowledged messages delivered again."""
        self._rolled_back = None
        if self._transaction is None:
            return
        tx, self._transaction = self._transaction, None
        await self.connection.request(Frame("ABORT", {"transaction": tx}), timeout)

    def _check_rolled_back(self) -> None:
        if self._rolled_back is not None:
            reason, self._rolled_back = self._rolled_back, None
            raise TransactionRolledBackError(reason)

    # -- lifecycle -----------------------------------------------------------------------------

    def connection_lost(self) -> None:
        """The broker aborts an open transaction when the connection goes."""
        if self._transaction is not None:
            self._rolled_back = (
                f"the connection was lost during transaction {self._transaction}; the broker "
                "rolled it back: its sends were dropped and its messages will be delivered again"
            )
            self._transaction = None

    def forget(self, consumer: SessionConsumer) -> None:
        if consumer in self._consumers:
            self._consumers.remove(consumer)

    async def close(self) -> None:
        """Close the consumers; roll back an open transaction; flush DUPS_OK acknowledgements."""
        if self.closed:
            return
        self.closed = True
        for consumer in list(self._consumers):
            await consumer.close()
        if self.transacted:
            await self.rollback()
        elif self.ack_mode is AckMode.DUPS_OK:
            self._flush_acks()
        self.connection.forget(self)
