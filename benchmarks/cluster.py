"""Broker clusters on PostgreSQL: what the shared store costs, what a second member brings, and
how long a takeover takes.

Everything runs on this machine: one PostgreSQL server of its own (Debian's binaries, in a
temporary directory, on loopback, fsync ON, as a production database would run), broker
processes (`sluiceway broker`), and `sluiceway bench` as the load generator, each measurement
`--runs` times (medians reported, every run kept in the results).

1. Persistent throughput: `sluiceway bench queue --persistent --receipts --window 100 --ack
   client-individual` (1 KiB bodies) against one broker on the file journal, then one broker on
   the jdbc store (a cluster of one), interleaved run by run.
2. One broker against two sharing the load: two `sluiceway bench` generators at once, each with
   its own queue, both against one member, then one against each of two members (the sum of
   their rates). On 2 cores shared by the brokers, the generators and PostgreSQL, the second
   member cannot add a core: this measures the cost of the cluster's machinery, not the gain
   of a second machine (see the plan in benchmarks/README.md).
3. Takeover time, with the default failure detection (heartbeat 2 s x 3, monitor 2 s x 1): a
   consumer connected to member a, 1,000 persistent messages receipted by member b (no
   consumer there), then b killed with SIGKILL; the time from the kill to the first of b's
   messages delivered to the consumer on a (and to the last).

    ./dev bench cluster [--runs 3] [--messages 50000] [--results FILE]

Results go to benchmarks/results/cluster.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Final

import stomp

from sluiceway import BUILD
from sluiceway.testing import BrokerProcess
from sluiceway.testing.postgres import PostgresServer, postgres_server

RESULTS: Final = Path(__file__).parent / "results" / "cluster.json"
BENCH_TIMEOUT: Final = 900.0  # seconds one `sluiceway bench` may take
TAKEOVER_WAIT: Final = 120.0  # seconds to wait for a takeover's messages
TAKEOVER_MESSAGES: Final = 1000


def member_args(url: str, broker_id: str) -> list[str]:
    """`sluiceway broker` arguments of cluster member `broker_id`, default timings."""
    properties = {
        "imq.cluster.ha": "true",
        "imq.cluster.clusterid": "bench",
        "imq.brokerid": broker_id,
        "imq.persist.store": "jdbc",
        "imq.persist.jdbc.postgresql.property.url": url,
    }
    return [arg for name, value in properties.items() for arg in ("-D", f"{name}={value}")]


def bench(port: int, queue: str, messages: int) -> dict[str, Any]:
    """One `sluiceway bench queue` run of persistent messages with receipts; its JSON."""
    command = [
        sys.executable, "-m", "sluiceway", "bench", "queue",
        "--port", str(port),
        "--destination", queue,
        "--messages", str(messages),
        "--size", "1024",
        "--persistent", "--receipts", "--window", "100",
        "--ack", "client-individual",
        "--json", "-",
    ]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=BENCH_TIMEOUT, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"sluiceway bench failed: {done.stderr.strip()}")
    result: dict[str, Any] = json.loads(done.stdout)
    if result["missing"] or result["duplicated"]:
        raise RuntimeError(f"the bench lost or duplicated messages: {result}")
    return result


def both(jobs: list[tuple[int, str]], messages: int) -> float:
    """Several bench runs at once; the sum of their received/s."""
    results: list[dict[str, Any]] = []
    threads = [
        threading.Thread(target=lambda j=job: results.append(bench(j[0], j[1], messages)))
        for job in jobs
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(BENCH_TIMEOUT)
    if len(results) != len(jobs):
        raise RuntimeError("a bench run did not finish")
    return sum(float(result["received_per_second"]) for result in results)


def fresh_database(server: PostgresServer, name: str) -> str:
    return server.create_database(name)


@contextmanager
def members(url: str, *ids: str) -> Iterator[list[BrokerProcess]]:
    with ExitStack() as stack:
        started = [stack.enter_context(BrokerProcess(*member_args(url, i))) for i in ids]
        yield started


def throughput(server: PostgresServer, runs: int, messages: int) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = {"file": [], "jdbc": []}
    for run in range(runs):
        with BrokerProcess() as broker:
            figures["file"].append(
                bench(broker.port, "/queue/file", messages)["received_per_second"]
            )
        url = fresh_database(server, f"throughput_{run}")
        with members(url, "a") as (broker,):
            figures["jdbc"].append(
                bench(broker.port, "/queue/jdbc", messages)["received_per_second"]
            )
        print(
            f"  run {run + 1}: file {figures['file'][-1]:,.0f}/s, jdbc {figures['jdbc'][-1]:,.0f}/s"
        )
    return figures


def sharing(server: PostgresServer, runs: int, messages: int) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = {"one member": [], "two members": []}
    half = messages // 2
    for run in range(runs):
        url = fresh_database(server, f"sharing_{run}")
        with members(url, "a", "b") as (a, b):
            figures["one member"].append(both([(a.port, "/queue/s1"), (a.port, "/queue/s2")], half))
            figures["two members"].append(
                both([(a.port, "/queue/s3"), (b.port, "/queue/s4")], half)
            )
        print(
            f"  run {run + 1}: one member {figures['one member'][-1]:,.0f}/s, "
            f"two members {figures['two members'][-1]:,.0f}/s"
        )
    return figures


class Arrivals(stomp.ConnectionListener):  # type: ignore[misc]
    """When each message of the failed member arrived."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.done = threading.Event()

    def on_message(self, frame: Any) -> None:
        self.times.append(time.monotonic())
        if len(self.times) >= TAKEOVER_MESSAGES:
            self.done.set()


def takeover(server: PostgresServer, runs: int) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = {"first message (s)": [], "last message (s)": []}
    for run in range(runs):
        url = fresh_database(server, f"takeover_{run}")
        with members(url, "a", "b") as (a, b):
            producer = stomp.Connection12([("127.0.0.1", b.port)])
            receipts = threading.Event()
            producer.set_listener("receipts", _ReceiptListener(receipts))
            producer.connect(wait=True)
            for n in range(TAKEOVER_MESSAGES):
                last = n == TAKEOVER_MESSAGES - 1
                headers = {"persistent": "true", **({"receipt": "last"} if last else {})}
                producer.send("/queue/taken", f"m{n}", headers=headers)
            if not receipts.wait(60):
                raise RuntimeError("member b did not receipt the messages")
            # No consumer anywhere until b is gone: what reaches a then comes from b's store.
            killed = time.monotonic()
            b.kill()
            arrivals = Arrivals()
            consumer = stomp.Connection12([("127.0.0.1", a.port)])
            consumer.set_listener("arrivals", arrivals)
            consumer.connect(wait=True)
            consumer.subscribe("/queue/taken", id="1", ack="auto")
            if not arrivals.done.wait(TAKEOVER_WAIT):
                raise RuntimeError(f"only {len(arrivals.times)} of b's messages reached a")
            figures["first message (s)"].append(arrivals.times[0] - killed)
            figures["last message (s)"].append(arrivals.times[-1] - killed)
            consumer.disconnect()
        print(
            f"  run {run + 1}: first of b's messages on a {figures['first message (s)'][-1]:.1f} s "
            f"after the kill, last {figures['last message (s)'][-1]:.1f} s"
        )
    return figures


class _ReceiptListener(stomp.ConnectionListener):  # type: ignore[misc]
    def __init__(self, event: threading.Event) -> None:
        self._event = event

    def on_receipt(self, frame: Any) -> None:
        self._event.set()


def medians(figures: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(values) for name, values in figures.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    report: dict[str, Any] = {
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores",
        "build": BUILD.reason,
        "messages": args.messages,
        "runs": args.runs,
    }
    with postgres_server(fsync=True) as server:
        print("persistent throughput, file journal against the jdbc store (received/s)")
        report["throughput"] = figures = throughput(server, args.runs, args.messages)
        print(f"  medians: {medians(figures)}")
        print("two generators: both on one member, then one on each of two (received/s)")
        report["sharing"] = figures = sharing(server, args.runs, args.messages)
        print(f"  medians: {medians(figures)}")
        print("takeover: from kill -9 to the failed member's messages on another member")
        report["takeover"] = figures = takeover(server, args.runs)
        print(f"  medians: {medians(figures)}")
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(report, indent=2) + "\n")
    print(f"results: {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
