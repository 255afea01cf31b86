"""Clients stalled inside large frames cost the broker its input budget, no more, and the memory
comes back when they close: measured on a broker process (its resident memory) with the
defaults (imq.stomp.input.total.max_bytes a quarter of the 160 MiB imq.memory.budget: 40 MiB;
imq.stomp.input.max_bytes 16 MiB; 8 KiB before CONNECT).

Without the budget, four connections stalled in 57 MB CONNECT bodies took a broker from 46 to
264 MiB, and six stalled in 60 MB SEND bodies to 390 MiB, which stayed after they closed.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from functools import partial

import pytest

from sluiceway.protocol.codec import FrameDecoder
from sluiceway.protocol.frames import Frame
from sluiceway.testing import BrokerProcess
from tests.admin.adminhttp import AdminHttp
from tests.e2e.support import wait_until
from tests.persistence.test_swap import RssSampler, rss

MIB = 1024 * 1024
TOTAL = 40 * MIB  # the default imq.stomp.input.total.max_bytes
STALL = 12 * MIB  # under imq.stomp.input.max_bytes: three such fit in the total
# What a stalled byte may cost beyond itself: the buffer's growth, the one read in flight.
PEAK_GROWTH = TOTAL + 48 * MIB
KEPT_GROWTH = 24 * MIB  # after every stalled connection closed


def gauge(broker: BrokerProcess) -> int:
    status, body, _ = AdminHttp(broker.admin_port).raw("GET", "/metrics")
    assert status == 200
    for line in body.decode().splitlines():
        if line.startswith("sluiceway_input_buffered_bytes "):
            return int(float(line.split()[1]))
    raise AssertionError("no sluiceway_input_buffered_bytes in /metrics")


def gauge_reads(broker: BrokerProcess, expected: int) -> bool:
    return gauge(broker) == expected


def error_status(sock: socket.socket) -> str:
    """The status of the ERROR the broker sends before it closes."""
    received = bytearray()
    while chunk := sock.recv(65536):
        received += chunk
    decoder = FrameDecoder()
    decoder.receive_data(bytes(received[received.find(b"ERROR") :]))
    error = decoder.next_event()
    assert isinstance(error, Frame), bytes(received[:200])
    return error.headers["status"]


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    yield opened
    for sock in opened:
        sock.close()


def open_socket(port: int, opened: list[socket.socket]) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30.0)
    opened.append(sock)
    return sock


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_stalled_frames_cost_the_budget_and_the_memory_comes_back(
    sockets: list[socket.socket],
) -> None:
    with BrokerProcess() as broker:
        pid = broker.process.pid
        baseline = rss(pid)
        sampler = RssSampler(pid)
        sampler.start()
        try:
            # Not authenticated yet: 57 MB CONNECT bodies, refused after 8 KiB each.
            for _ in range(4):
                sock = open_socket(broker.port, sockets)
                sock.sendall(b"CONNECT\naccept-version:1.2\ncontent-length:57000000\n\n")
                sock.sendall(b"x" * (57_000_000 // 8))  # read and dropped by the broker
                assert error_status(sock) == "423"
            assert gauge(broker) == 0

            # Connected: SEND bodies meant to run 60 MB to their NUL, each stalled after 12 MiB.
            # Three fit in the total; each of the others takes the broker past it and is refused.
            head = b"SEND\ndestination:/queue/big\n\n"
            statuses = []
            stalled: list[socket.socket] = []
            for _ in range(6):
                sock = open_socket(broker.port, sockets)
                sock.sendall(b"CONNECT\naccept-version:1.2\n\n\0")
                sock.sendall(head + b"x" * STALL)
                if len(stalled) < 3:
                    stalled.append(sock)
                    held = len(stalled) * (len(head) + STALL)
                    wait_until(partial(gauge_reads, broker, held), 30.0)
                else:
                    statuses.append(error_status(sock))
            assert statuses == ["414"] * 3
            assert gauge(broker) <= TOTAL
            peak = sampler.peak - baseline
            assert peak < PEAK_GROWTH, f"RSS grew by {peak / MIB:.0f} MiB while they stalled"

            for sock in stalled:
                sock.close()
            wait_until(lambda: gauge(broker) == 0, 30.0)
            kept = rss(pid) - baseline
            assert kept < KEPT_GROWTH, f"RSS still {kept / MIB:.0f} MiB up after they closed"
        finally:
            sampler.stopped.set()
