"""The crash loop on a two-member cluster: one member killed with SIGKILL while clients publish
and consume, round after round, and nothing receipted lost, nothing acknowledged back.

Each round, on a new database: members a and b (broker processes, the jdbc store, short failure
detection). The producer is our client with the address list [b, a] and unbounded reconnection
(imqAddressList, imqReconnectAttempts=-1), sending persistent messages to b, each waiting for its
receipt; a stomp.py consumer on a acknowledges each message it gets with a receipt of its own. b is
killed after a random number of receipts. The producer fails over to a and sends the rest there;
a declares b failed and takes its store over. At the end every receipted message has reached the
consumer (what b held came over its link before the kill, or with the takeover after it), and no
message whose acknowledgement was receipted was delivered again. Messages delivered twice are
flagged redelivered (at least once across the kill of the member they were on).

`./dev soak` runs more rounds (tests/soak.py).
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from typing import Any

import pytest
import stomp

from sluiceway.client.sync import ConnectionFactory
from sluiceway.errors import ConnectionClosedError
from sluiceway.testing.postgres import PostgresServer
from tests.cluster.members import row, start_member
from tests.e2e.support import wait_until
from tests.soak import iterations

ROUNDS = iterations(suite=2, soak=20)
MESSAGES = 200  # sent each round
QUEUE = "/queue/crash"
ARRIVAL_WAIT = 25.0  # seconds for the takeover, then for every receipted message to arrive


class Acknowledging(stomp.ConnectionListener):  # type: ignore[misc]
    """Acknowledges every message with a receipt, and remembers what it saw and confirmed."""

    def __init__(self, connection: stomp.Connection) -> None:
        self._connection = connection
        self._lock = threading.Lock()
        self.seen: list[tuple[str, bool]] = []  # (body, redelivered), in arrival order
        self.asked: dict[str, str] = {}  # receipt -> body whose ACK it confirms
        self.confirmed: set[str] = set()  # bodies whose ACK the broker receipted
        self.after_confirmed: list[str] = []  # bodies delivered again after a confirmed ACK

    def on_message(self, frame: Any) -> None:
        body = frame.body
        with self._lock:
            if body in self.confirmed:
                self.after_confirmed.append(body)
            self.seen.append((body, frame.headers.get("redelivered") == "true"))
            receipt = f"ack-{len(self.seen)}"
            self.asked[receipt] = body
        self._connection.ack(frame.headers["ack"], receipt=receipt)

    def on_receipt(self, frame: Any) -> None:
        with self._lock:
            body = self.asked.pop(frame.headers["receipt-id"], None)
            if body is not None:
                self.confirmed.add(body)

    def bodies(self) -> set[str]:
        with self._lock:
            return {body for body, _ in self.seen}


def one_round(postgres: PostgresServer, number: int, rng: random.Random) -> dict[str, int]:
    url = postgres.create_database(f"crash_{number}")
    kill_after = rng.randint(10, MESSAGES - 10)
    with start_member(url, "a") as a, start_member(url, "b") as b:
        consumer = stomp.Connection12([("127.0.0.1", a.port)])
        acks = Acknowledging(consumer)
        consumer.set_listener("acks", acks)
        consumer.connect(wait=True)
        consumer.subscribe(QUEUE, id="1", ack="client-individual")
        factory = ConnectionFactory(
            properties={
                "imqAddressList": f"stomp://127.0.0.1:{b.port},stomp://127.0.0.1:{a.port}",
                "imqReconnectEnabled": "true",
                "imqReconnectAttempts": "-1",
                "imqReconnectInterval": "200",
            }
        )
        receipted: list[str] = []
        failed_over = 0
        with factory.connect() as connection:
            producer = connection.session().producer(QUEUE)
            for n in range(MESSAGES):
                if n == kill_after:
                    b.kill()
                body = f"r{number}-m{n}"
                try:
                    producer.send(body, persistent=True)
                except ConnectionClosedError:
                    failed_over += 1  # lost with b or not: never receipted, so not required
                    continue
                receipted.append(body)
            reconnects = connection.reconnects
        wait_until(lambda: row(url, "b")["state"] == "TAKEOVER_COMPLETE", timeout=ARRIVAL_WAIT)
        wait_until(lambda: set(receipted) <= acks.bodies(), timeout=ARRIVAL_WAIT)
        consumer.disconnect()
        a.stop()
    missing = set(receipted) - acks.bodies()
    assert not missing, f"round {number}: receipted and never delivered: {sorted(missing)[:10]}"
    assert not acks.after_confirmed, (
        f"round {number}: acknowledged, then delivered again: {acks.after_confirmed[:10]}"
    )
    counts = Counter(body for body, _ in acks.seen)
    unflagged = [
        body
        for index, (body, redelivered) in enumerate(acks.seen)
        if not redelivered and any(b == body for b, _ in acks.seen[:index])
    ]
    assert not unflagged, f"round {number}: delivered again without the redelivered flag"
    assert reconnects >= 1  # the producer failed over to a
    return {
        "receipted": len(receipted),
        "delivered twice": sum(1 for count in counts.values() if count > 1),
        "sends cut by the kill": failed_over,
    }


@pytest.mark.slow
@pytest.mark.soak
@pytest.mark.timeout(60 + 120 * ROUNDS)
def test_killing_a_member_round_after_round_loses_nothing_receipted(
    postgres: PostgresServer,
) -> None:
    rng = random.Random(24)
    totals: Counter[str] = Counter()
    for number in range(ROUNDS):
        totals.update(one_round(postgres, number, rng))
    assert totals["receipted"] >= ROUNDS * (MESSAGES - 2)
