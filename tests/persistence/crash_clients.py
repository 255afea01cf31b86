"""The load of the crash loop: producers and consumers, each on a connection and thread of its own.

Every frame that changes the broker's state asks for a RECEIPT, except the SENDs and ACKs inside
a transaction, which its COMMIT (or ABORT) confirms. A client records in the Ledger what it is
about to ask before it asks, and what the broker confirmed once the RECEIPT is in. When the
broker is killed the clients' connections close under them and their threads end; anything else
that stops a client (an ERROR frame, a RECEIPT that never comes, a connection lost while the
broker runs) is a failure of the run.
"""

from __future__ import annotations

import itertools
import random
import threading
import traceback
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from sluiceway.protocol.frames import Frame
from tests.e2e.rawclient import ConnectionClosed, RawClient
from tests.persistence.crash_ledger import Ledger

QUEUES: Final = ("/queue/crash.a", "/queue/crash.b")
KEEP: Final = "/queue/crash.keep"  # consumed only now and then: keeps old segments alive
TOPIC: Final = "/topic/crash"
DURABLE_CLIENT_ID: Final = "crash-loop"
DURABLE_NAME: Final = "crash-reader"

RECEIPT_TIMEOUT_S: Final = 30.0  # a RECEIPT slower than this while the broker runs is a failure
POLL_S: Final = 0.1  # how long a consumer waits for a MESSAGE before looking at `stop` again
BODY_BYTES: Final = (200, 4096)  # smallest and largest message body (1.5 KB on average)
MAX_WAITING: Final = 1500  # messages per destination beyond which producers wait for consumers
ACK_TRANSACTION_MAX: Final = 50  # below imq.transaction.consumer.maxNumMsgs (100)
SEND_TRANSACTION_MAX: Final = 40
LARGE_TRANSACTION: Final = (300, 900)  # about 0.5 to 1.4 MB: often more than a segment
ABORT_SHARE: Final = 0.1  # transactions (sending or acknowledging) that end in ABORT


@dataclass
class Life:
    """What the clients of one broker process share."""

    port: int
    ledger: Ledger
    stop: threading.Event = field(default_factory=threading.Event)  # set as the broker is killed
    failed: threading.Event = field(default_factory=threading.Event)
    failures: list[str] = field(default_factory=list)
    large_half_sent: threading.Event = field(default_factory=threading.Event)
    large_commit_sent: threading.Event = field(default_factory=threading.Event)


def key_of(message: Frame) -> str:
    return message.body.split(b" ", 1)[0].decode()


def make_body(key: str, rng: random.Random) -> bytes:
    head = f"{key} ".encode()
    size = int(rng.triangular(*BODY_BYTES, BODY_BYTES[0]))  # most near the small end
    return head + bytes(rng.randrange(97, 123) for _ in range(8)) * (size // 8)


class Client(threading.Thread):
    """A thread with a connection of its own; what ends it other than the kill is a failure."""

    def __init__(self, life: Life, name: str, seed: int) -> None:
        super().__init__(name=name, daemon=True)
        self.life = life
        self.ledger = life.ledger
        self.rng = random.Random(seed)
        self.client: RawClient | None = None

    def connect(self, **headers: str) -> RawClient:
        self.client = RawClient(self.life.port, timeout=RECEIPT_TIMEOUT_S)
        self.client.connect(**headers)
        return self.client

    def run(self) -> None:
        try:
            self.work()
        except (ConnectionClosed, OSError) as exc:
            if not self.life.stop.is_set():
                self.fail(f"{self.name}: connection lost while the broker ran: {exc!r}")
        except Exception:
            self.fail(f"{self.name}: {traceback.format_exc()}")
        finally:
            if self.client is not None:
                self.client.close()

    def fail(self, what: str) -> None:
        self.life.failures.append(what)
        self.life.failed.set()

    def work(self) -> None:
        raise NotImplementedError


class Producer(Client):
    """Persistent SENDs, each waiting for its RECEIPT, to destinations picked by weight."""

    def __init__(self, life: Life, name: str, seed: int, destinations: dict[str, float]) -> None:
        super().__init__(life, name, seed)
        self.destinations = list(destinations)
        self.weights = list(destinations.values())
        self.numbers = itertools.count(1)

    def work(self) -> None:
        client = self.connect()
        while not self.life.stop.is_set():
            (destination,) = self.rng.choices(self.destinations, self.weights)
            if not self.ledger.wait_for_room(destination, MAX_WAITING, POLL_S):
                continue
            key = f"{self.name}.{next(self.numbers)}"
            body = make_body(key, self.rng)
            self.ledger.sending_one(key, destination)
            client.request("SEND", {"destination": destination, "persistent": "true"}, body)
            self.ledger.sent(key)


class TransactionalProducer(Producer):
    """BEGIN, persistent SENDs, then COMMIT (or now and then ABORT) with a RECEIPT; with `large`,
    the first transaction is a large one, and `Life` says when half of it and its COMMIT are
    written."""

    def __init__(
        self, life: Life, name: str, seed: int, destinations: dict[str, float], large: bool
    ) -> None:
        super().__init__(life, name, seed, destinations)
        self.large = large

    def work(self) -> None:
        client = self.connect()
        for number in itertools.count(1):
            if self.life.stop.is_set():
                return
            if not all(
                self.ledger.wait_for_room(d, MAX_WAITING, POLL_S) for d in self.destinations
            ):
                continue
            large = self.large and number == 1
            count = self.rng.randint(*LARGE_TRANSACTION if large else (1, SEND_TRANSACTION_MAX))
            self.transaction(client, f"{self.name}.t{number}", count, large)

    def transaction(self, client: RawClient, name: str, count: int, large: bool) -> None:
        client.send("BEGIN", {"transaction": name})
        for index in range(count):
            if self.life.stop.is_set():
                return  # killed: the frames would go nowhere, and it is open, not committing
            (destination,) = self.rng.choices(self.destinations, self.weights)
            key = f"{self.name}.{next(self.numbers)}"
            body = make_body(key, self.rng)
            self.ledger.sending_in(name, key, destination)
            headers = {"destination": destination, "persistent": "true", "transaction": name}
            client.send("SEND", headers, body)
            if large and index == count // 2:
                self.life.large_half_sent.set()
        if self.life.stop.is_set():
            return
        if self.rng.random() < ABORT_SHARE:
            client.request("ABORT", {"transaction": name})
            self.ledger.aborted(name)
            return
        self.ledger.committing(name)
        if large:
            self.life.large_commit_sent.set()
        client.request("COMMIT", {"transaction": name})
        self.ledger.committed(name)


class Consumer(Client):
    """Client-individual ACKs of one subscription, each with a RECEIPT or, for a share of them,
    in transactions committed (or now and then aborted) with a RECEIPT. It holds up to `hold`
    messages unacknowledged, oldest acknowledged first, so that some are always delivered and
    not acknowledged when the broker is killed."""

    def __init__(
        self,
        life: Life,
        name: str,
        seed: int,
        destination: str,
        in_transactions: float,
        *,
        client: RawClient | None = None,
        held: Sequence[Frame] = (),
    ) -> None:
        super().__init__(life, name, seed)
        self.destination = destination
        self.in_transactions = in_transactions
        self.client = client  # already subscribed (the durable subscriber), or None
        self.held: deque[Frame] = deque(held)  # delivered (and checked), not acknowledged
        self.hold = self.rng.randint(0, 40)
        self.transactions = itertools.count(1)

    def work(self) -> None:
        client = self.client
        if client is None:
            client = self.connect()
            client.subscribe(self.destination, "s", consumer_flow_limit="200")
        while not self.life.stop.is_set():
            message = next_message(client)
            if message is None:
                continue
            self.ledger.delivered(key_of(message), self.destination, is_redelivered(message))
            self.held.append(message)
            if len(self.held) > self.hold:
                self.acknowledge(client, self.rng.randint(1, len(self.held) - self.hold))

    def acknowledge(self, client: RawClient, count: int) -> None:
        if self.rng.random() >= self.in_transactions:
            for _ in range(count):
                message = self.held.popleft()
                key = key_of(message)
                self.ledger.acking_one(key)
                client.request("ACK", {"id": message.headers["ack"]})
                self.ledger.acknowledged(key)
            return
        name = f"{self.name}.t{next(self.transactions)}"
        client.send("BEGIN", {"transaction": name})
        batch = [self.held.popleft() for _ in range(min(count, ACK_TRANSACTION_MAX))]
        for message in batch:
            self.ledger.acking_in(name, key_of(message))
            client.send("ACK", {"id": message.headers["ack"], "transaction": name})
        if self.rng.random() < ABORT_SHARE:
            client.request("ABORT", {"transaction": name})  # they come back, redelivered
            self.ledger.ack_aborted(name)
            return
        self.ledger.ack_committing(name)
        client.request("COMMIT", {"transaction": name})
        self.ledger.ack_committed(name)


def next_message(client: RawClient) -> Frame | None:
    """The next MESSAGE, from those that came with RECEIPTs or from the socket (None when
    nothing comes for a while)."""
    if client.messages:
        return client.messages.popleft()
    try:
        (message,) = client.receive(1, timeout=POLL_S)
    except TimeoutError:
        return None
    return message


def is_redelivered(message: Frame) -> bool:
    return message.headers.get("redelivered") == "true"
