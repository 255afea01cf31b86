"""A broker killed with SIGKILL under persistent load, again and again, on the same data directory.

Producers send persistent messages to two queues, a queue consumed only now and then and a
topic with a durable subscription, each SEND with a RECEIPT, and in transactions committed with
a RECEIPT; consumers acknowledge with receipts, one message at a time or in transactions. The
journal has 1 MiB segments, so its history spans several of them and the broker's upkeep (once a
second) deletes and rewrites segments between kills. The broker is killed after a random while
of load, right after the upkeep reclaimed a segment, right after a segment was rotated, or
while a large transaction (more than a segment) is being sent or committed. After each restart
the queues are browsed and the durable subscriber takes what was kept for it, and the ledger of
`crash_ledger` checks: nothing lost, nothing resurrected, duplicates only for messages delivered
and not acknowledged, all flagged redelivered. At the end everything is drained, and one more
restart finds nothing.

The run is random, from a seed printed with every failure (SLUICEWAY_CRASH_SEED=N replays its
choices; the threads' timing differs from run to run). `./dev soak` runs it at length and prints
its figures.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import pytest

from sluiceway.protocol.frames import Frame
from sluiceway.testing import BrokerProcess
from tests.e2e.rawclient import RawClient
from tests.persistence.crash_clients import (
    DURABLE_CLIENT_ID,
    DURABLE_NAME,
    KEEP,
    QUEUES,
    RECEIPT_TIMEOUT_S,
    TOPIC,
    Client,
    Consumer,
    Life,
    Producer,
    TransactionalProducer,
    is_redelivered,
    key_of,
)
from tests.persistence.crash_ledger import Ledger
from tests.soak import iterations

KILLS: Final = iterations(suite=20, soak=200)
SEED_VARIABLE: Final = "SLUICEWAY_CRASH_SEED"
BROKER_ARGS: Final = (
    "-D",
    "imq.persist.file.segment.size=1m",
    # The durable subscriber takes everything kept for it at once after a restart.
    "-D",
    "imq.autocreate.topic.consumerFlowLimit=-1",
)
# How long the load runs before a kill: a random while, or until the moment a kill aims at
# (waited for at most MOMENT_WAIT_S, then the broker is killed anyway).
KILL_MOMENTS: Final = {"load": 4.0, "upkeep": 2.0, "rotation": 1.5, "large": 1.25, "commit": 1.25}
LOAD_S: Final = (0.2, 2.0)
MOMENT_WAIT_S: Final = 5.0
SAMPLE_S: Final = 0.005  # how often the journal directory is listed
JOIN_S: Final = 30.0  # the clients end as soon as their connections close; this is a bound
RECLAIMED: Final = re.compile(r"journal: (\d+) segments deleted, (\d+) compacted")
RECOVERED: Final = re.compile(r"journal: (\d+) segments, (\d+) records read; recovered (\d+)")


@dataclass
class Segments:
    """The journal's segment files as sampled over the run."""

    listed: set[str] = field(default_factory=set)
    seen: set[str] = field(default_factory=set)
    deleted: set[str] = field(default_factory=set)
    most: int = 0
    most_bytes: int = 0

    def sample(self, listing: dict[str, int]) -> tuple[set[str], set[str]]:
        """Take a listing of the segment files (name: bytes): (the new ones, the ones gone)
        since the last listing."""
        names, size = set(listing), sum(listing.values())
        new, gone = names - self.listed, self.listed - names
        self.seen |= names
        self.deleted |= gone
        self.listed = names
        self.most = max(self.most, len(names))
        self.most_bytes = max(self.most_bytes, size)
        return new, gone


def list_directory(journal: Path) -> dict[str, int]:
    """The segment files in a journal directory, and their sizes."""
    found = {}
    with os.scandir(journal) as entries:
        for entry in entries:
            if entry.name.endswith(".log"):
                with contextlib.suppress(FileNotFoundError):  # deleted since listed
                    found[entry.name] = entry.stat().st_size
    return found


Lister = Callable[[], dict[str, int]]


class JournalWatch(threading.Thread):
    """Samples the segment files and the broker's log while a broker runs: `rotated` is set
    when a segment file appears, `reclaimed` when one goes or the log says the upkeep deleted
    or compacted segments."""

    def __init__(
        self, lister: Lister, broker: BrokerProcess, segments: Segments, every: float = SAMPLE_S
    ) -> None:
        super().__init__(name="journal-watch", daemon=True)
        self.lister, self.every = lister, every
        self.broker = broker
        self.segments = segments
        self.stop = threading.Event()
        self.rotated = threading.Event()
        self.reclaimed = threading.Event()

    def run(self) -> None:
        lines = len(self.broker.lines)
        while not self.stop.wait(self.every):
            new, gone = self.segments.sample(self.lister())
            if new:
                self.rotated.set()
            logged = self.broker.lines[lines:]
            lines += len(logged)
            if gone or any(RECLAIMED.search(line) for line in logged):
                self.reclaimed.set()


@dataclass
class Figures:
    """What the run did, beyond the ledger's counts."""

    kills: Counter[str] = field(default_factory=Counter)  # by the moment aimed at
    missed: Counter[str] = field(default_factory=Counter)  # moments not reached in time
    deleted: int = 0  # segments deleted by the upkeep, from the broker's log
    compacted: int = 0
    torn: int = 0  # restarts that cut a torn write
    discarded_tx: int = 0  # restarts that discarded a transaction cut by the kill
    most_recovered: int = 0  # persistent messages recovered by one restart
    restarts_s: list[float] = field(default_factory=list)


class CrashLoop:
    """The run: one broker life after another on the same data directory, one ledger."""

    def __init__(
        self,
        data: Path,
        seed: int,
        *,
        args: tuple[str, ...] = (),
        lister: Lister | None = None,
        every: float = SAMPLE_S,
        forgetting: float = 0.0,
    ) -> None:
        """`args`: more broker arguments (another store); `lister` lists its segment files
        (by default, those of the journal directory), every `every` seconds; `forgetting`: see
        crash_ledger.Ledger."""
        self.data = data
        self.args = args
        self.lister = lister or (lambda: list_directory(data / "journal"))
        self.every = every
        self.seed = seed
        self.rng = random.Random(seed)
        self.ledger = Ledger(forgetting=forgetting)
        self.segments = Segments()
        self.figures = Figures()
        self.started = time.monotonic()

    def where(self, iteration: int, what: str) -> str:
        return (
            f"seed {self.seed} ({SEED_VARIABLE}={self.seed} replays its choices), kill "
            f"{iteration}: {what}\ndata directory: {self.data}"
        )

    def start(self) -> BrokerProcess:
        began = time.monotonic()
        broker = BrokerProcess(*BROKER_ARGS, *self.args, data_dir=str(self.data))
        self.figures.restarts_s.append(time.monotonic() - began)
        return broker

    def watch(self, broker: BrokerProcess) -> JournalWatch:
        return JournalWatch(self.lister, broker, self.segments, self.every)

    def life(self, iteration: int) -> None:
        """Restart, check, load, kill."""
        (moment,) = self.rng.choices(list(KILL_MOMENTS), list(KILL_MOMENTS.values()))
        life = Life(0, self.ledger)
        clients: list[Client] = []
        with self.start() as broker:
            life.port = broker.port
            watch = self.watch(broker)
            watch.start()
            try:
                durable, held = self.check(broker, iteration)
                clients = self.load(life, iteration, moment in ("large", "commit"), durable, held)
                if not self.wait_for(moment, life, watch):
                    self.figures.missed[moment] += 1
            finally:
                life.stop.set()
                self.ledger.killed()
                broker.kill()  # closes the clients' connections, which ends their threads
                watch.stop.set()
                for thread in [*clients, watch]:
                    thread.join(JOIN_S)
            self.read_log(broker.log)
        assert not life.failures, self.where(iteration, "\n".join(life.failures[:5]))
        stuck = [client.name for client in clients if client.is_alive()]
        assert not stuck, self.where(iteration, f"clients still running after the kill: {stuck}")
        self.figures.kills[moment] += 1

    def check(self, broker: BrokerProcess, iteration: int) -> tuple[RawClient, list[Frame]]:
        """Compare what the broker holds with the ledger. Returns the durable subscriber,
        subscribed and holding every message kept for it."""
        present = {queue: [key_of(m) for m in browse(broker.port, queue)] for queue in QUEUES}
        present[KEEP] = [key_of(m) for m in browse(broker.port, KEEP)]
        durable, held = durable_subscriber(broker.port)
        present[TOPIC] = [key_of(m) for m in held]
        try:
            self.ledger.after_restart(present)
            for message in held:
                self.ledger.delivered(key_of(message), TOPIC, is_redelivered(message))
            violations = self.ledger.take_violations()
        except BaseException:
            durable.close()
            raise
        if violations:
            durable.close()
            recovery = "".join(line for line in broker.lines if "journal" in line)
            raise AssertionError(
                self.where(iteration, f"{len(violations)} violations: {violations[:10]}")
                + f"\nthe broker's log of its recovery:\n{recovery}"
            )
        return durable, held

    def load(
        self, life: Life, iteration: int, large: bool, durable: RawClient, held: list[Frame]
    ) -> list[Client]:
        """Start the clients: three producers, one sending in transactions, two consumers per
        queue, the durable subscriber, and now and then one for the queue kept for later."""
        rng = self.rng
        keep = rng.choice((0.0, 0.0, 0.02, 0.1))  # share of plain SENDs to the kept queue
        spread = {QUEUES[0]: 0.4, QUEUES[1]: 0.4, TOPIC: 0.2 - keep, KEEP: keep}
        mixed = {QUEUES[0]: 0.4, QUEUES[1]: 0.4, TOPIC: 0.2}
        name = f"k{iteration}."
        large = large or rng.random() < 0.2
        clients: list[Client] = [
            Producer(life, f"{name}p{i}", rng.getrandbits(64), spread) for i in range(3)
        ]
        clients.append(TransactionalProducer(life, f"{name}t", rng.getrandbits(64), mixed, large))
        for queue in QUEUES:
            for i in range(2):
                share = rng.choice((0.0, 0.5, 1.0))  # of acknowledgements made in transactions
                seed = rng.getrandbits(64)
                clients.append(Consumer(life, f"{name}c{queue[-1]}{i}", seed, queue, share))
        share, seed = rng.choice((0.0, 0.5)), rng.getrandbits(64)
        clients.append(Consumer(life, f"{name}d", seed, TOPIC, share, client=durable, held=held))
        if rng.random() < 0.25:
            clients.append(Consumer(life, f"{name}k", rng.getrandbits(64), KEEP, 0.5))
        for client in clients:
            client.start()
        return clients

    def wait_for(self, moment: str, life: Life, watch: JournalWatch) -> bool:
        """Let the load run until the moment to kill; False if it did not come in time."""
        if moment == "load":
            life.failed.wait(self.rng.uniform(*LOAD_S))
            return True
        if moment == "large":
            return life.large_half_sent.wait(MOMENT_WAIT_S)
        if moment == "commit":
            return life.large_commit_sent.wait(MOMENT_WAIT_S)
        life.failed.wait(self.rng.uniform(0.2, 1.0))  # some history first
        event = watch.reclaimed if moment == "upkeep" else watch.rotated
        event.clear()
        return event.wait(MOMENT_WAIT_S)

    def read_log(self, log: str) -> None:
        figures = self.figures
        for deleted, compacted in RECLAIMED.findall(log):
            figures.deleted += int(deleted)
            figures.compacted += int(compacted)
        figures.torn += "torn by a crash" in log
        figures.discarded_tx += "discarded a transaction" in log
        for _, _, recovered in RECOVERED.findall(log):
            figures.most_recovered = max(figures.most_recovered, int(recovered))

    # -- the end -----------------------------------------------------------------------------

    def finish(self) -> None:
        """Check once more, drain everything, and find nothing after one more restart."""
        iteration = len(self.figures.restarts_s)
        with self.start() as broker:
            watch = self.watch(broker)
            watch.start()
            try:
                durable, held = self.check(broker, iteration)
                try:
                    drain(broker.port, self.ledger, durable, held)
                finally:
                    durable.close()
            finally:
                watch.stop.set()
                watch.join(JOIN_S)
            status, log = broker.stop()
            self.read_log(log)
            assert status == 0, self.where(iteration, f"stopping the broker: status {status}")
        violations = self.ledger.take_violations()
        assert not violations, self.where(iteration, f"while draining: {violations[:10]}")
        with self.start() as broker:
            durable, held = self.check(broker, iteration + 1)
            durable.close()
            assert not held
            broker.stop()
        unaccounted = self.ledger.unaccounted()
        assert not unaccounted, self.where(iteration, f"unaccounted for: {unaccounted[:10]}")

    def summary(self) -> str:
        ledger, figures, segments = self.ledger.figures, self.figures, self.segments
        moments = ", ".join(f"{figures.kills[m]} {m}" for m in KILL_MOMENTS)
        restarts = figures.restarts_s
        return (
            f"crash loop (seed {self.seed}): {sum(figures.kills.values())} SIGKILLs ({moments}; "
            f"moments not reached in {MOMENT_WAIT_S:.0f} s: {sum(figures.missed.values())}) in "
            f"{time.monotonic() - self.started:.0f} s. {ledger.sent:,} persistent messages sent, "
            f"{ledger.receipted:,} receipted; in flight at a kill {ledger.kept_in_doubt:,} kept "
            f"and {ledger.dropped_in_doubt:,} not; {ledger.open_at_kill:,} in transactions "
            f"still open at a kill, none kept; {ledger.aborted:,} aborted. "
            f"{ledger.commits:,} sending transactions committed, in flight at a kill "
            f"{ledger.commits_in_doubt['all']} kept whole and "
            f"{ledger.commits_in_doubt['none']} dropped whole. {ledger.acknowledged:,} "
            f"acknowledged ({ledger.ack_commits:,} acknowledging transactions committed; "
            f"ACKs in flight at a kill: {ledger.acks_in_doubt_applied:,} took effect, "
            f"{ledger.acks_in_doubt_undone:,} did not; acknowledging COMMITs in flight: "
            f"{ledger.ack_commits_in_doubt['all']} took effect, "
            f"{ledger.ack_commits_in_doubt['none']} did not). {ledger.deliveries:,} deliveries, "
            f"{ledger.duplicates:,} duplicates, {ledger.flagged:,} of them flagged redelivered; "
            f"lost {ledger.lost}, resurrected {ledger.resurrected}. Segment files: "
            f"{len(segments.seen)} created, {len(segments.deleted)} deleted, at most "
            f"{segments.most} at once ({segments.most_bytes / 2**20:.1f} MiB); the upkeep "
            f"logged {figures.deleted} deleted and {figures.compacted} compacted. Restarts took "
            f"{min(restarts):.1f} to {max(restarts):.1f} s, recovering up to "
            f"{figures.most_recovered:,} messages; {figures.torn} cut a torn write, "
            f"{figures.discarded_tx} discarded a transaction cut by the kill."
        )


def browse(port: int, queue: str) -> list[Frame]:
    client = RawClient(port, timeout=RECEIPT_TIMEOUT_S)
    try:
        client.connect()
        client.subscribe(queue, "browse", browser="true", ack="auto")
        messages: list[Frame] = []
        while True:
            (message,) = client.receive(1)
            if message.headers.get("browser") == "end":
                return messages
            messages.append(message)
    finally:
        client.close()


def take_all(client: RawClient) -> list[Frame]:
    """Every MESSAGE the broker sends without being acknowledged first."""
    taken: list[Frame] = []
    while True:
        client.sync()
        messages = client.drain()
        if not messages:
            return taken
        taken += messages


def durable_subscriber(port: int) -> tuple[RawClient, list[Frame]]:
    """The durable subscriber, subscribed with no flow limit; and what was kept for it."""
    client = RawClient(port, timeout=RECEIPT_TIMEOUT_S)
    try:
        client.connect(client_id=DURABLE_CLIENT_ID)
        client.subscribe(
            TOPIC, "d", durable_subscription_name=DURABLE_NAME, consumer_flow_limit="-1"
        )
        return client, take_all(client)
    except BaseException:
        client.close()
        raise


def drain(port: int, ledger: Ledger, durable: RawClient, held: list[Frame]) -> None:
    """Receive and acknowledge (with receipts) everything left, checking every delivery."""

    def acknowledge(client: RawClient, message: Frame) -> None:
        key = key_of(message)
        ledger.acking_one(key)
        client.request("ACK", {"id": message.headers["ack"]})
        ledger.acknowledged(key)

    for message in held:
        acknowledge(durable, message)
    assert not take_all(durable)
    for queue in (*QUEUES, KEEP):
        client = RawClient(port, timeout=RECEIPT_TIMEOUT_S)
        try:
            client.connect()
            client.subscribe(queue, "drain", consumer_flow_limit="1000")
            while messages := take_all(client):
                for message in messages:
                    ledger.delivered(key_of(message), queue, is_redelivered(message))
                    acknowledge(client, message)
        finally:
            client.close()


@pytest.fixture
def seed() -> int:
    chosen = os.environ.get(SEED_VARIABLE) or random.SystemRandom().randrange(2**32)
    return int(chosen)


@pytest.mark.slow
@pytest.mark.soak
@pytest.mark.timeout(120 + 15 * KILLS)
def test_persistent_messages_survive_repeated_sigkill(tmp_path: Path, seed: int) -> None:
    loop = CrashLoop(tmp_path / "data", seed)
    for iteration in range(KILLS):
        loop.life(iteration)
    loop.finish()
    print(loop.summary())
    ledger, segments, where = loop.ledger.figures, loop.segments, loop.where(KILLS, "")
    # The run did what it claims: load on every destination, in transactions too, duplicates
    # to check, and (unless SLUICEWAY_SOAK asked for a handful of kills) a journal of several
    # segments that the upkeep reclaimed.
    assert ledger.receipted > 100 * KILLS, where
    assert all(ledger.delivered_from[d] for d in (*QUEUES, TOPIC)), where
    assert ledger.commits, where
    assert ledger.ack_commits, where
    assert ledger.duplicates, where
    if KILLS >= 10:
        assert segments.most >= 3, where
        assert segments.deleted, where
        assert loop.figures.compacted, where
