"""benchmarks/relay.py, the minimal STOMP relay the broker is compared with: real processes.

`sluiceway bench queue` must run against it unchanged; raw sockets check what it sends, that it
refuses what it does not understand, and that a consumer that stops reading holds the producers.
Speed is never asserted.
"""

from __future__ import annotations

import contextlib
import json
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluiceway.cli.main import main

pytestmark = pytest.mark.timeout(120)

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "relay.py"
WAIT = 30.0  # seconds for anything the relay is to do: start, answer, close, exit
CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\n\n\0"


@contextlib.contextmanager
def running_relay(*args: str) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """The relay on a port of its own (`--port 0`), stopped however the block ends."""
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], WAIT)
        line = process.stdout.readline() if ready else ""
        assert line.startswith("relay listening on 127.0.0.1:"), line or "no ready line"
        yield process, int(line.rsplit(":", 1)[1])
    finally:
        if process.poll() is None:
            process.terminate()
        try:
            process.wait(WAIT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture(scope="module")
def relay_port() -> Iterator[int]:
    with running_relay() as (_, port):
        yield port


def bench(port: int, tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "result.json"
    status = main(
        ["bench", "queue", "--port", str(port), "--broker-pid", "0", "--timeout", "5",
         "--json", str(out), *args]
    )  # fmt: skip
    return status, json.loads(out.read_text())


def test_the_bench_carries_large_bodies_acknowledged_one_by_one(
    relay_port: int, tmp_path: Path
) -> None:
    status, result = bench(
        relay_port, tmp_path, "--messages", "2000", "--size", "65536",
        "--ack", "client-individual", "--prefetch", "100",
    )  # fmt: skip
    assert status == 0, result["errors"]
    assert (result["sent"], result["received"]) == (2000, 2000)
    assert (result["missing"], result["duplicated"], result["unexpected"]) == (0, 0, 0)


def test_the_bench_carries_small_bodies_between_two_producers_and_two_consumers(
    relay_port: int, tmp_path: Path
) -> None:
    status, result = bench(
        relay_port, tmp_path, "--messages", "2000", "--size", "128", "--ack", "auto",
        "--producers", "2", "--consumers", "2", "--destination", "/queue/two",
    )  # fmt: skip
    assert status == 0, result["errors"]
    assert (result["sent"], result["received"]) == (2000, 2000)
    assert (result["missing"], result["duplicated"], result["unexpected"]) == (0, 0, 0)
    # Round robin (a consumer whose socket is full is passed over): both get messages.
    assert all(c["received"] > 0 for c in result["consumers"])


class Raw:
    """A STOMP client on a blocking socket, for what the bench does not send or check."""

    def __init__(self, port: int, receive_buffer: int = 0) -> None:
        self.sock = socket.socket()
        if receive_buffer:  # set before connecting, so the kernel does not grow it
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(WAIT)
        self.sock.connect(("127.0.0.1", port))
        self.buf = bytearray()

    def connect(self) -> None:
        self.sock.sendall(CONNECT)
        command, headers, _ = self.frame()
        assert (command, headers) == (b"CONNECTED", {b"version": b"1.2", b"heart-beat": b"0,0",
                                                      b"server": b"relay"})  # fmt: skip

    def frame(self) -> tuple[bytes, dict[bytes, bytes], bytes]:
        """The next frame: command, headers (first of each name), body."""
        while True:
            while self.buf[:1] == b"\n":
                del self.buf[:1]
            end = self.buf.find(b"\n\n")
            if end >= 0:
                command, *lines = bytes(self.buf[:end]).split(b"\n")
                headers: dict[bytes, bytes] = {}
                for line in lines:
                    name, _, value = line.partition(b":")
                    headers.setdefault(name, value)
                start = end + 2
                if b"content-length" in headers:
                    stop = start + int(headers[b"content-length"])
                else:
                    stop = self.buf.find(b"\0", start)
                if 0 <= stop < len(self.buf):
                    assert self.buf[stop] == 0
                    body = bytes(self.buf[start:stop])
                    del self.buf[: stop + 1]
                    return command, headers, body
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise EOFError("the relay closed the connection")
            self.buf += chunk

    def closed(self) -> bool:
        """Everything up to the end of the stream has been read, and the stream ended (a reset
        too: the relay closes with what it did not read still in its socket)."""
        with contextlib.suppress(ConnectionResetError):
            while chunk := self.sock.recv(1 << 16):
                self.buf += chunk
        return True

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def clients() -> Iterator[list[Raw]]:
    opened: list[Raw] = []
    yield opened
    for client in opened:
        client.close()


def test_messages_wait_for_a_subscriber_and_arrive_with_the_headers_the_bench_reads(
    relay_port: int, clients: list[Raw]
) -> None:
    producer, consumer = Raw(relay_port), Raw(relay_port)
    clients += [producer, consumer]
    large = bytes(range(256)) * 400  # 102,400 bytes: received straight into its own buffer
    # All in one write, CONNECT included; with heart-beats (EOLs) between frames, and lines
    # ended by CRLF in one of them.
    producer.sock.sendall(
        CONNECT + b"\n"
        b"SEND\ndestination:/queue/wait\ncontent-length:3\n\na\0b\0\r\n"
        b"SEND\r\ndestination:/queue/wait\r\n\r\nno length\0"
        b"SEND\ndestination:/queue/wait\ncontent-length:%d\nreceipt:r1\n\n%b\0"
        % (len(large), large)
    )
    assert producer.frame()[0] == b"CONNECTED"
    assert producer.frame() == (b"RECEIPT", {b"receipt-id": b"r1"}, b"")
    consumer.connect()
    consumer.sock.sendall(
        b"SUBSCRIBE\nid:s\\c1\ndestination:/queue/wait\nack:client-individual\nreceipt:sub\n\n\0"
    )
    assert consumer.frame()[:2] == (b"RECEIPT", {b"receipt-id": b"sub"})  # before any MESSAGE
    ids = set()
    for body in (b"a\0b", b"no length", large):
        command, headers, received = consumer.frame()
        assert command == b"MESSAGE"
        assert received == body
        assert headers[b"subscription"] == b"s\\c1"  # echoed as sent: still escaped
        assert headers[b"destination"] == b"/queue/wait"
        assert headers[b"content-length"] == str(len(body)).encode()
        assert headers[b"ack"] == headers[b"message-id"]
        ids.add(headers[b"message-id"])
    assert len(ids) == 3
    consumer.sock.sendall(b"ACK\nid:%b\nreceipt:a\n\n\0DISCONNECT\nreceipt:bye\n\n\0" % ids.pop())
    assert consumer.frame()[:2] == (b"RECEIPT", {b"receipt-id": b"a"})
    assert consumer.frame()[:2] == (b"RECEIPT", {b"receipt-id": b"bye"})
    assert consumer.closed()


@pytest.mark.parametrize(
    ("connected", "data"),
    [
        (False, b"SEND\ndestination:/queue/a\n\nbefore CONNECT\0"),
        (False, b"CONNECT\naccept-version:1.0\n\n\0"),
        (False, b"CONNECT\n" + b"x:" + b"y" * 20_000),  # no end of headers within the limit
        (True, b"NOT A COMMAND\n\n\0"),
        (True, b"BEGIN\ntransaction:t\n\n\0"),
        (True, b"SEND\ndestination:/queue/a\nno colon here\n\n\0"),
        (True, b"SEND\ndestination:/queue/a\ncontent-length:2\n\nabc\0"),
        (True, b"SEND\ndestination:/queue/a\ncontent-length:-2\n\n\0"),
        (True, b"SUBSCRIBE\ndestination:/queue/a\n\n\0"),
    ],
)
def test_what_it_does_not_understand_gets_an_error_then_the_connection_closes(
    relay_port: int, clients: list[Raw], connected: bool, data: bytes
) -> None:
    client = Raw(relay_port)
    clients.append(client)
    if connected:
        client.connect()
    with contextlib.suppress(ConnectionResetError, BrokenPipeError):  # it may close first
        client.sock.sendall(data)
    command, headers, body = client.frame()
    assert command == b"ERROR"
    assert headers[b"message"]
    assert body
    assert client.closed()
    assert not client.buf  # nothing after the ERROR


def test_a_consumer_that_stops_reading_holds_the_producers_and_loses_nothing(
    clients: list[Raw],
) -> None:
    with running_relay("--waiting", "8") as (process, port):
        consumer, producer = Raw(port, receive_buffer=64 * 1024), Raw(port)
        clients += [consumer, producer]
        producer.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        consumer.connect()
        consumer.sock.sendall(b"SUBSCRIBE\nid:0\ndestination:/queue/held\nreceipt:s\n\n\0")
        assert consumer.frame()[0] == b"RECEIPT"
        producer.connect()

        def send(seq: int) -> bytes:
            body = b"%08d" % seq + b"x" * (65536 - 8)
            return b"SEND\ndestination:/queue/held\ncontent-length:65536\n\n%b\0" % body

        # The consumer reads nothing: the relay must stop reading the producer long before
        # 2,000 messages (131 MB), with what the kernel buffers and 8 messages waiting.
        limit, seq, partial = 2000, 0, memoryview(send(0))
        producer.sock.settimeout(2.0)
        with contextlib.suppress(TimeoutError):
            while seq < limit:
                partial = partial[producer.sock.send(partial) :]
                if not partial:
                    seq += 1
                    partial = memoryview(send(seq))
        assert seq < limit, "the producer was never held"
        assert resident_bytes(process.pid) < 64 * 2**20

        # Once the consumer reads, the producer goes on: every message arrives once, in order.
        total = seq + 20
        failures: list[BaseException] = []

        def finish() -> None:
            try:
                producer.sock.settimeout(WAIT)
                producer.sock.sendall(partial)
                for later in range(seq + 1, total):
                    producer.sock.sendall(send(later))
            except BaseException as exc:
                failures.append(exc)

        sender = threading.Thread(target=finish, daemon=True)
        sender.start()
        try:
            for expected in range(total):
                command, _, body = consumer.frame()
                assert (command, body[:8]) == (b"MESSAGE", b"%08d" % expected)
        finally:
            sender.join(WAIT)
        assert not failures
        process.send_signal(signal.SIGTERM)
        assert process.wait(WAIT) == 0


def resident_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def test_sigterm_ends_it_with_status_0() -> None:
    with running_relay() as (process, port):
        client = Raw(port)
        try:
            client.connect()
            process.send_signal(signal.SIGTERM)
            assert process.wait(WAIT) == 0
            assert client.closed()
        finally:
            client.close()
