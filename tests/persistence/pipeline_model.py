"""The pipeline protocol's part of the store model: queue leases, a topic cursor, stages.

`PipelineRules` is mixed into the store's state machine (test_store_model.py). Its rules read
leases of /queue/q1 (group L) and acknowledge or release them, open, read, commit and delete a
cursor on /topic/t0, and stage messages for /queue/q0 under sink k, batch by batch, then COMMIT
or ABORT them. After every restart it checks what the broker kept (docs/pipelines-protocol.md):

- a lease whose creation was confirmed is acknowledged if its ACK was, and otherwise, unless
  released, still open with the same persistent messages in the same order;
- the cursor never moves back before a confirmed commit, and keeps every persistent message at
  or after its position that was published while it existed;
- a staged batch comes back whole: committing it after the restart publishes every staged
  message whose SEND was confirmed, and a batch committed before answers `committed-before`.

Then it puts things where the rest of the model can check them: open leases are released (their
messages go back to the queue, which is browsed next), and staged batches are committed.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from hypothesis import strategies as st
from hypothesis.stateful import rule

from sluiceway.protocol.frames import Frame
from tests.persistence.ledger import Ledger, Message, Op, Slot, Stop, Tri

LEASED = "/queue/q1"
STAGED = "/queue/q0"
CURSOR_TOPIC = "/topic/t0"
GROUP = "L"
CURSOR = "g"
SINK = "k"
TASKS = ("0.0", "1.0", "2.1")


@dataclass(eq=False)
class Lease:
    number: int
    made: Op
    slots: list[Slot] = field(default_factory=list)  # its messages, in order
    acked: Op | None = None
    released: Op | None = None


@dataclass(eq=False)
class Cursor:
    made: Op
    commits: list[tuple[int, Op]] = field(default_factory=list)  # (sequence, op)


@dataclass(eq=False)
class Batch:
    number: int
    staged: dict[str, list[tuple[Message, Op]]] = field(default_factory=dict)  # by task
    committed: Op | None = None
    tasks: list[str] = field(default_factory=list)  # the tasks its COMMIT listed
    aborted: Op | None = None


class PipelineState:
    """What the pipeline rules know, beside the ledger."""

    def __init__(self) -> None:
        self.leases: dict[int, Lease] = {}
        self.next_lease = 1
        self.cursor: Cursor | None = None
        self.cursor_gone: list[Op] = []  # DELETEs of the cursor not known to have taken effect
        self.sequences: dict[bytes, int] = {}  # topic messages' sequence numbers, as read
        self.under_cursor: dict[bytes, Op] = {}  # topic messages published while it existed
        self.sent_by: dict[bytes, Op] = {}  # the op that published each topic message
        self.batches: dict[int, Batch] = {}
        self.batch = 1  # the batch stage SENDs go to
        self.reads = itertools.count()


def check_lease(stop: Stop, policy: str, lease: Lease, state: str, bodies: list[bytes]) -> str:
    """What is wrong with lease `lease` read back as `state` with `bodies`; empty if nothing."""
    acked = lease.acked.effect(stop, policy) if lease.acked else Tri.NO
    released = lease.released.effect(stop, policy) if lease.released else Tri.NO
    if acked is Tri.YES:
        return "" if state == "acknowledged" else f"lease {lease.number} acked, yet {state}"
    if state == "acknowledged" and acked is Tri.NO:
        return f"lease {lease.number} is acknowledged, never by its ACK"
    kept = [s.message.body for s in lease.slots if s.message.persistent]
    if state == "open" and [b for b in kept if b in bodies] != bodies:
        return f"lease {lease.number} holds {bodies[:3]}, not its messages in order"
    if released is Tri.NO and acked is Tri.NO:
        if state != "open":
            return f"lease {lease.number} should be open, is {state}"
        sure = {s.message.body for s in lease.slots if s.message.persistent}
        sure -= {s.message.body for s in lease.slots if s.message.expiring}
        if not sure <= set(bodies):
            return f"lease {lease.number} lost messages: {sorted(sure - set(bodies))[:3]}"
    return ""


class PipelineRules:
    """Rules for leases, the cursor and stages (mixed into the store's state machine)."""

    pipeline: PipelineState
    ledger: Ledger
    squeezed: bool  # the disk is full: SENDs that need it are held

    # Provided by the state machine.
    @property
    def uncertain(self) -> bool:
        """What is handled now may not reach the disk."""
        raise NotImplementedError

    def pipeline_frame(
        self, client: int, command: str, headers: dict[str, str], op: Op | None, body: bytes
    ) -> list[Frame]:
        """Send a frame asking for a receipt; the frames it brought back (reads, receipts)."""
        raise NotImplementedError

    def pipeline_message(self, pad: int, destination: str) -> Message:
        raise NotImplementedError

    def published_to_topic(self, body: bytes) -> None:
        """A message was published to the topic now: the cursor, if any, keeps it."""
        if self.pipeline.cursor is not None:
            self.pipeline.under_cursor[body] = self.pipeline.cursor.made

    # -- leases --------------------------------------------------------------------------------

    @rule(client=st.integers(0, 2), most=st.integers(1, 6))
    def read_lease(self, *, client: int, most: int) -> None:
        number = self.pipeline.next_lease
        self.pipeline.next_lease += 1
        op = Op(f"SUBSCRIBE lease {GROUP}/{number}")
        lease = self.pipeline.leases[number] = Lease(number, op)
        headers = {
            "destination": LEASED,
            "id": f"lease-read-{next(self.pipeline.reads)}",
            "lease": f"{GROUP}/{number}",
            "lease-max-messages": str(most),
        }
        frames = self.pipeline_frame(client, "SUBSCRIBE", headers, op, b"")
        for frame in frames:
            if frame.command == "MESSAGE" and frame.headers.get("browser") != "end":
                slot = self.ledger.slot(LEASED, frame.body)
                slot.delivered = slot.delivered or not self.uncertain
                lease.slots.append(slot)

    @rule(client=st.integers(0, 2), ack=st.booleans(), data=st.data())
    def end_lease(self, *, client: int, ack: bool, data: st.DataObject) -> None:
        open_ones = sorted(n for n, lease in self.pipeline.leases.items() if self.endable(lease))
        if not open_ones:
            return
        lease = self.pipeline.leases[data.draw(st.sampled_from(open_ones))]
        op = Op(f"{'ACK' if ack else 'NACK'} lease {lease.number}")
        if ack:
            lease.acked = op
            for slot in lease.slots:
                slot.taken_by.append(op)
        else:
            lease.released = op
        headers = {"id": "lease", "destination": LEASED, "lease": f"{GROUP}/{lease.number}"}
        self.pipeline_frame(client, "ACK" if ack else "NACK", headers, op, b"")

    @staticmethod
    def endable(lease: Lease) -> bool:
        return lease.made.handled and not lease.made.refused and not (lease.acked or lease.released)

    # -- the cursor ----------------------------------------------------------------------------

    @rule(client=st.integers(0, 2), from_start=st.booleans())
    def read_cursor(self, *, client: int, from_start: bool) -> None:
        pipeline = self.pipeline
        if pipeline.cursor is None:
            pipeline.cursor = Cursor(Op(f"SUBSCRIBE cursor {CURSOR}"))
        headers = {
            "destination": CURSOR_TOPIC,
            "id": f"cursor-read-{next(pipeline.reads)}",
            "browser": "true",
            "cursor": CURSOR,
            "cursor-start": "earliest",
        }
        if from_start:
            headers["from-sequence"] = "0"
        frames = self.pipeline_frame(client, "SUBSCRIBE", headers, pipeline.cursor.made, b"")
        self.learn_sequences(frames)

    def learn_sequences(self, frames: list[Frame]) -> list[tuple[bytes, int]]:
        read = []
        for frame in frames:
            if frame.command == "MESSAGE" and frame.headers.get("browser") != "end":
                sequence = int(frame.headers["sequence"])
                self.pipeline.sequences[frame.body] = sequence
                read.append((frame.body, sequence))
        return read

    @rule(client=st.integers(0, 2), data=st.data())
    def commit_cursor(self, *, client: int, data: st.DataObject) -> None:
        cursor = self.pipeline.cursor
        if cursor is None or not cursor.made.handled or cursor.made.refused:
            return
        known = sorted(self.pipeline.sequences.values())
        if not known:
            return
        sequence = data.draw(st.sampled_from(known)) + data.draw(st.integers(0, 1))
        op = Op(f"ACK cursor to {sequence}")
        cursor.commits.append((sequence, op))
        headers = {
            "id": "cursor",
            "destination": CURSOR_TOPIC,
            "cursor": CURSOR,
            "sequence": str(sequence),
        }
        self.pipeline_frame(client, "ACK", headers, op, b"")

    @rule(client=st.integers(0, 2))
    def delete_cursor(self, *, client: int) -> None:
        cursor = self.pipeline.cursor
        if cursor is None or not cursor.made.handled or cursor.made.refused:
            return
        op = Op("UNSUBSCRIBE cursor")
        self.pipeline.cursor = None
        self.pipeline.cursor_gone.append(op)
        headers = {"id": "no-such-read", "destination": CURSOR_TOPIC, "cursor": CURSOR}
        self.pipeline_frame(client, "UNSUBSCRIBE", headers, op, b"")

    # -- stages --------------------------------------------------------------------------------

    @rule(
        client=st.integers(0, 2),
        task=st.sampled_from(TASKS),
        count=st.integers(1, 4),
        persistent=st.booleans(),
        pad=st.integers(0, 200),
    )
    def stage(self, *, client: int, task: str, count: int, persistent: bool, pad: int) -> None:
        batch = self.pipeline.batches.setdefault(self.pipeline.batch, Batch(self.pipeline.batch))
        for _ in range(count):
            message = self.pipeline_message(pad, STAGED)
            message.persistent = persistent
            op = Op(f"SEND staged {message.body[:7]!r}", holdable=True)
            batch.staged.setdefault(task, []).append((message, op))
            headers = {
                "destination": STAGED,
                "stage": f"{SINK}/{batch.number}/{task}",
                "persistent": "true" if persistent else "false",
            }
            self.pipeline_frame(client, "SEND", headers, op, message.body)

    @rule(client=st.integers(0, 2), abort=st.sampled_from([False, False, True]), data=st.data())
    def end_batch(self, *, client: int, abort: bool, data: st.DataObject) -> None:
        batch = self.pipeline.batches.get(self.pipeline.batch)
        if batch is None:
            return
        self.pipeline.batch += 1
        headers = {"transaction": "stage", "stage": f"{SINK}/{batch.number}"}
        if abort:
            batch.aborted = Op(f"ABORT batch {batch.number}")
            self.pipeline_frame(client, "ABORT", headers, batch.aborted, b"")
            return
        tasks = data.draw(st.lists(st.sampled_from(TASKS), unique=True))
        batch.tasks = tasks
        batch.committed = op = Op(f"COMMIT batch {batch.number}")
        for task in tasks:
            for message, sent in batch.staged.get(task, []):
                ops = [sent, op]
                if self.squeezed and not sent.confirmed:
                    # Held for the disk, it may be admitted after this COMMIT, and a SEND staged
                    # into a batch committed before is accepted and dropped.
                    ops.append(Op("held until after its batch was committed"))  # (maybe)
                self.ledger.add(Slot(message, STAGED, ops))
        headers["stage-tasks"] = ",".join(tasks)
        self.pipeline_frame(client, "COMMIT", headers, op, b"")


def lease_frames(frames: list[Frame]) -> tuple[str, list[bytes]]:
    """A lease read's state and its messages' bodies."""
    end = frames[-1]
    assert end.headers.get("browser") == "end", end
    return end.headers["lease-state"], [f.body for f in frames[:-1]]


def check_cursor(
    *,
    stop: Stop,
    policy: str,
    state: PipelineState,
    position: int,
    read: list[tuple[bytes, int]],
    messages: dict[bytes, Message],
) -> list[str]:
    """What is wrong with the cursor read back at `position`, holding `read`."""
    problems = []
    cursor = state.cursor
    bodies = [body for body, _ in read]
    if len(set(bodies)) != len(bodies):
        problems.append("the cursor reads a message twice")
    if [s for _, s in read] != sorted(s for _, s in read) or any(s < position for _, s in read):
        problems.append(f"the cursor at {position} reads out of order or before it")
    for body in bodies:
        message = messages.get(body)
        if message is None or message.destination != CURSOR_TOPIC or not message.persistent:
            problems.append(f"the cursor reads {body!r}, never a persistent topic message")
    gone = any(op.effect(stop, policy) is not Tri.NO for op in state.cursor_gone)
    if cursor is None or gone or cursor.made.effect(stop, policy) is not Tri.YES:
        return problems
    confirmed = [s for s, op in cursor.commits if op.effect(stop, policy) is Tri.YES]
    if confirmed and position < max(confirmed):
        problems.append(f"the cursor is at {position}, before its commit to {max(confirmed)}")
    present = set(bodies)
    for body, made in state.under_cursor.items():
        sequence = state.sequences.get(body)
        message = messages[body]
        if sequence is None or sequence < position or body in present:
            continue
        if message.persistent and not message.expiring and made.effect(stop, policy) is Tri.YES:
            sent = state.sent_by.get(body)
            if sent is not None and sent.effect(stop, policy) is Tri.YES:
                problems.append(f"the cursor at {position} lost {body!r} (sequence {sequence})")
    return problems
