"""A minimal STOMP 1.2 relay: the ceiling against which the broker's throughput is compared.

It carries the traffic of `sluiceway bench queue` from producers to consumers with the least
work a Python process can do: each SEND becomes one MESSAGE to one subscriber of its
destination (round robin), with the body's bytes moved untouched. Whatever the broker does
beyond that (storage, acknowledgement, flow-control accounting) is what the gap between the two
figures costs. It uses only the standard library and nothing of Sluiceway, so it stays an
independent yardstick.

    .venv/bin/python benchmarks/relay.py --port 61800
    .venv/bin/sluiceway bench queue --port 61800 --size 65536 --ack client-individual \
        --prefetch 100 --broker-pid 0

It prints `relay listening on HOST:PORT` once it listens (the port bound, so `--port 0` works)
and runs until SIGTERM or SIGINT.

Left out, on purpose: storage (a relay keeps no message once written to a socket), ACK and NACK
(accepted and ignored: there is nothing to acknowledge), prefetch and flow-control accounting,
selectors, transactions, topics (every destination is a queue), heart-beating (CONNECTED says
`heart-beat:0,0`) and authentication (login headers are ignored). Back-pressure is the only flow
control: a message with no writable subscriber waits, and while too many wait (`--waiting`
messages, or WAITING_BYTES, for every destination together) no producer is read. So the
`backlog` scenario, which fills a queue with no consumer, stalls here once that bound is reached.

Copies, per message: a large body (DIRECT_BODY_BYTES or more) is received straight into a
buffer of its own, with room left in front of it for the MESSAGE head, and written from there in
one write: in Python, only the part that came in the read of its head (HEAD_READ_BYTES at most)
is copied. A small body is copied once out of the receive buffer
and written in a batch with the other frames handled in the same read.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import signal
import sys
from collections import deque
from dataclasses import dataclass, field
from typing import Final, cast

SCRATCH_BYTES: Final = 256 * 1024  # one read of small frames (asyncio's own read size)
MIN_READ_BYTES: Final = 4096  # less room than this left in the receive buffer: compact it
HEAD_READ_BYTES: Final = 1024  # read size after a large body: the next head, little of its body
DIRECT_BODY_BYTES: Final = 16 * 1024  # bodies this long are received into a buffer of their own
MAX_FRAME_BYTES: Final = 64 * 2**20  # longest body accepted (STOMP 1.2 "Size Limits")
MAX_HEAD_BYTES: Final = 64 * 1024  # longest command line and headers
UNCONNECTED_BYTES: Final = 16 * 1024  # all a client may send before its CONNECT is answered
# Messages waiting for a writable subscriber, over every destination (a bound per destination
# would let a client use memory without limit by naming many destinations). Producers are read
# again once both counts are down to half. Either bound is checked once a message is added, so a
# body larger than WAITING_BYTES still passes, alone.
WAITING_MESSAGES: Final = 1000  # the default of --waiting
WAITING_BYTES: Final = 16 * 2**20  # 256 bodies of 64 KiB: slack enough, and RSS stays small
# Room in front of a large body for the MESSAGE head: its fixed text and two 20-digit ids take
# 117 bytes with an 8-digit content-length, plus the destination; a subscription id longer than
# what is left makes the head go in a write of its own.
HEAD_ROOM_BYTES: Final = 192
WRITE_HIGH_BYTES: Final = 64 * 1024  # a subscriber whose socket holds more is not written to

CONNECTED: Final = b"CONNECTED\nversion:1.2\nheart-beat:0,0\nserver:relay\n\n\0"
MESSAGE_HEAD: Final = (
    b"MESSAGE\nsubscription:%b\nmessage-id:%d\nack:%d\ndestination:%b\ncontent-length:%d\n\n"
)
ACK_MODES: Final = frozenset((b"auto", b"client", b"client-individual"))


class ProtocolError(Exception):
    """What the client sent is not STOMP 1.2 this relay understands: ERROR, then close."""


@dataclass(slots=True)
class Message:
    """A body and its NUL, at data[offset : offset + length + 1]. When `offset` is not 0, the
    bytes in front of it are free room for the MESSAGE head."""

    destination: bytes
    data: bytearray
    offset: int
    length: int


@dataclass(slots=True, eq=False)
class Subscription:
    connection: Connection
    id: bytes
    destination: Destination


@dataclass(slots=True, eq=False)
class Destination:
    """Subscribers of one destination, and its messages that no subscriber could take yet."""

    name: bytes
    subscribers: list[Subscription] = field(default_factory=list)
    turn: int = 0  # round robin: the subscriber tried first for the next message
    waiting: deque[Message] = field(default_factory=deque)

    def pick(self) -> Subscription | None:
        """The next subscriber in turn whose socket takes more, if any."""
        subscribers = self.subscribers
        count = len(subscribers)
        for _ in range(count):
            subscription = subscribers[self.turn % count]
            self.turn += 1
            if subscription.connection.writable:
                return subscription
        return None


class Relay:
    """Destinations, the messages waiting in them, and the producers held while too many wait."""

    def __init__(self, waiting_limit: int = WAITING_MESSAGES) -> None:
        self.waiting_limit = waiting_limit  # messages
        self.destinations: dict[bytes, Destination] = {}
        self.producers: set[Connection] = set()  # connections that sent a SEND
        self.connections: set[Connection] = set()
        self.dirty: list[Connection] = []  # connections with frames batched, not yet written
        self.waiting_messages = 0
        self.waiting_bytes = 0
        self.full = False  # too many messages wait: producers are not read
        self.last_id = 0

    def destination(self, name: bytes) -> Destination:
        found = self.destinations.get(name)
        if found is None:
            found = self.destinations[name] = Destination(name)
        return found

    def route(self, message: Message) -> None:
        """Hand `message` to a subscriber that can take it, or make it wait."""
        destination = self.destination(message.destination)
        subscription = None if destination.waiting else destination.pick()
        if subscription is not None:
            self.deliver(subscription, message)
            return
        destination.waiting.append(message)
        self.waiting_messages += 1
        self.waiting_bytes += message.length
        if not self.full and (
            self.waiting_messages >= self.waiting_limit or self.waiting_bytes >= WAITING_BYTES
        ):
            self.full = True
            for producer in self.producers:
                producer.hold()

    def drain(self, destination: Destination) -> None:
        """Give waiting messages to the subscribers that can take them."""
        waiting = destination.waiting
        while waiting and (subscription := destination.pick()) is not None:
            message = waiting.popleft()
            self.waiting_messages -= 1
            self.waiting_bytes -= message.length
            self.deliver(subscription, message)
        if not waiting and not destination.subscribers:
            self.destinations.pop(destination.name, None)
        if (
            self.full
            and self.waiting_messages <= self.waiting_limit // 2
            and self.waiting_bytes <= WAITING_BYTES // 2
        ):
            self.full = False
            for producer in list(self.producers):
                if self.full:
                    break  # what a released producer sent filled it again: the rest stay held
                producer.release()

    def deliver(self, subscription: Subscription, message: Message) -> None:
        self.last_id += 1
        head = MESSAGE_HEAD % (
            subscription.id,
            self.last_id,
            self.last_id,
            message.destination,
            message.length,
        )
        subscription.connection.send_message(head, message)

    def flush(self) -> None:
        """Write what each connection has batched (one write per connection)."""
        dirty = self.dirty
        while dirty:
            dirty.pop().flush()


class Connection(asyncio.BufferedProtocol):
    """One client. Frames are parsed from `scratch`, except a large body, which is received
    straight into its message's own buffer (`body`)."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.transport = cast(asyncio.Transport, None)  # set by connection_made
        self.connected = False
        self.closing = False
        self.held = False  # not read while too many messages wait
        self.parsing = False
        self.writable = True
        self.subscriptions: dict[bytes, Subscription] = {}
        self.batch: list[bytes | bytearray | memoryview] = []
        self.batch_bytes = 0
        # Limits before CONNECT; raised once it is answered.
        self.base_size = UNCONNECTED_BYTES
        self.head_limit = UNCONNECTED_BYTES
        self.frame_limit = UNCONNECTED_BYTES
        self.scratch = bytearray(UNCONNECTED_BYTES)
        self.start = 0  # first byte of scratch not parsed yet
        self.fill = 0  # end of the bytes received into scratch
        self.nul_free = 0  # bytes from `start` known to hold no NUL (a body without length)
        self.short_reads = False  # the last body was large: read heads in small reads
        self.body: Message | None = None  # the large body being received, with its frame's
        self.body_frame: tuple[bytes, dict[bytes, bytes]] = (b"", {})  # command and headers
        self.body_view = memoryview(b"")
        self.body_got = 0

    # -- asyncio callbacks -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=WRITE_HIGH_BYTES)
        self.relay.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.leave()
        self.relay.connections.discard(self)
        self.batch.clear()
        self.body = None

    def pause_writing(self) -> None:
        self.writable = False

    def resume_writing(self) -> None:
        self.writable = True
        for subscription in list(self.subscriptions.values()):
            self.relay.drain(subscription.destination)
        self.relay.flush()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.body is not None:
            return self.body_view[self.body_got :]
        if len(self.scratch) - self.fill < MIN_READ_BYTES or len(self.scratch) < self.base_size:
            self.make_room()
        end = len(self.scratch)
        if self.short_reads:
            end = min(end, self.fill + HEAD_READ_BYTES)
        return memoryview(self.scratch)[self.fill : end]

    def buffer_updated(self, nbytes: int) -> None:
        try:
            if self.body is None:
                self.fill += nbytes
            else:
                self.body_got += nbytes
                if self.body_got < len(self.body_view):
                    return
                self.finish_body()
            self.parse()
        except ProtocolError as exc:
            self.fail(str(exc))
        self.relay.flush()

    def eof_received(self) -> bool:
        return False  # close: a relay has nothing to say to a client that stopped sending

    # -- reading ---------------------------------------------------------------------------------

    def make_room(self) -> None:
        """Move the unparsed bytes to the front of a receive buffer with room for a read."""
        live = self.fill - self.start
        size = self.base_size
        while live + MIN_READ_BYTES > size:
            size *= 2  # only a body without content-length grows it (up to frame_limit)
        old = self.scratch
        if size != len(old):
            self.scratch = bytearray(size)
        self.scratch[:live] = old[self.start : self.fill]
        self.start, self.fill = 0, live

    def parse(self) -> None:
        """Handle every whole frame received, unless held (or closing)."""
        if self.parsing:
            return  # a frame being handled released this connection: the loop below goes on
        self.parsing = True
        try:
            while not (self.held or self.closing or self.body is not None) and self.next_frame():
                pass
        finally:
            self.parsing = False
        if self.start == self.fill:
            self.start = self.fill = 0
            if len(self.scratch) > self.base_size:
                self.scratch = bytearray(self.base_size)

    def next_frame(self) -> bool:
        """Handle the next frame in scratch, or begin receiving its large body. False: more
        bytes are needed."""
        buf, start, fill = self.scratch, self.start, self.fill
        while start < fill and buf[start] in b"\r\n":
            start += 1  # heart-beats, and the EOLs allowed after a frame's NUL
        self.start = start
        end, body_start = self.head_end()
        if end < 0:
            return False
        command, headers = parse_head(bytes(memoryview(buf)[start:end]))
        raw_length = headers.get(b"content-length")
        if raw_length is None:
            nul = buf.find(b"\0", max(body_start, start + self.nul_free), fill)
            if nul < 0:
                if fill - start > self.frame_limit:
                    raise ProtocolError(f"frame longer than {self.frame_limit} bytes")
                self.nul_free = fill - start  # not searched again as more arrives
                return False
            self.nul_free = 0
            length = nul - body_start
        else:
            length = self.content_length(raw_length)
            if fill - body_start <= length:
                if length < DIRECT_BODY_BYTES:
                    return False  # a small body: scratch has room for the rest
                self.begin_body(command, headers, body_start, length)
                return True
            if buf[body_start + length] != 0:
                raise ProtocolError("the body is not followed by a NUL (check content-length)")
        self.start = body_start + length + 1
        self.short_reads = length >= DIRECT_BODY_BYTES
        message = None
        if command == b"SEND":  # the only body kept: copied once out of scratch, with its NUL
            body = buf[body_start : self.start]
            message = Message(headers.get(b"destination", b""), body, 0, length)
        self.handle(command, headers, message)
        return True

    def head_end(self) -> tuple[int, int]:
        """Where the frame's headers end (the blank line) and its body begins; -1, -1 when
        they have not all arrived."""
        buf, start, fill = self.scratch, self.start, self.fill
        limit = min(fill, start + self.head_limit)
        end = buf.find(b"\n\n", start, limit)
        crlf = buf.find(b"\n\r\n", start, limit if end < 0 else end)
        if crlf >= 0:
            return crlf, crlf + 3
        if end >= 0:
            return end, end + 2
        if fill - start >= self.head_limit:
            raise ProtocolError(f"command and headers longer than {self.head_limit} bytes")
        return -1, -1

    def content_length(self, raw: bytes) -> int:
        if not raw.isdigit():
            raise ProtocolError("content-length is not a decimal number")
        length = int(raw)
        if length > self.frame_limit:
            raise ProtocolError(f"content-length above the limit of {self.frame_limit} bytes")
        return length

    def begin_body(
        self, command: bytes, headers: dict[bytes, bytes], body_start: int, length: int
    ) -> None:
        """Receive the rest of a large body straight into its message's buffer, after the part
        already in scratch; room is left in front of it for the MESSAGE head."""
        destination = headers.get(b"destination", b"")
        room = HEAD_ROOM_BYTES + len(destination)
        data = bytearray(room + length + 1)
        got = self.fill - body_start
        data[room : room + got] = memoryview(self.scratch)[body_start : self.fill]
        self.body = Message(destination, data, room, length)
        self.body_frame = (command, headers)
        self.body_view = memoryview(data)[room:]
        self.body_got = got
        self.start = self.fill = 0

    def finish_body(self) -> None:
        message = self.body
        assert message is not None
        self.body = None
        self.body_view = memoryview(b"")
        self.short_reads = True
        if message.data[message.offset + message.length] != 0:
            raise ProtocolError("the body is not followed by a NUL (check content-length)")
        command, headers = self.body_frame
        self.handle(command, headers, message if command == b"SEND" else None)

    def hold(self) -> None:
        """Stop reading: too many messages wait."""
        if not self.held and not self.closing:
            self.held = True
            self.transport.pause_reading()

    def release(self) -> None:
        """Read again: handle what was received while held, then read on."""
        if self.held and not self.closing:
            self.held = False
            try:
                self.parse()
            except ProtocolError as exc:
                self.fail(str(exc))
            if not self.held and not self.closing:
                self.transport.resume_reading()

    # -- frames ----------------------------------------------------------------------------------

    def handle(self, command: bytes, headers: dict[bytes, bytes], message: Message | None) -> None:
        if command == b"SEND":
            self.on_send(headers, message)
        elif not self.connected:
            if command not in (b"CONNECT", b"STOMP"):
                raise ProtocolError(f"expected CONNECT, got {command.decode(errors='replace')}")
            self.on_connect(headers)
        elif command in (b"ACK", b"NACK"):
            self.receipt(headers)  # nothing kept, nothing to acknowledge
        elif command == b"SUBSCRIBE":
            self.on_subscribe(headers)
        elif command == b"UNSUBSCRIBE":
            self.receipt(headers)
            subscription = self.subscriptions.pop(headers.get(b"id", b""), None)
            if subscription is not None:
                self.unsubscribe(subscription)
        elif command == b"DISCONNECT":
            self.receipt(headers)
            self.close()
        elif command in (b"CONNECT", b"STOMP"):
            raise ProtocolError("already connected")
        else:
            raise ProtocolError(f"{command.decode(errors='replace')} is not supported here")

    def on_connect(self, headers: dict[bytes, bytes]) -> None:
        versions = headers.get(b"accept-version", b"1.0").split(b",")
        if b"1.2" not in versions:
            raise ProtocolError("this relay speaks STOMP 1.2 only (accept-version:1.2)")
        self.connected = True
        self.base_size = SCRATCH_BYTES
        self.head_limit = MAX_HEAD_BYTES
        self.frame_limit = MAX_FRAME_BYTES
        self.queue(CONNECTED)

    def on_send(self, headers: dict[bytes, bytes], message: Message | None) -> None:
        if not self.connected:
            raise ProtocolError("expected CONNECT, got SEND")
        if message is None or not message.destination:
            raise ProtocolError("SEND without a destination header")
        if b"transaction" in headers:
            raise ProtocolError("transactions are not supported here")
        self.receipt(headers)
        relay = self.relay
        if self not in relay.producers:
            relay.producers.add(self)
            if relay.full:
                self.hold()
        relay.route(message)

    def on_subscribe(self, headers: dict[bytes, bytes]) -> None:
        sub_id, name = headers.get(b"id"), headers.get(b"destination")
        if not sub_id or not name:
            raise ProtocolError("SUBSCRIBE needs an id and a destination header")
        if headers.get(b"ack", b"auto") not in ACK_MODES:
            raise ProtocolError("ack must be auto, client or client-individual")
        if sub_id in self.subscriptions:
            raise ProtocolError("this subscription id is already in use")
        self.receipt(headers)  # before any MESSAGE: a client may wait for it first
        destination = self.relay.destination(name)
        subscription = Subscription(self, sub_id, destination)
        self.subscriptions[sub_id] = subscription
        destination.subscribers.append(subscription)
        self.relay.drain(destination)

    def receipt(self, headers: dict[bytes, bytes]) -> None:
        receipt = headers.get(b"receipt")
        if receipt is not None:
            self.queue(b"RECEIPT\nreceipt-id:%b\n\n\0" % receipt)

    def unsubscribe(self, subscription: Subscription) -> None:
        destination = subscription.destination
        destination.subscribers.remove(subscription)
        if not destination.subscribers and not destination.waiting:
            self.relay.destinations.pop(destination.name, None)

    def leave(self) -> None:
        """Take this connection out of the relay: no more messages to it, not held."""
        for subscription in self.subscriptions.values():
            self.unsubscribe(subscription)
        self.subscriptions.clear()
        self.relay.producers.discard(self)

    def fail(self, reason: str) -> None:
        """ERROR, then close (what was batched before goes first)."""
        if self.closing:
            return
        text = reason.encode()
        self.queue(
            b"ERROR\ncontent-type:text/plain\nmessage:%b\ncontent-length:%d\n\n%b\0"
            % (escape(text), len(text), text)
        )
        self.close()

    def close(self) -> None:
        self.closing = True
        self.leave()
        self.flush()
        self.transport.close()

    # -- writing ---------------------------------------------------------------------------------

    def queue(self, frame: bytes | bytearray | memoryview) -> None:
        """Add to the batch written at the end of the read being handled (or once it is full)."""
        if not self.batch:
            self.relay.dirty.append(self)
        self.batch.append(frame)
        self.batch_bytes += len(frame)
        if self.batch_bytes >= SCRATCH_BYTES:
            self.flush()

    def flush(self) -> None:
        batch = self.batch
        if batch and not self.transport.is_closing():
            self.transport.write(b"".join(batch) if len(batch) > 1 else batch[0])
        batch.clear()
        self.batch_bytes = 0

    def send_message(self, head: bytes, message: Message) -> None:
        data, offset, end = message.data, message.offset, message.offset + message.length + 1
        if not offset:  # a small body, alone in its buffer
            self.queue(head)
            self.queue(data)
            return
        front = offset - len(head)
        if front < 0:  # a long subscription id: no room for the head in front of the body
            self.queue(head)
            self.queue(memoryview(data)[offset:end])
            return
        # A large body: its head written into the room in front of it, and both in one write.
        # Measured for 64 KiB bodies on this 2-core machine (writer CPU per message, median of
        # 7 runs of 20,000 over loopback TCP, buffer allocation included): this 15.4 us, two
        # writes (head, then body) 16.4 us, one write of head + body joined (a copy) 17.2 us.
        # Receiving heads in small reads (HEAD_READ_BYTES) mattered more: with full reads, a
        # body is copied out of scratch, and the relay used about 150 us of CPU per message in
        # `sluiceway bench queue` instead of about 95. The buffer is never written to again,
        # so a transport that keeps a view of what it could not send yet, instead of a copy,
        # is safe too.
        data[front:offset] = head
        self.flush()  # what was batched before goes first
        self.transport.write(memoryview(data)[front:end])


def escape(value: bytes) -> bytes:
    """A header value escaped as STOMP 1.2 requires."""
    for raw, escaped in ((b"\\", b"\\\\"), (b"\r", b"\\r"), (b"\n", b"\\n"), (b":", b"\\c")):
        value = value.replace(raw, escaped)
    return value


def parse_head(head: bytes) -> tuple[bytes, dict[bytes, bytes]]:
    """Command and headers (raw, still escaped: they are only compared and echoed; the first
    of a repeated header counts)."""
    lines = head.split(b"\n")
    if b"\r" in head:
        lines = [line[:-1] if line.endswith(b"\r") else line for line in lines]
    command = lines[0]
    if not (command.isalpha() and command.isupper()):
        raise ProtocolError("a frame must begin with a command in upper-case letters")
    try:
        # Built from the last line to the first, so that the first of a repeated header wins.
        pairs = [line.split(b":", 1) for line in reversed(lines[1:])]
        headers = dict(cast(list[tuple[bytes, bytes]], pairs))
    except ValueError:
        raise ProtocolError("a header line without a colon") from None
    return command, headers


async def serve(host: str, port: int, waiting_limit: int) -> None:
    relay = Relay(waiting_limit)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Connection(relay), host, port)
    bound = server.sockets[0].getsockname()
    print(f"relay listening on {bound[0]}:{bound[1]}", flush=True)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with server:
        await stop.wait()
        server.close()
        for connection in list(relay.connections):
            connection.transport.abort()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, required=True, help="port to listen on (0: any)")
    parser.add_argument(
        "--waiting",
        type=int,
        default=WAITING_MESSAGES,
        metavar="N",
        help=f"messages that may wait for a subscriber before producers are held "
        f"(default {WAITING_MESSAGES})",
    )
    args = parser.parse_args(argv)
    # As the broker does: what is loaded at start is left out of the cycle collector's view, and
    # the youngest generation is collected every 20,000 allocations rather than 700.
    gc.freeze()
    gc.set_threshold(20_000, 10, 10)
    try:
        asyncio.run(serve(args.host, args.port, max(1, args.waiting)))
    except OSError as exc:
        print(f"relay: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
