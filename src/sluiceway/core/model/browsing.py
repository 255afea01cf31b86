"""Browsers: subscriptions that read a queue's pending messages or a topic's log by range,
without consuming them (a SUBSCRIBE with `browser:true`, or a cursor or lease read)."""

from __future__ import annotations

from collections.abc import Callable

from sluiceway.core.containers.pending import PRIORITY_LEVELS
from sluiceway.core.model.queue import Queue
from sluiceway.core.model.subscription import AckMode, Delivery, Subscription
from sluiceway.core.model.topic import Topic
from sluiceway.core.values.flow import UNLIMITED_STAGING, destination_window
from sluiceway.core.values.message import Message
from sluiceway.protocol.frames import DELIVERY_HEADERS
from sluiceway.protocol.pack import PACK_BYTES, pack_messages

# Headers a packed message does not carry as its own: they are columns, or the frame's.
_NOT_OWN = DELIVERY_HEADERS | {"lease"}


class _Browser(Subscription):
    """What queue and topic browsers share: a sequence range, the end marker, no consuming.

    The end marker is one message with the headers `browser:end`, `next-sequence` (the sequence
    number after the last message the browse returned: where a following read starts),
    `head-sequence` (the last sequence number the destination has handed out), `first-sequence`
    (the oldest one it retains; head-sequence+1 when it retains none), `message-count` (the
    messages waiting in it) and `consumer-flow-limit` (its effective consumerFlowLimit), then
    whatever `end_extra` adds (a topic cursor's position).

    With `pack` above 0 (a SUBSCRIBE's `pack:N`), the messages go out `pack` at a time in one
    MESSAGE each (protocol.pack), with `pack-count` and `pack_extra`'s headers; each pack takes
    one of the window's credits.
    """

    __slots__ = (
        "_done",
        "_from",
        "_last",
        "_packed",
        "_packed_bytes",
        "_to",
        "end_extra",
        "pack",
        "pack_extra",
    )

    def _setup(self) -> None:
        assert self.ack_mode is AckMode.AUTO
        self._done = False
        self._from = 0  # first sequence number wanted
        self._to: int | None = None  # first sequence number not wanted
        self._last = 0  # last sequence number returned
        self.end_extra: Callable[[], list[tuple[str, str]]] | None = None
        self.pack = 0  # messages per MESSAGE frame; 0: one each, as usual
        self.pack_extra: tuple[tuple[str, str], ...] = ()
        self._packed: list[Message] = []  # the next pack's messages
        self._packed_bytes = 0

    def set_range(self, start: int, end: int | None) -> None:
        self._from, self._to = start, end

    def in_range(self, message: Message) -> bool:
        return message.seq >= self._from and (self._to is None or message.seq < self._to)

    @property
    def empty_range(self) -> bool:
        """`to-sequence` at or below `from-sequence`: only the end marker is wanted."""
        return self._to is not None and self._to <= self._from

    def ready(self) -> bool:
        # A browse consumes nothing: it goes on while the destination's consumers are paused
        # (`pause dst`, or a takeover adopting into it), which no resume would wake it from.
        return self.has_room()

    def _room(self) -> int:
        room = self.window.credit if self.window.limit > 0 else UNLIMITED_STAGING
        return room * self.pack if self.pack else room

    def retained(self) -> tuple[int | None, int]:
        """The oldest sequence number the destination retains (None: none), and how many
        messages wait in it."""
        raise NotImplementedError

    def end_headers(self) -> list[tuple[str, str]]:
        head = self.destination.last_seq
        first, count = self.retained()
        limit = destination_window(self.destination.settings.consumer_flow_limit)
        headers = [
            ("browser", "end"),
            ("next-sequence", str(max(self._last + 1, self._from))),
            ("head-sequence", str(head)),
            ("first-sequence", str(first if first is not None else head + 1)),
            ("message-count", str(count)),
            ("consumer-flow-limit", str(limit)),
        ]
        if self.end_extra is not None:
            headers.extend(self.end_extra())
        return headers

    def _finish(self) -> None:
        self.flush_pack()
        self._done = True
        self.stage(
            Message(
                id=f"{self.destination.name.name}-browser-end-{self.number}",
                destination=self.destination.name,
                body=b"",
                headers=tuple(self.end_headers()),
                priority=0,
                expires=0,
                persistent=False,
                timestamp=self.connection.clock.time_ms(),
            )
        )

    def stage_seen(self, message: Message) -> None:
        self._last = max(self._last, message.seq)
        if not self.pack:
            self.stage(message)
            return
        packed = self._packed
        packed.append(message)
        self._packed_bytes += len(message.body)
        if len(packed) >= self.pack or self._packed_bytes >= PACK_BYTES:
            self.flush_pack()

    def flush_pack(self) -> None:
        """Stage the messages packed so far as one MESSAGE (the fills call it after each run
        of messages, so a pack never waits for more)."""
        packed = self._packed
        if not packed:
            return
        self._packed, self._packed_bytes = [], 0
        self.stage(
            Message(
                id=f"{self.destination.name.name}-pack-{self.number}-{self._last}",
                destination=self.destination.name,
                body=pack_messages(packed, _NOT_OWN),
                headers=(("pack-count", str(len(packed))), *self.pack_extra),
                priority=0,
                expires=0,
                persistent=False,
                timestamp=self.connection.clock.time_ms(),
            )
        )

    def write(self, message: Message) -> Delivery:
        # Browsing consumes nothing: the window is released as the message is written.
        self.destination.context.ledger.let_go(message)
        self.release(1)
        return Delivery(self, message, message.delivery_count)

    def written(self, messages: list[Message]) -> None:
        pass  # released by `write` already

    def return_to_source(self, messages: list[Message], *, delivered: bool) -> None:
        pass  # the messages never left their destination

    def detach(self) -> None:
        pass  # a browser is not one of the destination's consumers


class BrowserSubscription(_Browser):
    """A queue browser: the queue's messages in delivery order, without consuming them.

    A cursor (priority, sequence number) walks the queue's pending list, so browsing holds no copy
    of the backlog; messages that arrive behind the cursor while browsing are seen, ones that
    arrive ahead of it are not (JMS allows a browser either view).
    """

    __slots__ = ("_cursor", "queue")

    def _setup(self) -> None:
        super()._setup()
        assert isinstance(self.destination, Queue)
        self.queue = self.destination
        self._cursor = (PRIORITY_LEVELS, 0)  # before the first message

    def refill(self) -> None:
        self.fill()

    def retained(self) -> tuple[int | None, int]:
        # Delivered and leased messages have left the pending list: they do not count.
        pending = self.queue.pending
        return pending.first_seq, len(pending)

    def fill(self) -> None:
        now = self.connection.clock.time_ms()
        while not self._done and self.ready():
            batch = (
                [] if self.empty_range else self.queue.pending.following(self._cursor, self._room())
            )
            if not batch:
                self._finish()
                return
            for message in batch:
                self._cursor = (message.priority, message.seq)
                if not message.expired(now) and self.in_range(message) and self.accepts(message):
                    self.stage_seen(message)
            self.flush_pack()


class TopicBrowserSubscription(_Browser):
    """Reads a topic's log (what it retains for durable subscriptions) by sequence number."""

    __slots__ = ("_next", "topic")

    def _setup(self) -> None:
        super()._setup()
        assert isinstance(self.destination, Topic)
        self.topic = self.destination
        self._next = 0

    def set_range(self, start: int, end: int | None) -> None:
        super().set_range(start, end)
        self._next = start

    def refill(self) -> None:
        self.fill()

    def retained(self) -> tuple[int | None, int]:
        log = self.topic.log
        return log.first_seq, len(log)

    def fill(self) -> None:
        now = self.connection.clock.time_ms()
        while not self._done and self.ready():
            batch = self.topic.log.read(self._next, self._room(), self._to)
            if not batch:
                self._finish()
                return
            for message in batch:
                self._next = message.seq + 1
                if not message.expired(now) and self.accepts(message):
                    self.stage_seen(message)
            self.flush_pack()
