"""The broker's CPU per message on the session path, in-process: no sockets, no event loop.

One producer session and its consumer sessions, each a `StompSession` fed bytes the way the I/O
layer feeds them: a read of 100 SENDs, the MESSAGE frames that follow, a read of the consumers'
ACKs (one ACK per message, as `sluiceway bench` consumers send them). What is timed is everything
the broker does for those bytes (decoding, flow control, dispatch, encoding, the journal records
with the `os` sync policy), measured as process CPU time with the broker's own collector
settings: the median and the best of five rounds. Without the machine's other processes in the
way it moves far less from run to run than the socket benchmarks, so it shows what a change to
the broker's own code is worth.

    .venv/bin/python benchmarks/session_path.py [--scenario queue|persistent|topic] [--messages N]
    .venv/bin/python benchmarks/session_path.py --instructions [--scenario ...] [--messages N]

`--instructions` counts instead of timing: it runs the path under valgrind (`apt-get install
valgrind`) once with N messages and once with none, each after the same warm-up, and prints the
difference per message. A machine's other work does not change that count, so it shows a change
worth a few percent that the timings cannot tell from noise.

Scenarios: `queue` (non-persistent, client-individual acks), `persistent` (persistent, a
receipt per SEND, client-individual acks), `topic` (non-persistent, four ack:auto subscribers;
the cost per message published, fanned out four times).
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Final

from sluiceway import BUILD
from sluiceway.app.storage import Storage
from sluiceway.collector import tune_collector
from sluiceway.config import load_config
from sluiceway.core.broker import Broker
from sluiceway.session.session import StompSession

READ: Final = 100  # SENDs per read
BODY: Final = b"x" * 1024
ROUNDS: Final = 5
EVERYTHING: Final = 10**18  # a journal position past any: every control frame may go
ACK_ID: Final = re.compile(rb"\nack:([^\n]*)\n")
WARM_UP: Final = 2_000  # messages before the counted pass (--instructions)
INSTRUCTIONS: Final = re.compile(r"I\s+refs:\s+([\d,]+)")


class SessionPath:
    """A producer and its consumers, driven a read at a time."""

    def __init__(self, broker: Broker, scenario: str) -> None:
        self.broker = broker
        self.topic = scenario == "topic"
        self.producer = self._session()
        self.consumers = [self._session() for _ in range(4 if self.topic else 1)]
        destination = "/topic/bench" if self.topic else "/queue/bench"
        ack = "auto" if self.topic else "client-individual"
        for number, consumer in enumerate(self.consumers):
            consumer.receive_data(
                f"SUBSCRIBE\ndestination:{destination}\nid:s{number}\nack:{ack}\n\n\0".encode()
            )
            consumer.data_to_send(EVERYTHING)
        persistent = scenario == "persistent"
        sends = []
        for i in range(READ):
            head = f"SEND\ndestination:{destination}\ncontent-length:{len(BODY)}\n"
            if persistent:
                head += f"persistent:true\nreceipt:r{i}\n"
            sends.append(head.encode() + b"\n" + BODY + b"\0")
        self.read = b"".join(sends)

    def _session(self) -> StompSession:
        session = StompSession(self.broker, on_ready=lambda: None, peer="bench")
        session.receive_data(b"CONNECT\naccept-version:1.2\nheart-beat:0,0\n\n\0")
        session.data_to_send(EVERYTHING)
        return session

    def run(self, messages: int) -> int:
        """Send `messages` (a multiple of READ) through; return how many MESSAGEs went out."""
        delivered = 0
        store = self.broker.store
        for _ in range(messages // READ):
            self.producer.receive_data(self.read)
            store.flush()
            self.producer.data_to_send(EVERYTHING)
            for consumer in self.consumers:
                data, count = consumer.take_payload(1000)
                delivered += count
                if not self.topic:
                    ids = ACK_ID.findall(data)
                    consumer.receive_data(b"".join(b"ACK\nid:%s\n\n\0" % i for i in ids))
            self.broker.settle()
            store.flush()
        return delivered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=("queue", "persistent", "topic"), default="queue")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument(
        "--instructions", action="store_true", help="count instructions (valgrind) instead"
    )
    # One pass of N messages after WARM_UP, nothing printed: what --instructions counts.
    parser.add_argument("--single-pass", type=int, metavar="N", help=argparse.SUPPRESS)
    args = parser.parse_args()
    messages = max(READ, args.messages // READ * READ)
    if args.instructions:
        count_instructions(args.scenario, messages)
        return
    with tempfile.TemporaryDirectory() as directory:
        config = load_config(
            None,
            [f"imq.persist.file.directory={directory}", "imq.persist.file.sync.policy=os"],
        )
        storage = Storage(config)
        try:
            broker, _ = storage.open_broker()
            path = SessionPath(broker, args.scenario)
            if args.single_pass is not None:
                path.run(WARM_UP)
                tune_collector()
                path.run(args.single_pass // READ * READ)
                return
            path.run(messages // 4)  # warm up: destinations created, caches filled
            tune_collector()  # as a running broker does
            rounds = []
            for _ in range(ROUNDS):
                start = time.process_time()
                delivered = path.run(messages)
                rounds.append((time.process_time() - start) / messages * 1e6)
        finally:
            storage.close()
    expected = messages * len(path.consumers)
    if delivered != expected:
        raise SystemExit(f"{delivered} MESSAGE frames went out, {expected} expected")
    print(
        f"{args.scenario}: {statistics.median(rounds):.1f} microseconds of CPU per message "
        f"(median of {ROUNDS} rounds of {messages}; best {min(rounds):.1f}; {BUILD.reason})"
    )


def count_instructions(scenario: str, messages: int) -> None:
    """Print the instructions per message: a pass of `messages` counted by valgrind, less a
    pass of none (start-up, set-up and warm-up are the same in both)."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("--instructions needs valgrind: apt-get install valgrind")
    counts = []
    for count in (0, messages):
        command = [
            valgrind,
            "--tool=cachegrind",
            "--cache-sim=no",
            "--cachegrind-out-file=/dev/null",
        ]
        command += [sys.executable, __file__, "--scenario", scenario, "--single-pass", str(count)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        found = INSTRUCTIONS.search(done.stderr)
        if done.returncode != 0 or found is None:
            raise SystemExit(f"valgrind failed ({done.returncode}):\n{done.stderr[-2000:]}")
        counts.append(int(found.group(1).replace(",", "")))
    per_message = (counts[1] - counts[0]) / messages
    print(f"{scenario}: {per_message:,.0f} instructions per message (a pass of {messages})")


if __name__ == "__main__":
    main()
