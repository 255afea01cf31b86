"""Failover of the pipeline connection: trying an operation again, elsewhere, within a deadline.

Every pipeline operation is idempotent (pipelines-protocol.md), so one that fails because the
connection was lost, a connect failed, the broker did not answer in time, or the broker refused
it with status 503 (Unavailable: what it asks for lives on a cluster member that failed and is
being taken over, or a lease is being adopted) can be tried again. With `settings.failover`
seconds (0: off), each attempt closes the broken connection, pauses (the retry policy's `pause`,
growing by `backoff` up to `max_pause`, never past the deadline), and connects again: first to
the `member-address` a 503 refusal named, then to the addresses in order, the first that
answers. The deadline counts from the first failure since the operation last made progress; an
attempt started before it may end up to one timeout after it. Then the last error is raised,
its class kept, saying how long the client tried, where, and why it failed last.

With `failover` 0, a request that finds an idle connection lost is tried once more at once,
and nothing else is retried.

Reads go on where they were interrupted: a range read from the sequence number after the last
message yielded; a lease read by reading the lease again (it holds the same messages in the
same order) and skipping what was yielded, once the message at the position of the last one
yielded is found to be the same.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Final, Protocol, TypeVar

from sluiceway.client.pipeline_packs import MessagePack
from sluiceway.client.pipeline_values import (
    EndMarker,
    LeaseState,
    PipelineMessage,
    PipelineSettings,
)
from sluiceway.errors import (
    BrokerError,
    ConnectFailedError,
    ConnectionClosedError,
    OperationTimeoutError,
    RemoteProtocolError,
    Unavailable,
)

log = logging.getLogger("sluiceway.client.pipeline")

T = TypeVar("T")
E = TypeVar("E", bound=Exception)

Address = tuple[str, int]

# What failover tries again after: the connection is gone or useless, or the broker asks to be
# asked again (elsewhere) later. Any other refusal (404, 409, 410...) is an answer.
RECOVERABLE: Final = (ConnectionClosedError, OperationTimeoutError, ConnectFailedError, Unavailable)
# What the single retry of an idle connection's request covers when failover is off.
_LOST: Final = (ConnectionClosedError, OperationTimeoutError)
# The shortest wait for a TCP connect near the deadline: the last attempt gets a fair chance.
CONNECT_FLOOR: Final = 1.0  # seconds


class Link(Protocol):
    """What failover needs of a connection: its settings, closing, connecting to one address."""

    settings: PipelineSettings
    last_address: Address | None  # the broker it last connected to (kept after closing)

    @property
    def connected(self) -> bool: ...

    def close(self) -> None: ...

    def connect_to(self, address: Address, timeout: float) -> None: ...


def recoverable(error: BaseException) -> bool:
    """Whether failover tries again after `error`."""
    return isinstance(error, RECOVERABLE)


def restated(error: E, text: str) -> E:
    """An error of the same class saying `text`; a broker's refusal keeps its summary and its
    headers (destination, limit, member)."""
    if not isinstance(error, BrokerError):
        return type(error)(text)
    return type(error)(
        error.summary,
        text,
        destination=error.destination,
        limit=error.limit,
        limit_value=error.limit_value,
        member=error.member,
        member_address=error.member_address,
    )


def parse_address(text: str | None) -> Address | None:
    """`host:port` (an IPv6 host in brackets) as an address; None when absent or malformed."""
    if not text:
        return None
    host, _, port = text.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        log.debug("ignoring a malformed member-address %r", text)
        return None
    return host, int(port)


def _name(address: Address) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _cause(error: BaseException) -> str:
    if not isinstance(error, BrokerError):
        return str(error)
    status = f"status {int(error.status)} ({error.summary})"
    return status if str(error) == error.summary else f"{status}: {error}"


class Failover:
    """The attempts of one operation: whether to go on after an error, and connecting anew."""

    def __init__(self, link: Link, what: str) -> None:
        self.link = link
        self.what = what  # e.g. "ACK of lease g/7 of /queue/orders", for logs and errors
        self.settings = link.settings
        self._idle_retry = link.connected  # failover off: an idle connection's one retry
        self._since: float | None = None  # monotonic time of the first failure not yet overcome
        self._pause = self.settings.retry.pause
        self._tried: dict[str, None] = {}  # addresses, in the order first tried
        self._last: Exception | None = None

    def progressed(self) -> None:
        """The operation went on (a message was read): a later failure has a deadline of its
        own, and starts with the shortest pause again."""
        self._since = None
        self._pause = self.settings.retry.pause
        self._tried.clear()

    def recover(self, error: Exception) -> bool:
        """After `error`: True once connected anew for the next attempt; False when `error` is
        not one to try again after (the caller raises it). Raises the last error, restated,
        when the deadline has passed."""
        if self.settings.failover <= 0:
            return self._retry_idle(error)
        if not recoverable(error):
            return False
        if self._since is None:
            self._since = time.monotonic()
        self._note(error)
        self.link.close()
        if self._remaining() <= 0:
            raise self._gave_up() from error
        order = self._order(parse_address(getattr(error, "member_address", None)))
        log.info(
            "%s failed (%s); failing over to %s",
            self.what,
            _cause(error),
            ", ".join(_name(a) for a in order),
        )
        policy = self.settings.retry
        while (remaining := self._remaining()) > 0:
            time.sleep(min(self._pause, remaining))
            self._pause = min(self._pause * policy.backoff, policy.max_pause)
            if self._reconnect(order):
                return True
        raise self._gave_up() from self._last

    def _retry_idle(self, error: Exception) -> bool:
        if not (self._idle_retry and isinstance(error, _LOST)):
            return False
        self._idle_retry = False
        log.info("pipeline connection lost while idle; retrying %s once", self.what)
        return True

    def _note(self, error: Exception) -> None:
        self._last = error
        if isinstance(error, ConnectFailedError):  # the operation's own connect: every target
            self._tried.update((_name(a), None) for a in self.settings.targets)
        elif self.link.last_address is not None:
            self._tried[_name(self.link.last_address)] = None

    def _order(self, preferred: Address | None) -> list[Address]:
        """The member a refusal named first, then the addresses in order."""
        targets = list(self.settings.targets)
        if preferred is None:
            return targets
        return [preferred, *(a for a in targets if a != preferred)]

    def _remaining(self) -> float:
        assert self._since is not None
        return self._since + self.settings.failover - time.monotonic()

    def _reconnect(self, order: list[Address]) -> bool:
        """Connect to the first address of `order` that answers, within the deadline (the
        first is always tried); False when none did."""
        for index, address in enumerate(order):
            remaining = self._remaining()
            if remaining <= 0 and index:
                break
            self._tried[_name(address)] = None
            timeout = min(self.settings.timeout, max(remaining, CONNECT_FLOOR))
            try:
                self.link.connect_to(address, timeout)
            except RECOVERABLE as exc:
                self._last = exc
                log.debug("%s: connecting to %s failed: %s", self.what, _name(address), exc)
                continue
            return True
        return False

    def _gave_up(self) -> Exception:
        last = self._last
        assert last is not None
        assert self._since is not None
        waited = time.monotonic() - self._since
        tried = ", ".join(self._tried) or "no broker"
        return restated(
            last,
            f"{self.what} failed: gave up after failing over for {waited:.1f} s (failover "
            f"deadline {self.settings.failover:g} s), having tried {tried}; the last error: "
            f"{_cause(last)}",
        )


def with_failover(link: Link, what: str, attempt: Callable[[], T]) -> T:
    """`attempt()`, tried again as `Failover` says."""
    failover = Failover(link, what)
    while True:
        try:
            return attempt()
        except RECOVERABLE as exc:
            if not failover.recover(exc):
                raise


# -- reads that go on where they were interrupted ----------------------------------------------


class Resume:
    """How an interrupted read goes on: the headers of the next attempt, and which of its
    messages are new. The base reads the same again and takes everything."""

    def __init__(self, headers: dict[str, str], what: str) -> None:
        self.original = headers
        self.what = what

    def headers(self) -> dict[str, str]:
        return self.original

    def restart(self) -> None:
        """An attempt starts."""

    def admit(self, message: PipelineMessage) -> bool:
        """Whether `message` is new (to yield); it is one of this attempt's, in order."""
        return True

    def admit_pack(self, pack: MessagePack) -> MessagePack | None:
        """The part of `pack` that is new (None: none of it), as `admit` would say message by
        message (what is new of a read is always its last part)."""
        first = None
        for index in range(pack.count):
            if self.admit(pack.message(index)) and first is None:
                first = index
        return None if first is None else pack.tail(first)

    def check_end(self, end: EndMarker) -> None:
        """The attempt's end marker came: raise when it contradicts what was yielded."""


class RangeResume(Resume):
    """A range read goes on from the sequence number after the last message yielded."""

    def __init__(self, headers: dict[str, str], what: str) -> None:
        super().__init__(headers, what)
        self._next: int | None = None

    def headers(self) -> dict[str, str]:
        if self._next is None:
            return self.original
        return {**self.original, "from-sequence": str(self._next)}

    def admit(self, message: PipelineMessage) -> bool:
        self._next = message.sequence + 1
        return True

    def admit_pack(self, pack: MessagePack) -> MessagePack | None:
        if pack.count:
            self._next = pack.pack.sequences[-1] + 1
        return pack


class LeaseResume(Resume):
    """A lease read again returns the same messages in the same order: skip those yielded,
    after checking that the last one yielded is where it was."""

    def __init__(self, headers: dict[str, str], what: str) -> None:
        super().__init__(headers, what)
        self._yielded = 0
        self._last_id: str | None = None  # message-id of the last message yielded
        self._seen = 0  # messages of the current attempt so far

    def restart(self) -> None:
        self._seen = 0

    def admit(self, message: PipelineMessage) -> bool:
        self._seen += 1
        message_id = message.headers.get("message-id")
        if self._seen < self._yielded:
            return False
        if self._seen == self._yielded:
            if message_id != self._last_id:
                raise self._changed(f"message {self._seen} is {message_id}, not {self._last_id}")
            return False
        self._yielded += 1
        self._last_id = message_id
        return True

    def admit_pack(self, pack: MessagePack) -> MessagePack | None:
        count = pack.count
        if self._seen >= self._yielded and count:  # all new: no message to look at
            self._seen += count
            self._yielded += count
            self._last_id = pack.pack.message_id(count - 1)
            return pack
        first = None
        for index in range(count):
            self._seen += 1
            if self._seen < self._yielded:
                continue
            message_id = pack.pack.message_id(index)
            if self._seen == self._yielded:
                if message_id != self._last_id:
                    raise self._changed(
                        f"message {self._seen} is {message_id}, not {self._last_id}"
                    )
                continue
            if first is None:
                first = index
            self._yielded += 1
            self._last_id = message_id
        return None if first is None else pack.tail(first)

    def check_end(self, end: EndMarker) -> None:
        # A lease that expired (or was acknowledged) meanwhile holds no messages any more: the
        # end marker says so, and the caller decides.
        if self._seen < self._yielded and end.lease_state is LeaseState.OPEN:
            raise self._changed(f"it holds {self._seen} messages, {self._yielded} were read")

    def _changed(self, how: str) -> RemoteProtocolError:
        return RemoteProtocolError(
            f"{self.what}: the lease came back with other messages when read again after a "
            f"failover ({how}); a lease must return the same messages in the same order"
        )


def resumed_read(
    link: Link,
    read: Callable[[dict[str, str]], Iterator[PipelineMessage | MessagePack | EndMarker]],
    resume: Resume,
) -> Iterator[PipelineMessage | MessagePack | EndMarker]:
    """The items of `read(headers)`, its end marker last, read again as `resume` says after a
    failure that failover recovers from."""
    failover = Failover(link, resume.what)
    while True:
        resume.restart()
        try:
            for item in read(resume.headers()):
                if isinstance(item, EndMarker):
                    resume.check_end(item)
                    yield item
                    return
                if isinstance(item, MessagePack):
                    kept = resume.admit_pack(item)
                    if kept is not None:
                        failover.progressed()
                        yield kept
                elif resume.admit(item):
                    failover.progressed()
                    yield item
        except RECOVERABLE as exc:
            if not failover.recover(exc):
                raise
        else:
            return  # (a read always ends with its end marker)
