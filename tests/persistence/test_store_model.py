"""The broker's store against a model, over long random histories with crashes anywhere.

A Hypothesis state machine drives an in-process broker (tests/persistence/inprocess.py: the real
session, core, journal and recovery) on a simulated disk with segments of a few KiB: persistent
and non-persistent SENDs to queues and to a topic with durable subscriptions (priorities,
expiry), consumers acknowledging one by one, cumulatively, automatically or not at all, NACKs,
transactions (BEGIN, SEND, ACK, COMMIT, ABORT), durable subscriptions created, detached and
removed, queue leases, a topic cursor and stages (pipeline_model.py), the broker's
once-a-second upkeep (segment rotation, deletion, compaction, expiry), `compact dst`,
group-commit fsync rounds, clean restarts, process crashes, power cuts, crashes in the middle of
an operation (a flush, a rotation, a compaction, recovery itself) and failed fsyncs. After every
restart, what the broker holds must be what its clients were told it holds (ledger.py): every
confirmed message there exactly once, nothing acknowledged back, nothing that was never sent, a
COMMIT whole or not at all, sequence numbers never handed out twice.

`./dev soak` runs it with many more examples (tests/soak.py).
"""

from __future__ import annotations

import errno
import itertools
import random
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from sluiceway.app.storage import StorageError
from sluiceway.persist.files import Files
from sluiceway.persist.segments import JournalError
from sluiceway.persist.simulated import Fault, SimulatedCrash, SimulatedDisk
from sluiceway.protocol.frames import Frame
from sluiceway.testing import FakeClock
from tests.persistence.inprocess import Link, Node
from tests.persistence.ledger import KEPT, Ledger, Message, Op, Slot, Stop
from tests.persistence.pipeline_model import PipelineRules, PipelineState
from tests.persistence.store_observer import Observer
from tests.soak import iterations, soaking

QUEUES = ("/queue/q0", "/queue/q1")
TOPIC = "/topic/t0"
CLIENTS = 3
DURABLE_NAMES = ("d0", "d1")
ACK_MODES = ("client-individual", "client", "auto")
CLIENT = st.integers(0, CLIENTS - 1)
FIGURES: Counter[str] = Counter()  # what the runs did, printed under ./dev soak


class Medium(Protocol):
    """What the machine does to the medium under the journal (SimulatedDisk's controls)."""

    fault: Fault | None
    capacity: int | None

    def arm(self, operations: int, rng: random.Random) -> None: ...

    def disarm(self) -> None: ...

    def crash(self, rng: random.Random, *, power: bool) -> None: ...

    def used(self) -> int: ...


@dataclass
class Sub:
    """A subscription of one client, and what it was given and has not acknowledged."""

    sub_id: str
    where: str  # a queue, or a durable subscription's key
    ack: str
    unacked: list[tuple[str, Slot]] = field(default_factory=list)  # (ack id, slot), in order


@dataclass
class Tx:
    name: str
    sends: list[Message] = field(default_factory=list)
    acks: list[Slot] = field(default_factory=list)


@dataclass
class Client:
    number: int
    link: Link | None = None
    subs: dict[str, Sub] = field(default_factory=dict)
    txs: dict[str, Tx] = field(default_factory=dict)
    pending: dict[str, Op] = field(default_factory=dict)  # by receipt id
    # Ops sent since the last RECEIPT, in order: a RECEIPT confirms every one before it.
    unconfirmed: list[Op] = field(default_factory=list)

    @property
    def client_id(self) -> str:
        return f"app{self.number}"


def durable_key(client_id: str, name: str) -> str:
    return f"durable:{client_id}/{name}"


class StoreMachine(PipelineRules, RuleBasedStateMachine):
    SQUEEZABLE = True  # the medium can fill up (a disk can; a database's rows here cannot)

    def __init__(self) -> None:
        super().__init__()
        FIGURES["histories"] += 1
        self.root = Path(tempfile.mkdtemp(prefix="sluiceway-model-")).resolve()
        self.disk: Medium = SimulatedDisk()
        self.clock = FakeClock()
        self.ids = itertools.count()
        self.clients = [Client(n) for n in range(CLIENTS)]
        self.node: Node | None = None
        self.ledger = Ledger("group")
        self.pipeline = PipelineState()
        self.properties: dict[str, str] = {}
        # Durable subscriptions the broker has in memory: key -> the op that created it.
        self.durables: dict[str, Op] = {}
        self.durables_ever: set[str] = set()  # (observed at every restart)
        self.attached: set[str] = set()  # durable keys with a subscriber
        self.rng = random.Random(0)
        self.armed: bool | None = None  # an armed crash: whether it cuts the power
        self.failing = False  # an fsync was made to fail
        # The disk is nearly full: writes may fail (ENOSPC), persistent SENDs wait for room, and
        # what is handled meanwhile may be in memory only (so it may or may not survive a crash).
        self.squeezed = False
        self.was_squeezed = False  # (since the last restart)
        # Topic SENDs the broker may be holding for the disk: published when released, they
        # go to the durable subscriptions there are then.
        self.held_topic: list[tuple[Message, Op]] = []
        self.captured: list[Frame] = []  # frames of reads and receipts, for pipeline rules
        # Sequence numbers: the highest seen per destination, and as they were at the last
        # restart (a message made since must be above it, unless the power went).
        self.seqs: dict[str, int] = {}
        self.floor: dict[str, int] | None = {}
        self.epoch = 0

    # -- set-up and teardown -------------------------------------------------------------------

    @initialize(
        policy=st.sampled_from(["group", "always", "os"]),
        segment=st.sampled_from(["1k", "2k", "4k", "16k"]),
        swap=st.sampled_from(["0", "1k", "64k"]),
        seed=st.integers(0, 2**32 - 1),
    )
    def start(self, *, policy: str, segment: str, swap: str, seed: int) -> None:
        self.ledger = Ledger(policy)
        self.rng = random.Random(seed)
        self.properties = {
            "imq.persist.file.sync.policy": policy,
            "imq.persist.file.segment.size": segment,
            "imq.swap.threshold": swap,
            "imq.message.expiration.interval": "2",
            "imq.persist.file.disk.free.limit": "4k",
        }
        self.node = Node(self.root, self.files(), self.clock, self.properties)

    def files(self) -> Files:
        """The journal's files for the next broker life."""
        assert isinstance(self.disk, SimulatedDisk)
        return self.disk

    def teardown(self) -> None:
        if self.node is not None and self.node.running:
            self.node.abandon()
        shutil.rmtree(self.root, ignore_errors=True)

    @invariant()
    def count(self) -> None:
        FIGURES["steps"] += 1

    # -- running ops ---------------------------------------------------------------------------

    def live(self) -> Node:
        node = self.node
        assert node is not None
        assert node.running
        return node

    def link(self, client: Client) -> Link | None:
        """The client's connection, opened when it has none (None: a crash came meanwhile)."""
        if client.link is None or client.link.closed:
            self.forget_link(client)
            node = self.live()
            opened: list[Link] = []
            name, client_id = f"client{client.number}", client.client_id
            self.act(lambda: opened.append(node.connect(name, **{"client-id": client_id})))
            if not opened or not node.running:
                return None
            client.link = opened[0]
        return client.link

    def forget_link(self, client: Client) -> None:
        """The client's connection ended: its transactions are aborted, deliveries go back."""
        for sub in client.subs.values():
            self.attached.discard(sub.where)
        client.subs.clear()
        client.txs.clear()
        client.pending.clear()
        client.unconfirmed.clear()
        client.link = None

    def act(self, action: Callable[[], object], op: Op | None = None) -> None:
        """Run one step of the history; a crash or a failed journal inside it ends the run."""
        try:
            action()
        except SimulatedCrash:
            assert self.armed is not None
            self.interrupted()
            self.crashed(Stop.POWER if self.armed else Stop.PROCESS, "crash in the middle")
            return
        except JournalError:
            assert self.failing, "the journal failed though the disk did not"
            self.interrupted()
            self.crashed(Stop.POWER, "a failed fsync")
            return
        if op is not None and not self.uncertain:
            op.handled = True
        self.collect()

    @property
    def uncertain(self) -> bool:
        """What is handled now may be in memory only: the disk is nearly full (what waits for
        it is lost in a crash), or the journal stopped after a failed fsync."""
        node = self.node
        return self.squeezed or (node is not None and node.journal.failure is not None)

    def interrupted(self) -> None:
        """The broker stopped in the middle of a step: messages it was writing to an
        auto-acknowledging subscriber count as consumed once written to the journal, before
        they reach the client, so they may be gone though the client never got them."""
        for client in self.clients:
            for sub in client.subs.values():
                if sub.ack == "auto":
                    for slot in self.ledger.slots.values():
                        if slot.where == sub.where:
                            slot.taken_by.append(Op(f"being written to {sub.sub_id}"))

    def frame(
        self,
        client: Client,
        command: str,
        headers: dict[str, str],
        body: bytes = b"",
        *,
        op: Op | None = None,
        receipt: bool = True,
    ) -> None:
        link = self.link(client)
        if link is None:
            return
        headers = dict(headers)
        op = op or Op(command)
        if receipt:
            receipt_id = f"r{next(self.ids)}"
            headers["receipt"] = receipt_id
            client.pending[receipt_id] = op
        client.unconfirmed.append(op)
        self.act(lambda: link.send(command, headers, body), op)

    def collect(self) -> None:
        """Take every frame the broker wrote and apply it to the ledger."""
        for client in self.clients:
            link = client.link
            if link is None:
                continue
            for frame in link.take():
                self.received(client, frame)
            if link.closed:
                self.forget_link(client)

    def received(self, client: Client, frame: Frame) -> None:
        if frame.command == "RECEIPT":
            op = client.pending.pop(frame.headers["receipt-id"], None)
            if op is not None and op in client.unconfirmed:
                FIGURES["receipts"] += 1
                confirmed = client.unconfirmed.index(op) + 1
                for earlier in client.unconfirmed[:confirmed]:
                    # A receipt confirms everything before it, but a SEND still held.
                    if earlier is op or not earlier.holdable:
                        earlier.confirmed = True
                del client.unconfirmed[:confirmed]
            self.captured.append(frame)
        elif frame.command == "ERROR":
            op = client.pending.pop(frame.headers.get("receipt-id", ""), None)
            if op is not None:
                op.refused = True
            expected = self.failing or self.squeezed  # (a COMMIT, a held SEND: for the disk)
            assert expected, f"unexpected ERROR: {frame.headers} {frame.body!r}"
        elif frame.command == "MESSAGE":
            if frame.headers["subscription"] in client.subs:
                self.delivered(client, frame)
            else:
                self.captured.append(frame)  # a lease or cursor read

    def delivered(self, client: Client, frame: Frame) -> None:
        sub = client.subs[frame.headers["subscription"]]
        slot = self.ledger.slot(sub.where, frame.body)
        taken = [op for op in slot.taken_by if op.handled and not op.refused]
        assert not taken, f"{frame.body!r} delivered after {taken[0].what}"
        if slot.delivered:
            assert frame.headers["redelivered"] == "true", f"{frame.body!r} not redelivered"
        # (On a full disk the mark of a delivery may never be written: the message may come
        # back unmarked after a restart.)
        slot.delivered = slot.delivered or not self.uncertain
        FIGURES["deliveries"] += 1
        self.sequence_seen(frame.headers["destination"], int(frame.headers["sequence"]), slot)
        if sub.ack == "auto":
            op = Op(f"auto-acknowledged {frame.body!r}", handled=not self.uncertain)
            slot.taken_by.append(op)
        else:
            sub.unacked.append((frame.headers["ack"], slot))

    def sequence_seen(self, destination: str, sequence: int, slot: Slot | None) -> None:
        """Sequence numbers are never handed out twice, across restarts too."""
        floor = self.floor
        if slot is not None and slot.born == self.epoch and floor is not None:
            assert sequence > floor.get(destination, 0), (
                f"{slot.message.body!r} has sequence {sequence}, handed out before a restart"
            )
        self.seqs[destination] = max(self.seqs.get(destination, 0), sequence)

    # -- the pipeline rules' hooks -------------------------------------------------------------

    def pipeline_frame(
        self, client: int, command: str, headers: dict[str, str], op: Op | None, body: bytes
    ) -> list[Frame]:
        self.captured = []
        self.frame(self.clients[client], command, headers, body, op=op)
        frames, self.captured = self.captured, []
        owner = self.clients[client]
        sub_id = headers.get("id", "")
        if command == "SUBSCRIBE" and owner.link is not None and not owner.link.closed:
            self.frame(owner, "UNSUBSCRIBE", {"id": sub_id}, receipt=False)
        for frame in frames:
            if frame.command == "MESSAGE" and "sequence" in frame.headers:
                destination = frame.headers["destination"]
                slot = self.ledger.slots.get((destination, frame.body))
                self.sequence_seen(destination, int(frame.headers["sequence"]), slot)
        return frames

    def pipeline_message(self, pad: int, destination: str) -> Message:
        message, _, _ = self.new_message(destination, True, 4, False, pad)
        return message

    # -- producing -----------------------------------------------------------------------------

    def new_message(
        self, destination: str, persistent: bool, priority: int, expiring: bool, pad: int
    ) -> tuple[Message, dict[str, str], bytes]:
        body = b"m%06d" % next(self.ids) + b"." * pad
        message = Message(body, destination, persistent, priority, expiring)
        FIGURES["messages sent"] += 1
        self.ledger.messages[body] = message
        headers = {
            "destination": destination,
            "persistent": "true" if persistent else "false",
            "priority": str(priority),
        }
        if expiring:
            headers["expires"] = str(self.clock.time_ms() + 3000)
        return message, headers, body

    def keep(self, message: Message, made_by: Op) -> list[Slot]:
        """Where a message published now is kept: its queue, or each durable subscription."""
        if message.destination != TOPIC:
            return [self.ledger.add(Slot(message, message.destination, [made_by], born=self.epoch))]
        self.pipeline.sent_by[message.body] = made_by
        self.published_to_topic(message.body)
        return [
            self.ledger.add(Slot(message, key, [made_by, created], born=self.epoch))
            for key, created in self.durables.items()
        ]

    @rule(
        client=CLIENT,
        destination=st.sampled_from([*QUEUES, TOPIC]),
        persistent=st.sampled_from([True, True, True, False]),
        priority=st.sampled_from([0, 4, 4, 4, 9]),
        expiring=st.sampled_from([False, False, False, True]),
        count=st.integers(1, 8),
        pad=st.integers(0, 400),
        receipt=st.sampled_from([True, True, False]),
    )
    def send(
        self,
        *,
        client: int,
        destination: str,
        persistent: bool,
        priority: int,
        expiring: bool,
        count: int,
        pad: int,
        receipt: bool,
    ) -> None:
        # A SEND waits behind one the connection holds for the disk, persistent or not.
        behind = any(earlier.holdable for earlier in self.clients[client].unconfirmed)
        for _ in range(count):
            message, headers, body = self.new_message(
                destination, persistent, priority, expiring, pad
            )
            op = Op(f"SEND {body[:7]!r}", holdable=self.squeezed and (persistent or behind))
            self.keep(message, op)
            if op.holdable and destination == TOPIC:
                self.held_topic.append((message, op))
            self.frame(self.clients[client], "SEND", headers, body, op=op, receipt=receipt)

    # -- consuming -----------------------------------------------------------------------------

    @rule(
        client=CLIENT,
        queue=st.sampled_from(QUEUES),
        ack=st.sampled_from(ACK_MODES),
        limit=st.integers(1, 30),
    )
    def subscribe(self, *, client: int, queue: str, ack: str, limit: int) -> None:
        owner = self.clients[client]
        if self.link(owner) is None:
            return
        sub_id = f"s{next(self.ids)}"
        owner.subs[sub_id] = Sub(sub_id, queue, ack)
        headers = {"destination": queue, "id": sub_id, "ack": ack}
        headers["consumer-flow-limit"] = str(limit)
        self.frame(owner, "SUBSCRIBE", headers)

    @rule(client=CLIENT, name=st.sampled_from(DURABLE_NAMES), limit=st.integers(1, 30))
    def subscribe_durable(self, *, client: int, name: str, limit: int) -> None:
        owner = self.clients[client]
        key = durable_key(owner.client_id, name)
        if key in self.attached or self.link(owner) is None:
            return
        sub_id = f"s{next(self.ids)}"
        owner.subs[sub_id] = Sub(sub_id, key, "client-individual")
        self.attached.add(key)
        op = Op(f"SUBSCRIBE durable {key}")
        if key not in self.durables:  # created now (else attached)
            self.durables[key] = op
            for message, sent in self.held_topic:
                if (key, message.body) in self.ledger.slots:
                    continue  # (kept for an earlier one of that name: may or may not be still)
                held = Op("held until after the durable subscription was made")  # (maybe)
                self.ledger.add(Slot(message, key, [sent, op, held], born=self.epoch))
        self.durables_ever.add(key)
        headers = {
            "destination": TOPIC,
            "id": sub_id,
            "ack": "client-individual",
            "durable-subscription-name": name,
            "consumer-flow-limit": str(limit),
        }
        self.frame(owner, "SUBSCRIBE", headers, op=op)

    @rule(client=CLIENT, data=st.data())
    def unsubscribe(self, *, client: int, data: st.DataObject) -> None:
        owner = self.clients[client]
        if not owner.subs or owner.link is None:
            return
        sub = owner.subs.pop(data.draw(st.sampled_from(sorted(owner.subs))))
        self.attached.discard(sub.where)
        self.frame(owner, "UNSUBSCRIBE", {"id": sub.sub_id})

    @rule(client=CLIENT, name=st.sampled_from(DURABLE_NAMES))
    def remove_durable(self, *, client: int, name: str) -> None:
        owner = self.clients[client]
        key = durable_key(owner.client_id, name)
        if self.durables.pop(key, None) is None:
            return
        for sub_id in [s for s, sub in owner.subs.items() if sub.where == key]:
            del owner.subs[sub_id]
        self.attached.discard(key)
        op = Op(f"UNSUBSCRIBE durable {key}")
        for slot in self.ledger.slots.values():
            if slot.where == key:
                slot.taken_by.append(op)
        self.frame(owner, "UNSUBSCRIBE", {"durable-subscription-name": name}, op=op)

    def pick_unacked(self, owner: Client, data: st.DataObject) -> tuple[Sub, int] | None:
        subs = sorted(s for s, sub in owner.subs.items() if sub.unacked)
        if not subs or owner.link is None:
            return None
        sub = owner.subs[data.draw(st.sampled_from(subs))]
        return sub, data.draw(st.integers(0, len(sub.unacked) - 1))

    @staticmethod
    def covered(sub: Sub, index: int) -> list[Slot]:
        """The messages an ACK or NACK of the index-th unacknowledged one settles."""
        if sub.ack == "client":
            settled, sub.unacked = sub.unacked[: index + 1], sub.unacked[index + 1 :]
        else:
            settled = [sub.unacked.pop(index)]
        return [slot for _, slot in settled]

    @rule(client=CLIENT, nack=st.booleans(), data=st.data())
    def acknowledge(self, *, client: int, nack: bool, data: st.DataObject) -> None:
        owner = self.clients[client]
        picked = self.pick_unacked(owner, data)
        if picked is None:
            return
        sub, index = picked
        ack_id = sub.unacked[index][0]
        slots = self.covered(sub, index)
        op = Op(f"{'NACK' if nack else 'ACK'} {ack_id}")
        if not nack:
            for slot in slots:
                slot.taken_by.append(op)
        self.frame(owner, "NACK" if nack else "ACK", {"id": ack_id}, op=op)

    # -- transactions --------------------------------------------------------------------------

    @rule(client=CLIENT)
    def begin(self, *, client: int) -> None:
        owner = self.clients[client]
        name = f"tx{next(self.ids)}"
        if self.link(owner) is None:
            return
        owner.txs[name] = Tx(name)
        self.frame(owner, "BEGIN", {"transaction": name})

    @rule(
        client=CLIENT,
        destination=st.sampled_from([*QUEUES, TOPIC]),
        persistent=st.sampled_from([True, True, False]),
        count=st.integers(1, 4),
        pad=st.integers(0, 300),
        data=st.data(),
    )
    def send_in_transaction(
        self,
        *,
        client: int,
        destination: str,
        persistent: bool,
        count: int,
        pad: int,
        data: st.DataObject,
    ) -> None:
        owner = self.clients[client]
        if not owner.txs or owner.link is None:
            return
        tx = owner.txs[data.draw(st.sampled_from(sorted(owner.txs)))]
        for _ in range(count):
            if owner.link is None or tx.name not in owner.txs:
                return
            message, headers, body = self.new_message(destination, persistent, 4, False, pad)
            headers["transaction"] = tx.name
            tx.sends.append(message)
            self.frame(owner, "SEND", headers, body, receipt=False)

    @rule(client=CLIENT, data=st.data())
    def acknowledge_in_transaction(self, *, client: int, data: st.DataObject) -> None:
        owner = self.clients[client]
        picked = self.pick_unacked(owner, data)
        if picked is None or not owner.txs:
            return
        tx = owner.txs[data.draw(st.sampled_from(sorted(owner.txs)))]
        sub, index = picked
        ack_id = sub.unacked[index][0]
        tx.acks += self.covered(sub, index)
        self.frame(owner, "ACK", {"id": ack_id, "transaction": tx.name}, receipt=False)

    @rule(client=CLIENT, abort=st.booleans(), data=st.data())
    def end_transaction(self, *, client: int, abort: bool, data: st.DataObject) -> None:
        owner = self.clients[client]
        if not owner.txs or owner.link is None:
            return
        tx = owner.txs.pop(data.draw(st.sampled_from(sorted(owner.txs))))
        if abort:
            self.frame(owner, "ABORT", {"transaction": tx.name})
            return
        op = Op(f"COMMIT {tx.name}")
        sends = [slot for message in tx.sends for slot in self.keep(message, op)]
        for slot in tx.acks:
            slot.taken_by.append(op)
        self.ledger.commits.append((op, sends, list(tx.acks)))
        self.frame(owner, "COMMIT", {"transaction": tx.name}, op=op)

    # -- the broker's own work -----------------------------------------------------------------

    @rule(seconds=st.sampled_from([1, 1, 1, 3]))
    def tick(self, *, seconds: int) -> None:
        node = self.live()
        self.act(lambda: node.tick(seconds))

    @rule()
    def compact(self) -> None:
        node = self.live()

        def compact() -> None:
            try:
                node.store.compact()
            except JournalError:
                if not self.squeezed or node.journal.failure is not None:
                    raise  # (on a full disk `compact dst` is refused, the broker goes on)

        self.act(compact)

    @rule()
    def sync(self) -> None:
        node = self.live()
        self.act(node.sync)

    @rule(client=CLIENT)
    def disconnect(self, *, client: int) -> None:
        owner = self.clients[client]
        link = owner.link
        if link is None:
            return
        self.act(link.drop)
        self.forget_link(owner)

    # -- failures and restarts -----------------------------------------------------------------

    @precondition(lambda self: self.armed is None and not self.failing)
    @rule(operations=st.integers(1, 40), power=st.booleans())
    def arm(self, *, operations: int, power: bool) -> None:
        """The machine will stop in the middle of whatever its disk is doing then."""
        self.armed = power
        self.disk.arm(operations, self.rng)

    @precondition(lambda self: self.armed is None and not self.failing)
    @rule(after=st.integers(1, 5))
    def fail_fsync(self, *, after: int) -> None:
        """An fsync to come fails (EIO): the journal must refuse everything from then on."""
        self.failing = True
        countdown = iter(range(after, -1, -1))

        def fault(operation: str, path: Path) -> OSError | None:
            if operation == "fsync" and next(countdown, 0) == 0:
                self.disk.fault = None
                return OSError(errno.EIO, "input/output error")
            return None

        self.disk.fault = fault

    @precondition(
        lambda self: (
            self.SQUEEZABLE and not self.squeezed and not self.failing and self.armed is None
        )
    )
    @rule(room=st.integers(0, 6000))
    def squeeze(self, *, room: int) -> None:
        """The disk fills up but for `room` bytes: below the free-space floor, then full."""
        self.squeezed = self.was_squeezed = True
        self.disk.capacity = self.disk.used() + room

    @precondition(lambda self: self.squeezed)
    @rule()
    def unsqueeze(self) -> None:
        """Space comes back; the next upkeep writes what waited and lets held SENDs go."""
        self.disk.capacity = None
        node = self.live()
        self.act(node.tick)
        self.squeezed = False
        self.held_topic.clear()  # (released by that upkeep)

    @rule(stop=st.sampled_from(Stop))
    def restart(self, *, stop: Stop) -> None:
        node = self.live()
        if stop is Stop.CLEAN:
            try:
                node.stop()
            except SimulatedCrash:
                self.crashed(Stop.POWER if self.armed else Stop.PROCESS, "crash while stopping")
                return
            except JournalError:
                assert self.failing
                self.crashed(Stop.POWER, "a failed fsync while stopping")
                return
            self.restarted(Stop.CLEAN, "clean restart")
            return
        if node.journal.failure is not None:
            stop = Stop.POWER  # after a failed fsync the page cache may have dropped writes
        self.crashed(stop, f"{stop.value} crash")

    def crashed(self, stop: Stop, why: str) -> None:
        node = self.live()
        node.abandon()
        self.disk.crash(self.rng, power=stop is Stop.POWER)
        self.restarted(stop, why)

    def restarted(self, stop: Stop, why: str) -> None:
        for client in self.clients:
            self.forget_link(client)
        self.attached.clear()
        self.armed = None
        self.failing = False
        self.disk.capacity = None
        self.disk.fault = None
        self.disk.disarm()
        self.node, stop = self.open(stop)
        why = f"{why} ({self.ledger.policy})"
        observer = Observer(self.node, self.ledger, self.pipeline, stop)
        observer.leases()
        found, dead = observer.places(QUEUES, sorted(self.durables_ever))
        observer.cursor()
        problems = observer.problems + self.ledger.check(stop, found, dead, why)
        assert not problems, "\n".join(problems)
        FIGURES[f"restarts after a {stop.value} stop"] += 1
        FIGURES["messages found after restarts"] += sum(len(seen) for seen in found.values())
        observer.stages()
        assert not observer.problems, "\n".join(observer.problems)
        for (where, _), slot in self.ledger.slots.items():
            if where.startswith("durable:"):
                slot.delivered = True  # observing a durable subscription delivered its messages
        # The durable subscriptions the broker has now: those observed (observing one that
        # was gone made it anew, empty).
        self.durables = dict.fromkeys(self.durables_ever, KEPT)
        self.epoch += 1
        for slot in self.ledger.slots.values():
            slot.born = self.epoch - 1
        if stop is Stop.POWER or self.was_squeezed:
            # Numbers handed out to what a power cut lost may be handed out again: what
            # depended on them was never confirmed. Only what the broker holds now counts.
            self.seqs = {}
        # (Nor after a full disk: the block of numbers a full disk kept from being written may
        # be handed out again, what used them being lost or never confirmed.)
        forget = stop is Stop.POWER or self.was_squeezed
        self.floor = None if forget else dict(self.seqs)
        self.squeezed = self.was_squeezed = False
        self.held_topic.clear()
        for seen in found.values():
            for one in seen:
                destination = self.ledger.messages[one.body].destination
                self.seqs[destination] = max(self.seqs.get(destination, 0), one.sequence)

    def open(self, stop: Stop) -> tuple[Node, Stop]:
        """Start the broker again. Now and then the machine stops during recovery itself
        (after a power cut there, only what was fsynced is sure), and it is started again."""
        power: bool | None = None
        if self.rng.random() < 0.25:
            power = self.rng.random() < 0.5
            self.disk.arm(self.rng.randint(1, 25), self.rng)
        for _ in range(10):
            try:
                node = Node(self.root, self.files(), self.clock, self.properties)
            except SimulatedCrash:
                self.disk.crash(self.rng, power=bool(power))
                stop = Stop.POWER if power else stop
                continue
            except StorageError as error:
                raise AssertionError(f"the broker did not start: {error}") from error
            self.disk.disarm()
            return node, stop
        raise AssertionError("recovery crashed ten times in a row")


EXAMPLES = iterations(suite=2000, soak=100_000)


@pytest.mark.slow
@pytest.mark.soak
@pytest.mark.timeout(120 + EXAMPLES // 5)  # about 30 ms an example, on a loaded machine
def test_the_store_against_its_model() -> None:
    run_machine(StoreMachine, EXAMPLES)


def run_machine(machine: type[StoreMachine], examples: int, medium: str = "") -> None:
    """Run `examples` histories of `machine`; print the figures under ./dev soak."""
    machine.TestCase.settings = settings(
        max_examples=examples,
        stateful_step_count=60,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        print_blob=True,
    )
    started = time.monotonic()
    FIGURES.clear()
    machine.TestCase().runTest()
    if soaking():
        print(medium + summary(time.monotonic() - started, examples))


def summary(seconds: float, examples: int = EXAMPLES) -> str:
    parts = ", ".join(f"{count:,} {what}" for what, count in sorted(FIGURES.items()))
    return (
        f"store model: {examples:,} examples asked for, {parts}; every restart matched the "
        f"model (0 lost, 0 resurrected, 0 partial COMMITs); {seconds:.0f} s"
    )


def test_a_delivery_a_power_cut_made_the_broker_forget_is_not_required_later() -> None:
    """A history the long run found: under `os`, a power cut brought back a message consumed
    before, and the broker no longer knew it had delivered it; a later clean restart must not
    then require it flagged redelivered."""
    state = StoreMachine()
    state.start(policy="os", segment="1k", swap="0", seed=196)
    state.fail_fsync(after=3)
    state.stage(client=0, count=1, pad=0, persistent=True, task="0.0")
    state.stage(client=0, count=2, pad=0, persistent=False, task="0.0")
    state.stage(client=0, count=4, pad=60, persistent=False, task="0.0")
    state.subscribe(ack="auto", client=0, limit=1, queue="/queue/q0")
    state.restart(stop=Stop.CLEAN)
    state.fail_fsync(after=1)
    state.restart(stop=Stop.POWER)
    state.restart(stop=Stop.CLEAN)
    state.teardown()


def test_a_send_behind_one_held_for_the_disk_waits_with_it() -> None:
    """A history the long run found: on a full disk, a non-persistent SEND behind a staged one
    the disk holds waits with it, so a durable subscription made meanwhile gets it."""
    state = StoreMachine()
    state.start(policy="group", segment="1k", swap="0", seed=0)
    state.squeeze(room=0)
    state.compact()
    state.stage(client=2, count=1, pad=0, persistent=False, task="0.0")
    state.send(
        client=2,
        count=1,
        destination="/topic/t0",
        expiring=False,
        pad=0,
        persistent=False,
        priority=0,
        receipt=True,
    )
    state.subscribe_durable(client=0, limit=1, name="d0")
    state.unsqueeze()
    state.teardown()


class _Draws:
    """What a rule draws from its data, in order (the values a long run drew)."""

    def __init__(self, *values: object) -> None:
        self.values = list(values)

    def draw(self, strategy: object) -> object:
        return self.values.pop(0)


def test_a_staged_send_the_disk_holds_past_its_batch_commit_may_be_dropped() -> None:
    """A history the long run found: staged SENDs held for a full disk are admitted after
    another connection committed their batch, and a SEND staged into a committed batch is
    accepted and dropped (docs/pipelines-protocol.md); they were never part of it."""
    state = StoreMachine()
    state.start(policy="group", segment="1k", swap="0", seed=0)
    state.stage(client=0, count=1, pad=69, persistent=False, task="1.0")
    state.stage(client=0, count=1, pad=0, persistent=False, task="0.0")
    state.send(
        client=0,
        count=1,
        destination="/queue/q0",
        expiring=False,
        pad=119,
        persistent=True,
        priority=0,
        receipt=True,
    )
    state.squeeze(room=0)
    state.stage(client=1, count=2, pad=0, persistent=True, task="0.0")
    state.end_batch(abort=False, client=0, data=_Draws(["0.0"]))
    state.stage(client=0, count=2, pad=0, persistent=False, task="0.0")
    state.unsqueeze()
    state.fail_fsync(after=1)
    state.send(
        client=0,
        count=5,
        destination="/queue/q0",
        expiring=False,
        pad=83,
        persistent=True,
        priority=0,
        receipt=True,
    )
    state.teardown()


def test_a_durable_message_acknowledged_in_an_open_transaction_stays_in_the_log() -> None:
    """A history the long run found: a durable subscription's message acknowledged inside a
    transaction still open was dropped from its topic's log when a cursor's deletion trimmed
    it, so a crash before the COMMIT lost it."""
    state = StoreMachine()
    state.start(policy="group", segment="1k", swap="0", seed=0)
    state.begin(client=1)
    state.arm(operations=20, power=False)
    state.compact()
    state.compact()
    state.begin(client=0)
    state.read_cursor(client=0, from_start=False)
    state.subscribe_durable(client=0, limit=1, name="d0")
    state.send_in_transaction(
        client=1,
        count=1,
        data=_Draws("tx0"),
        destination="/topic/t0",
        pad=0,
        persistent=True,
    )
    state.end_transaction(abort=False, client=1, data=_Draws("tx0"))
    state.acknowledge_in_transaction(client=0, data=_Draws("s5", 0, "tx2"))
    state.delete_cursor(client=0)
    state.compact()
    state.teardown()
