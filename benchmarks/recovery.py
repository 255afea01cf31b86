"""Recovery speed: journal replay in MB/s and records/s, and a broker's start-to-ready time.

For each size (by default a journal of a few records, then about 100 MB and 1 GB) a data
directory is built under a temporary folder, then measured, then deleted:

- Building goes through the broker's core in-process, as `session_path.py` drives it (a
  `StompSession` fed reads of SEND frames and the consumer's ACKs, no sockets): the journal is
  written by the code that writes it in a running broker, so its records have the shape real
  traffic leaves (ADDs, the DELIVERED_RUN of each write to the consumer, the REMOVE_RUN of each
  read of ACKs, or a REMOVE where the message's segment is no longer the active one, SEQ blocks,
  and the snapshots that start each 64 MiB segment), at several times the speed of a broker
  fed over sockets. A producer sends persistent 1 KiB messages to two queues in turn; a consumer
  (client-individual acks, prefetch 1000) drains `/queue/recovery-consumed` as they arrive, and
  `/queue/recovery-waiting` keeps everything: half the messages are consumed, spread evenly
  over the segments. The broker's once-a-second upkeep (rotating, deleting dead segments,
  compacting mostly dead ones) runs every 20,000 messages, about a second at the rate a broker
  takes persistent messages with a consumer attached; with half of each segment live, it
  deletes and compacts nothing, so the journal keeps its size. Last, a consumer of the waiting
  queue takes one window of 1,000 messages and goes away without acknowledging them: those come
  back redelivered. The files are fsynced before anything is measured.
- Replay (in a child process, `JournalStore.recover` over the journal, both passes, the
  recovered messages counted and dropped): seconds, MB/s (journal bytes, 10^6 a MB), records/s
  and the child's peak RSS.
- Start to ready: `sluiceway broker --data-dir DIR --port 0 -D imq.admin.http.port=-1` from
  the process's start to its ready line, and its peak RSS (VmHWM) at that moment. Each run gets
  a copy of the data directory (every segment but the last hard-linked, so the journal measured
  is the same each time), and is stopped with SIGTERM.

The page cache holds the journal (it was just written), as on a restart; with `--cold` its pages
are dropped from the cache before each run (posix_fadvise, only the journal's files), as after
a boot. Prints a table and writes benchmarks/results/recovery.json (or `--results FILE`).

    ./dev bench recovery [--sizes 0,100,1000] [--runs 5] [--cold] [--results FILE]
    ./dev bench recovery --build DIR --sizes 1000      # build DIR/1000mb and keep it
    ./dev bench recovery --measure DIR/1000mb [--runs 5]   # measure one built before

`--measure` run by another build's Python (another checkout's .venv/bin/python) compares two
builds on the very same data directory.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from sluiceway import BUILD
from sluiceway.app.storage import Storage
from sluiceway.config import load_config
from sluiceway.core.broker import Broker
from sluiceway.persist.journal import Journal
from sluiceway.persist.journal_store import JournalStore
from sluiceway.persist.restoring import Delivering
from sluiceway.session.session import StompSession
from sluiceway.testing import BrokerProcess

RESULTS: Final = Path(__file__).parent / "results" / "recovery.json"
MB: Final = 10**6
BODY: Final = b"x" * 1024
READ: Final = 100  # SENDs per read, half to each queue
UPKEEP_EVERY: Final = 20_000  # messages between two runs of the broker's upkeep (its tick)
CONSUMED: Final = "/queue/recovery-consumed"
WAITING: Final = "/queue/recovery-waiting"
UNACKED: Final = 1000  # messages of the waiting queue delivered and never acknowledged
EVERYTHING: Final = 10**18  # a journal position past any: every control frame may go
ACK_ID: Final = re.compile(rb"\nack:([^\n]*)\n")
BUILD_PROPERTIES: Final = (
    "imq.persist.file.sync.policy=os",  # the same bytes as under `group`, without the waits
    "imq.autocreate.destination.maxNumMsgs=-1",  # the waiting queue holds them all...
    "imq.throttling.server.threshold=0",  # ...and its producer is never held
)
BROKER_ARGS: Final = ("-D", "imq.admin.http.port=-1")
START_TIMEOUT: Final = 300.0  # seconds


# -- building ------------------------------------------------------------------------------------


def _session(broker: Broker) -> StompSession:
    session = StompSession(broker, on_ready=lambda: None, peer="build")
    session.receive_data(b"CONNECT\naccept-version:1.2\nheart-beat:0,0\n\n\0")
    session.data_to_send(EVERYTHING)
    return session


def _subscribe(session: StompSession, destination: str) -> None:
    frame = f"SUBSCRIBE\ndestination:{destination}\nid:s\nack:client-individual\n\n\0"
    session.receive_data(frame.encode())
    session.data_to_send(EVERYTHING)


def _sends() -> bytes:
    """One read of the producer: persistent SENDs to the two queues in turn."""
    frames = []
    for i in range(READ):
        destination = CONSUMED if i % 2 == 0 else WAITING
        head = f"SEND\ndestination:{destination}\npersistent:true\ncontent-length:{len(BODY)}\n"
        frames.append(head.encode() + b"\n" + BODY + b"\0")
    return b"".join(frames)


def _consume(consumer: StompSession, *, ack: bool) -> int:
    """Take what the consumer was given (acknowledged, if `ack`); return how many."""
    data, count = consumer.take_payload(EVERYTHING)
    if ack and count:
        consumer.receive_data(b"".join(b"ACK\nid:%s\n\n\0" % i for i in ACK_ID.findall(data)))
    return count


def build(directory: Path, size: int) -> dict[str, Any]:
    """Fill `directory` with a broker's data until its journal holds `size` bytes."""
    overrides = [f"imq.persist.file.directory={directory}", *BUILD_PROPERTIES]
    # The memory level turns YELLOW each time the waiting queue reaches the swap point, as
    # expected: not worth a warning per time while building.
    logging.getLogger("sluiceway").setLevel(logging.ERROR)
    storage = Storage(load_config(None, overrides))
    started = time.monotonic()
    try:
        broker, _ = storage.open_broker()
        store = broker.store
        assert isinstance(store, JournalStore)
        producer, consumer = _session(broker), _session(broker)
        _subscribe(consumer, CONSUMED)
        sends, sent = _sends(), 0
        while store.disk_bytes() < size:
            producer.receive_data(sends)
            store.flush()
            producer.data_to_send(EVERYTHING)
            _consume(consumer, ack=True)
            broker.settle()
            store.flush()
            sent += READ
            if sent % UPKEEP_EVERY == 0:
                broker.tick()
        late = _session(broker)  # takes a window, then goes away: redelivered after a restart
        _subscribe(late, WAITING)
        unacked = _consume(late, ack=False)
        late.connection_lost()
        broker.tick()
        store.flush()
    finally:
        storage.close()
    _fsync_tree(directory)
    return {"messages": sent, "unacked": unacked, "build_seconds": time.monotonic() - started}


def _fsync_tree(directory: Path) -> None:
    """Write back what the build left to the OS, so no measured recovery pays for it."""
    for path in sorted(directory.rglob("*")):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def journal_bytes(directory: Path) -> int:
    return sum(path.stat().st_size for path in (directory / "journal").glob("*.log"))


def copy_data(source: Path, target: Path) -> None:
    """A data directory holding the same journal: the segments recovery only reads are hard
    links; the last one, which a broker appends to, is copied."""
    journal = target / "journal"
    journal.mkdir(parents=True)
    segments = sorted((source / "journal").glob("*.log"))
    for segment in segments[:-1]:
        os.link(segment, journal / segment.name)
    if segments:
        shutil.copy2(segments[-1], journal / segments[-1].name)


# -- measuring -----------------------------------------------------------------------------------


def peak_rss_mib(pid: int | str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc status")


def replay_child(directory: Path) -> None:
    """In a child process: recover the store once and print what it took, as JSON."""
    recovered = 0

    def deliver(_message: object) -> None:
        nonlocal recovered
        recovered += 1

    store = JournalStore(Journal(directory / "journal"))
    started = time.perf_counter()
    store.recover(Delivering(deliver))
    seconds = time.perf_counter() - started
    report = store.journal.report
    store.close()
    row = {"seconds": seconds, "records": report.records, "messages": recovered}
    print(json.dumps({**row, "peak_rss_mib": peak_rss_mib("self")}))


def drop_cached(directory: Path) -> None:
    """--cold: take the journal's pages (only those) out of the page cache, as after a boot."""
    for path in (directory / "journal").glob("*.log"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def replay(directory: Path, *, cold: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="recovery-run-") as run:
        copy_data(directory, Path(run))
        if cold:
            drop_cached(Path(run))
        command = [sys.executable, __file__, "--replay-child", run]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
    row: dict[str, Any] = json.loads(done.stdout)
    return row


def start(directory: Path, *, cold: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="recovery-run-") as run:
        copy_data(directory, Path(run))
        if cold:
            drop_cached(Path(run))
        started = time.perf_counter()
        broker = BrokerProcess(*BROKER_ARGS, data_dir=run, timeout=START_TIMEOUT)
        seconds = time.perf_counter() - started
        try:
            peak = peak_rss_mib(broker.process.pid)
        finally:
            status, log = broker.stop()
    if status not in (0, -signal.SIGTERM):  # (SIGTERM may come before its handler is set)
        raise RuntimeError(f"the broker exited with status {status}:\n{log}")
    found = re.search(r"recovered (\d+) persistent messages", log)
    return {"seconds": seconds, "peak_rss_mib": peak, "messages": int(found[1]) if found else 0}


def measure(directory: Path, runs: int, *, cold: bool = False) -> dict[str, Any]:
    """Replay and start `runs` times each, interleaved; every run's figures and the medians."""
    size = journal_bytes(directory)
    replays, starts = [], []
    for _ in range(runs):
        replays.append(replay(directory, cold=cold))
        starts.append(start(directory, cold=cold))
    seconds = statistics.median(r["seconds"] for r in replays)
    return {
        "journal_mb": size / MB,
        "segments": len(list((directory / "journal").glob("*.log"))),
        "records": replays[0]["records"],
        "live_messages": replays[0]["messages"],
        "replay_seconds": seconds,
        "replay_mb_per_s": size / MB / seconds,
        "replay_records_per_s": replays[0]["records"] / seconds,
        "replay_peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in replays),
        "ready_seconds": statistics.median(s["seconds"] for s in starts),
        "ready_peak_rss_mib": statistics.median(s["peak_rss_mib"] for s in starts),
        "replay_runs": replays,
        "start_runs": starts,
    }


# -- the command ---------------------------------------------------------------------------------


def _table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| journal | live messages | records | replay | replay MB/s | replay records/s "
        "| replay peak RSS | start to ready | broker peak RSS |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['journal_mb']:,.0f} MB | {row['live_messages']:,} | {row['records']:,} "
            f"| {row['replay_seconds']:.2f} s | {row['replay_mb_per_s']:,.0f} "
            f"| {row['replay_records_per_s']:,.0f} | {row['replay_peak_rss_mib']:,.0f} MiB "
            f"| {row['ready_seconds']:.2f} s | {row['ready_peak_rss_mib']:,.0f} MiB |"
        )
    return "\n".join(lines)


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", default="0,100,1000", help="journal sizes, MB (10^6 bytes); 0: nearly empty"
    )
    parser.add_argument("--runs", type=int, default=5, help="replays and starts per size")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--build", type=Path, metavar="DIR", help="build into DIR and keep it")
    parser.add_argument("--measure", type=Path, metavar="DIR", help="measure DIR, built before")
    parser.add_argument("--cold", action="store_true", help="the journal not in the page cache")
    parser.add_argument("--replay-child", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = _parse()
    if args.replay_child is not None:
        replay_child(args.replay_child)
        return
    sizes = [int(float(size) * MB) for size in args.sizes.split(",")]
    if args.build is not None:
        for size in sizes:
            print(json.dumps(build(args.build / f"{size // MB}mb", size)), flush=True)
        return
    if args.measure is not None:
        rows = [measure(args.measure, args.runs, cold=args.cold)]
    else:
        rows = []
        for size in sizes:
            with tempfile.TemporaryDirectory(prefix="recovery-") as directory:
                built = build(Path(directory), size)
                print(json.dumps(built), flush=True)
                rows.append({**built, **measure(Path(directory), args.runs, cold=args.cold)})
    report(rows, args)


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    for row in rows:
        print(json.dumps({k: v for k, v in row.items() if not k.endswith("_runs")}), flush=True)
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    results = {
        "machine": machine,
        "build": BUILD.reason,
        "page_cache": "cold" if args.cold else "warm",
        "runs_per_size": args.runs,
        "sizes": rows,
    }
    args.results.parent.mkdir(exist_ok=True)
    args.results.write_text(json.dumps(results, indent=2) + "\n")
    print()
    print(_table(rows))


if __name__ == "__main__":
    main()
