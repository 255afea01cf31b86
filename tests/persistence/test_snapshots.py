"""The upkeep reclaims only what is dead on disk: the state a new segment restates (sequence
numbers, durable subscriptions, cursors, leases, stages) survives the upkeep deleting what it
replaces and a rotation a crash cut short, and what a cursor's commit released goes only once
the commit is on disk.

Each new segment starts with snapshot records restating the state older segments recorded, which
then die and are reclaimed. Found by the store's model (test_store_model.py): the snapshots were
only handed to the operating system, so a power cut right after the upkeep deleted the old
segments lost the state; and a rotation torn after its first snapshot made recovery take the
older records of the snapshots not written for dead too.
"""

from __future__ import annotations

import random
from pathlib import Path

from sluiceway.persist.format import RecordType
from sluiceway.persist.simulated import SimulatedDisk
from tests.persistence.conftest import StartNode
from tests.persistence.inprocess import Link, Node

PROPERTIES = {"imq.persist.file.sync.policy": "group", "imq.persist.file.segment.size": "1k"}


def request(
    node: Node, link: Link, command: str, headers: dict[str, str], body: bytes = b""
) -> None:
    link.send(command, {**headers, "receipt": "r"}, body)
    node.sync()
    assert [f.command for f in link.take() if f.command != "MESSAGE"] == ["RECEIPT"]


def stage_one(node: Node) -> Link:
    link = node.connect("producer")
    link.take()
    headers = {"destination": "/queue/q", "stage": "k/1/0.0", "persistent": "true"}
    request(node, link, "SEND", headers, b"staged")
    return link


def published(node: Node) -> list[bytes]:
    """Commit batch 1 of sink k, then browse the queue."""
    link = node.connect("observer")
    link.take()
    headers = {"transaction": "stage", "stage": "k/1", "stage-tasks": "0.0"}
    request(node, link, "COMMIT", headers)
    link.send("SUBSCRIBE", {"destination": "/queue/q", "id": "b", "browser": "true"})
    return [f.body for f in link.take() if f.command == "MESSAGE" and f.body]


def test_a_snapshot_is_on_disk_before_the_records_it_replaces_are_reclaimed(
    tmp_path: Path, start_node: StartNode
) -> None:
    disk = SimulatedDisk()
    node = start_node(tmp_path, disk, PROPERTIES)
    stage_one(node)  # its STAGE_OPEN is state, restated by each new segment's STAGE_SNAPSHOT
    for _ in range(3):
        node.store.compact()  # rotate (snapshots written), then reclaim what they replace
    kinds = [RecordType(r.type) for r in node.journal.scan()]
    assert RecordType.STAGE_ADD in kinds
    assert RecordType.STAGE_OPEN not in kinds  # compacted away: the snapshots restate it
    node.abandon()
    disk.crash(random.Random(1), power=True)  # nothing synced since the last compaction
    node = start_node(tmp_path, disk, PROPERTIES)
    assert published(node) == [b"staged"]


def test_a_rotation_cut_short_keeps_the_older_state_it_did_not_restate(
    tmp_path: Path, start_node: StartNode
) -> None:
    disk = SimulatedDisk()
    properties = {**PROPERTIES, "imq.persist.file.segment.size": "2m"}
    node = start_node(tmp_path, disk, properties)
    link = stage_one(node)  # segment A: its STAGE_OPEN, and the staged message
    link.send("SUBSCRIBE", {"destination": "/queue/gone", "id": "s", "ack": "auto"})
    for i in range(1200):  # segment A, mostly dead: worth compacting
        link.send("SEND", {"destination": "/queue/gone", "persistent": "true"}, b"%1024d" % i)
    node.store.rotate()  # segment B restates the stage (its STAGE_SNAPSHOT)
    node.store.rotate()  # segment C restates it again: cut short below
    segments = [s.base_lsn for s in node.journal.segments()]
    snapshots = [r for r in node.journal.scan() if r.position.segment == segments[-1]]
    assert [RecordType(r.type) for r in snapshots][-1] is RecordType.STAGE_SNAPSHOT
    node.abandon()
    disk.crash(random.Random(2), power=False)
    segment = node.journal.segment_path(segments[-1])
    disk.cut(segment, snapshots[-1].position.offset + 5)  # C's STAGE_SNAPSHOT torn
    node = start_node(tmp_path, disk, properties)
    assert node.journal.report.torn  # (what recovery cut)
    assert node.store.maintain() == (0, 1)  # A compacted (its STAGE_OPEN dropped); B kept
    node.stop()
    node = start_node(tmp_path, disk, properties)
    assert published(node) == [b"staged"]


def read_cursor(node: Node, link: Link) -> tuple[int, list[bytes]]:
    """The cursor's position and the messages it reads."""
    headers = {"destination": "/topic/t", "id": "c", "browser": "true", "cursor": "g"}
    link.send("SUBSCRIBE", {**headers, "cursor-start": "earliest", "receipt": "read"})
    node.sync()
    frames = [f for f in link.take() if f.command == "MESSAGE"]
    link.send("UNSUBSCRIBE", {"id": "c"})
    return int(frames[-1].headers["cursor-sequence"]), [f.body for f in frames[:-1]]


class OnlySynced(random.Random):
    """A power cut that keeps nothing but what was fsynced."""

    def randint(self, a: int, b: int) -> int:
        return a


def test_the_upkeep_deletes_what_a_cursor_released_only_once_its_commit_is_on_disk(
    tmp_path: Path, start_node: StartNode
) -> None:
    disk = SimulatedDisk()
    node = start_node(tmp_path, disk, PROPERTIES)
    link = node.connect("reader")
    link.take()
    assert read_cursor(node, link) == (1, [])
    for i in range(8):  # the first segment: messages the cursor keeps
        request(node, link, "SEND", {"destination": "/topic/t", "persistent": "true"}, b"%200d" % i)
    node.store.rotate()
    link.send("ACK", {"id": "cursor", "destination": "/topic/t", "cursor": "g", "sequence": "9"})
    node.tick()  # (not synced: the commit waits in the page cache, its RECEIPT with it)
    node.abandon()
    disk.crash(OnlySynced(), power=True)
    node = start_node(tmp_path, disk, PROPERTIES)
    link = node.connect("reader")
    link.take()
    position, read = read_cursor(node, link)
    # The commit reached the disk, or the messages it released are all still there.
    assert (position, read) == (9, []) or (position == 1 and len(read) == 8), (position, read)


def test_the_upkeep_goes_on_when_a_full_disk_refuses_a_segment_copy(
    tmp_path: Path, start_node: StartNode
) -> None:
    """Emptying a dead segment that is not the oldest writes a small copy of it; a full disk
    refuses it. The upkeep leaves that segment for next time instead of failing."""
    disk = SimulatedDisk()
    node = start_node(tmp_path, disk, PROPERTIES)
    link = node.connect("producer")
    link.take()
    request(node, link, "SEND", {"destination": "/queue/kept", "persistent": "true"}, b"kept")
    node.store.rotate()  # the first segment stays: it holds a live message
    link.send("SUBSCRIBE", {"destination": "/queue/gone", "id": "s", "ack": "auto"})
    for i in range(8):  # the second segment: all of it consumed
        request(
            node, link, "SEND", {"destination": "/queue/gone", "persistent": "true"}, b"%99d" % i
        )
    node.store.rotate()
    middle = node.journal.segments()[1].base_lsn
    disk.capacity = disk.used()
    assert node.store.maintain() == (0, 0)  # (the copy was refused: nothing reclaimed)
    disk.capacity = None
    assert node.store.maintain() == (1, 0)
    assert middle not in [s.base_lsn for s in node.journal.segments() if s.size > 24]
