"""Looking at what a restarted broker holds, as its clients can: the store model's eyes.

Queues are browsed (a browser takes nothing), durable subscriptions attached and detached, the
dead message queue browsed; leases read back and then released (so their messages are back in
their queue when it is browsed), the cursor read, staged batches committed. Everything is done
over STOMP on connections of the observer's own, through the in-process node.
"""

from __future__ import annotations

import itertools

from sluiceway.protocol.frames import Frame
from tests.persistence.inprocess import Link, Node
from tests.persistence.ledger import KEPT, Ledger, Seen, Slot, Stop, Tri
from tests.persistence.pipeline_model import (
    CURSOR,
    CURSOR_TOPIC,
    GROUP,
    LEASED,
    SINK,
    STAGED,
    Cursor,
    PipelineState,
    check_cursor,
    check_lease,
    lease_frames,
)

DMQ = "/queue/mq.sys.dmq"
TOPIC = "/topic/t0"


def seen_of(frame: Frame, *, browsed: bool) -> Seen:
    """A message as a browser or a consumer sees it. A browser's `delivery-count` is how often
    the message was delivered (its `redelivered` counts this reading as a delivery)."""
    if browsed:
        delivered = int(frame.headers["delivery-count"]) >= 1
    else:
        delivered = frame.headers["redelivered"] == "true"
    return Seen(
        frame.body,
        delivered,
        int(frame.headers.get("priority", "4")),
        int(frame.headers["sequence"]),
    )


class Observer:
    """Reads a restarted node; what it finds wrong collects in `problems`."""

    def __init__(self, node: Node, ledger: Ledger, pipeline: PipelineState, stop: Stop) -> None:
        self.node = node
        self.ledger = ledger
        self.pipeline = pipeline
        self.stop = stop
        self.problems: list[str] = []
        self._ids = itertools.count()
        self.link = self._connect("observer", **{"failed-receipts": "true"})

    def _connect(self, name: str, **headers: str) -> Link:
        link = self.node.connect(name, **headers)
        (connected,) = link.take()
        assert connected.command == "CONNECTED", connected
        return link

    def _request(self, link: Link, command: str, headers: dict[str, str]) -> list[Frame]:
        """A frame with a receipt: every frame it brought, its RECEIPT first (control frames
        are written before messages)."""
        receipt = f"o{next(self._ids)}"
        link.send(command, {**headers, "receipt": receipt})
        frames = link.take()
        if not any(f.headers.get("receipt-id") == receipt for f in frames):
            self.node.sync()  # (under the group policy a RECEIPT waits for its fsync)
            frames += link.take()
        receipts = [f for f in frames if f.headers.get("receipt-id") == receipt]
        assert len(receipts) == 1, frames[-3:]
        return receipts + [f for f in frames if f.command == "MESSAGE"]

    def _read(self, link: Link, headers: dict[str, str]) -> list[Frame]:
        """SUBSCRIBE that ends in an end marker (browse, lease, cursor): its MESSAGE frames,
        the marker last; then UNSUBSCRIBE."""
        sub_id = f"read{next(self._ids)}"
        frames = self._request(link, "SUBSCRIBE", {**headers, "id": sub_id})[1:]
        assert frames, f"no end marker for {headers}"
        assert frames[-1].headers.get("browser") == "end", frames[-3:]
        link.send("UNSUBSCRIBE", {"id": sub_id})
        return frames

    # -- leases ----------------------------------------------------------------------------------

    def leases(self) -> None:
        """Read back each lease that surely exists, then release every lease, so that their
        messages are in the queue when it is browsed."""
        policy, stop = self.ledger.policy, self.stop
        leases = self.pipeline.leases
        surely = False  # a later lease surely exists: reading this one cannot create it
        for number in sorted(leases, reverse=True):
            lease = leases[number]
            surely = surely or lease.made.effect(stop, policy) is Tri.YES
            if surely:
                name = f"{GROUP}/{number}"
                frames = self._read(self.link, {"destination": LEASED, "lease": name})
                state, bodies = lease_frames(frames)
                problem = check_lease(stop, policy, lease, state, bodies)
                if problem:
                    self.problems.append(problem)
        for number in sorted(leases):
            headers = {"id": "lease", "destination": LEASED, "lease": f"{GROUP}/{number}"}
            receipt = self._request(self.link, "NACK", headers)[0]
            status = receipt.headers.get("status", "200")
            if status not in ("200", "404"):
                self.problems.append(f"releasing lease {number} answered {receipt.headers}")
        leases.clear()

    # -- queues and durable subscriptions --------------------------------------------------------

    def places(
        self, queues: tuple[str, ...], durables: list[str]
    ) -> tuple[dict[str, list[Seen]], list[Seen]]:
        """Each queue browsed, each durable subscription's messages, and the dead ones."""
        found = {queue: self.browse(queue) for queue in queues}
        dead = self.browse(DMQ)
        for key in durables:
            found[key] = self.read_durable(key)
        return found, dead

    def browse(self, queue: str) -> list[Seen]:
        frames = self._read(self.link, {"destination": queue, "browser": "true", "ack": "auto"})
        return [seen_of(frame, browsed=True) for frame in frames[:-1]]

    def read_durable(self, key: str) -> list[Seen]:
        client_id, name = key.removeprefix("durable:").split("/")
        link = self._connect(f"observer-{client_id}", **{"client-id": client_id})
        headers = {
            "destination": TOPIC,
            "id": "o",
            "ack": "client-individual",
            "durable-subscription-name": name,
            "consumer-flow-limit": "100000",
        }
        frames = self._request(link, "SUBSCRIBE", headers)[1:]
        link.send("UNSUBSCRIBE", {"id": "o"})
        link.drop()
        return [seen_of(frame, browsed=False) for frame in frames]

    # -- the cursor ------------------------------------------------------------------------------

    def cursor(self) -> None:
        pipeline = self.pipeline
        if pipeline.cursor is None and not pipeline.cursor_gone:
            return  # surely deleted (reading it would make it anew)
        headers = {
            "destination": CURSOR_TOPIC,
            "browser": "true",
            "cursor": CURSOR,
            "cursor-start": "earliest",
        }
        frames = self._read(self.link, headers)
        position = int(frames[-1].headers["cursor-sequence"])
        read = [(f.body, int(f.headers["sequence"])) for f in frames[:-1]]
        policy, messages = self.ledger.policy, self.ledger.messages
        self.problems += check_cursor(
            stop=self.stop,
            policy=policy,
            state=pipeline,
            position=position,
            read=read,
            messages=messages,
        )
        pipeline.cursor = Cursor(KEPT)
        pipeline.cursor_gone = []
        kept = {body for body, _ in read}
        pipeline.under_cursor = dict.fromkeys(kept, KEPT)
        pipeline.sent_by = dict.fromkeys(kept, KEPT)
        for body, sequence in read:
            pipeline.sequences[body] = sequence

    # -- stages ----------------------------------------------------------------------------------

    def stages(self) -> None:
        """Commit every batch still staged: one committed before answers committed-before, the
        others publish what they kept (a confirmed staged SEND surely)."""
        policy, stop = self.ledger.policy, self.stop
        batches = self.pipeline.batches
        before = {s.body for s in self.browse(STAGED)}
        for number in sorted(batches):
            batch = batches[number]
            later = [
                b.committed.effect(stop, policy)
                for n, b in batches.items()
                if n > number and b.committed is not None
            ]
            own = batch.committed.effect(stop, policy) if batch.committed else Tri.NO
            tasks = batch.tasks if batch.committed else sorted(batch.staged)
            headers = {
                "transaction": "stage",
                "stage": f"{SINK}/{number}",
                "stage-tasks": ",".join(tasks),
            }
            receipt = self._request(self.link, "COMMIT", headers)[0]
            state = receipt.headers.get("stage-state")
            now = {s.body for s in self.browse(STAGED)}
            published, before = now - before, now
            self._check_batch(
                number=batch.number,
                state=state,
                published=published,
                own=own,
                later=later,
                tasks=tasks,
            )
            for task in tasks:
                for message, _ in batch.staged.get(task, []):
                    if message.body in published:
                        self.ledger.add(Slot(message, STAGED, [KEPT]))
        batches.clear()
        self.pipeline.batch = max(self.pipeline.batch, 1) + 1

    def _check_batch(
        self,
        *,
        number: int,
        state: str | None,
        published: set[bytes],
        own: Tri,
        later: list[Tri],
        tasks: list[str],
    ) -> None:
        batch = self.pipeline.batches[number]
        policy, stop = self.ledger.policy, self.stop
        staged = [(m, op) for task in tasks for m, op in batch.staged.get(task, [])]
        bodies = {m.body for m, _ in staged}
        if not published <= bodies:
            self.problems.append(f"batch {number} published {sorted(published - bodies)[:3]}")
        if state == "committed-before" and published:
            self.problems.append(f"batch {number} was committed before, yet published now")
        if own is Tri.YES or Tri.YES in later:
            if state != "committed-before":
                self.problems.append(f"batch {number} committed before, yet {state}")
            return
        if own is Tri.NO and all(t is Tri.NO for t in later) and state != "committed":
            self.problems.append(f"batch {number} never committed, yet {state}")
        aborted = batch.aborted.effect(stop, policy) if batch.aborted else Tri.NO
        if own is Tri.NO and aborted is Tri.NO and state == "committed":
            sure = {m.body for m, op in staged if op.effect(stop, policy) is Tri.YES}
            if not sure <= published:
                lost = sorted(sure - published)[:3]
                self.problems.append(f"batch {number} lost staged messages {lost}")
