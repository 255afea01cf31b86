"""A RECEIPT confirms everything its connection sent before it, durably.

STOMP clients send persistent messages without receipts and then DISCONNECT (or any frame) with
one, to learn that everything before it arrived. Under the group and always sync policies the
broker sends that RECEIPT only once the records of every earlier frame are on disk, so a power
cut right after cannot lose them. (It used to wait only for what the receipted frame itself
wrote: a DISCONNECT's receipt went out at once, and a power cut then lost the SENDs before it.)
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from sluiceway.persist.simulated import SimulatedDisk
from tests.persistence.conftest import StartNode


@pytest.mark.parametrize("policy", ["group", "always"])
@pytest.mark.parametrize("last", ["DISCONNECT", "SUBSCRIBE", "BEGIN"])
def test_a_receipt_waits_for_the_records_of_the_frames_before_it(
    tmp_path: Path, start_node: StartNode, policy: str, last: str
) -> None:
    disk = SimulatedDisk()
    properties = {"imq.persist.file.sync.policy": policy}
    node = start_node(tmp_path, disk, properties)
    link = node.connect("producer")
    link.take()
    for body in (b"one", b"two"):
        link.send("SEND", {"destination": "/queue/q", "persistent": "true"}, body)
    headers = {"DISCONNECT": {}, "SUBSCRIBE": {"destination": "/queue/other", "id": "s"}}
    link.send(last, {**headers.get(last, {"transaction": "t"}), "receipt": "r"})
    if policy == "group":
        assert link.take() == []  # not before the SENDs are on disk
        node.sync()
    assert [f.command for f in link.take()] == ["RECEIPT"]
    node.abandon()
    disk.crash(random.Random(3), power=True)
    node = start_node(tmp_path, disk, properties)
    assert sum(node.recovery.messages.values()) == 2
