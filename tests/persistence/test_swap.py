"""A backlog far larger than the memory threshold: it goes to the swap area, not to memory."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from sluiceway.testing import BrokerProcess
from tests.e2e.rawclient import RawClient

MESSAGES = 120_000
BODY = b"x" * 1024
# Held in memory, this backlog would take about MESSAGES x (1 KiB + 400 bytes of objects)
# = 170 MB; with a 4 MiB threshold the broker must stay far below that.
RSS_LIMIT = 110 * 1024 * 1024


def rss(pid: int) -> int:
    """Resident set size of a process, in bytes (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc status")


class RssSampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.05):
            try:
                self.peak = max(self.peak, rss(self.pid))
            except FileNotFoundError:
                return  # the process ended


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_backlog_larger_than_memory_is_swapped_and_delivered_in_order(tmp_path: Path) -> None:
    # The backlog is larger than the auto-created default of maxNumMsgs (100,000) and the
    # server throttling threshold (as large, but this producer has no consumer to wait for).
    options = (
        *("-D", "imq.swap.threshold=4m"),
        *("-D", "imq.autocreate.destination.maxNumMsgs=-1"),
        *("-D", "imq.throttling.server.threshold=0"),
    )
    with BrokerProcess(*options, data_dir=str(tmp_path)) as broker:
        sampler = RssSampler(broker.process.pid)
        sampler.start()
        producer = RawClient(broker.port, timeout=30)
        producer.connect()
        for i in range(MESSAGES):
            producer.send("SEND", {"destination": "/queue/backlog"}, b"%d " % i + BODY)
        producer.sync()  # every message has been taken in
        backlog_peak = sampler.peak
        assert any((tmp_path / "swap").iterdir())  # the backlog went to disk

        consumer = RawClient(broker.port, timeout=30)
        consumer.connect()
        consumer.subscribe("/queue/backlog", ack="auto")
        received = 0
        while received < MESSAGES:
            batch = consumer.receive(min(1000, MESSAGES - received))
            for message in batch:
                assert message.body.startswith(b"%d " % received)  # in order, none missing
                received += 1
        sampler.stopped.set()
        producer.close()
        consumer.close()
    assert backlog_peak < RSS_LIMIT, f"peak RSS {backlog_peak / 2**20:.0f} MiB while filling"
    assert sampler.peak < RSS_LIMIT, f"peak RSS {sampler.peak / 2**20:.0f} MiB while draining"
