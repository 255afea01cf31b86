"""Earliest deadline first against FIFO: how many messages meet their deadline under overload.

For each delivery order (`fifo`, `deadline`): a fresh broker (`imq.autocreate.queue.deliveryOrder`
set), one queue, a producer and a consumer, each a process of its own (spawn), on blocking
sockets with the project's STOMP codec. benchmarks/deadlines.md describes the method:

- The producer sends message i at start + i / rate for `--seconds`, each of a class of `--mix`
  (a time to live, giving its `expires` header, or none), drawn from a seeded generator: the
  same sequence for every run and order. The default rate is `--overload` times what the
  consumer's service time allows.
- The consumer (`ack:client-individual`, `consumer-flow-limit` 10) spends `--service-ms` on each
  message, then acknowledges it. A message with a deadline is on time when acknowledged before
  it, late when after it, never delivered when the broker let it expire.
- After the last send the run goes on until the admin API shows the queue empty; the broker's
  own counts (`expired`, `late`, `deadline_misses`) are then read from it.

    .venv/bin/python benchmarks/deadlines.py --seconds 20 --runs 3

`--runs N` alternates the orders and reports medians with the range. Results go to
benchmarks/results/deadlines.json (`--json`). Exit status: 0; 1 when a message is unaccounted for
(counted twice, or neither acknowledged nor expired in the broker); 2 when a process failed.
"""

from __future__ import annotations

import argparse
import array
import contextlib
import ctypes
import gc
import json
import math
import multiprocessing
import os
import random
import socket
import statistics
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any, Final

from sluiceway.protocol.codec import FrameDecoder, encode_frame
from sluiceway.protocol.frames import Frame
from sluiceway.testing import BrokerProcess

RESULTS: Final = Path(__file__).parent / "results" / "deadlines.json"
ORDERS: Final = ("fifo", "deadline")
QUEUE: Final = "deadlines"
PR_SET_TIMERSLACK: Final = 29  # <linux/prctl.h>
CONNECT_TIMEOUT: Final = 10.0  # seconds for a connection, and for each answer the broker owes
READ_SIZE: Final = 65536
POLL: Final = 0.1  # seconds between looks at the admin API, and the consumer's read timeout
START_WAIT: Final = 30.0  # seconds for a process to connect and say it is ready
SWEEP_SECONDS: Final = 1  # imq.message.expiration.interval of the broker under test
BUILD_LINE: Final = "per-message path: "  # the broker logs which build it runs after this


@dataclass(frozen=True, slots=True)
class Kind:
    """One class of the mix: messages with time to live `ttl_ms` (None: no `expires`)."""

    name: str
    ttl_ms: int | None
    weight: float


def parse_mix(text: str) -> list[Kind]:
    """`TTL:WEIGHT,...` (TTL in ms, or `none`) as classes; ValueError naming what is wrong."""
    kinds: list[Kind] = []
    for part in text.split(","):
        ttl_text, colon, weight_text = part.strip().partition(":")
        if not colon:
            raise ValueError(f"{part.strip()!r} is not TTL:WEIGHT (e.g. 200:45 or none:10)")
        try:
            ttl = None if ttl_text == "none" else int(ttl_text)
            weight = float(weight_text)
        except ValueError:
            raise ValueError(
                f"{part.strip()!r}: TTL must be whole milliseconds or none, WEIGHT a number"
            ) from None
        if (ttl is not None and ttl <= 0) or not weight > 0 or not math.isfinite(weight):
            raise ValueError(f"{part.strip()!r}: TTL and WEIGHT must be above 0")
        name = "none" if ttl is None else f"{ttl}ms"
        if any(kind.name == name for kind in kinds):
            raise ValueError(f"the time to live {ttl_text} appears twice")
        kinds.append(Kind(name, ttl, weight))
    if all(kind.ttl_ms is None for kind in kinds):
        raise ValueError("at least one class needs a time to live: deadlines are the point")
    return kinds


# ---------------------------------------------------------------- the two client processes


class Stomp:
    """One STOMP 1.2 connection on a blocking socket."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=CONNECT_TIMEOUT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = FrameDecoder()
        self.send(Frame("CONNECT", {"accept-version": "1.2", "host": "/", "heart-beat": "0,0"}))
        self.expect("CONNECTED")

    def send(self, frame: Frame) -> None:
        self.sock.sendall(encode_frame(frame))

    def next_frame(self) -> Frame | None:
        """The next frame already read, or None."""
        while (event := self.decoder.next_event()) is not None:
            if isinstance(event, Frame):
                if event.command == "ERROR":
                    raise RuntimeError(f"the broker sent ERROR: {event.headers.get('message')}")
                return event
        return None

    def read(self) -> bool:
        """Read what the broker sent (False when nothing came within the socket's timeout)."""
        try:
            chunk = self.sock.recv(READ_SIZE)
        except TimeoutError:
            return False
        if not chunk:
            raise RuntimeError("the broker closed the connection")
        self.decoder.receive_data(chunk)
        return True

    def expect(self, command: str) -> None:
        """Wait for a `command` frame, passing over any other."""
        while (frame := self.next_frame()) is None or frame.command != command:
            if frame is None and not self.read():
                raise RuntimeError(f"no {command} from the broker within {CONNECT_TIMEOUT} s")

    def close(self) -> None:
        """DISCONNECT, once the broker has handled everything sent before it."""
        self.send(Frame("DISCONNECT", {"receipt": "bye"}))
        self.expect("RECEIPT")
        self.sock.close()


def fine_sleeps() -> None:
    """Sleeps that end within microseconds of their time, where Linux allows."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)


def producer(settings: dict[str, Any], control: Any, results: Any) -> None:
    """Send message i of class kinds[i] at start + i / rate; `start` arrives on `control`."""
    fine_sleeps()
    conn = Stomp(settings["port"])
    kinds = array.array("B", settings["kinds"])
    ttls: list[int | None] = settings["ttls"]
    sent_ns = array.array("q", [0]) * len(kinds)  # wall clock, by sequence number
    expires = array.array("q", [0]) * len(kinds)  # ms since the epoch; 0: none
    period = 1e9 / settings["rate"]
    results.put(("producer-ready", os.getpid()))
    start: int = control.get(timeout=START_WAIT)
    for seq, kind in enumerate(kinds):
        scheduled = start + round(seq * period)
        delay = scheduled - time.monotonic_ns()
        if delay > 0:
            time.sleep(delay / 1e9)
        headers = {"destination": f"/queue/{QUEUE}"}
        now = time.time_ns()
        ttl = ttls[kind]
        if ttl is not None:
            expires[seq] = now // 1_000_000 + ttl
            headers["expires"] = str(expires[seq])
        sent_ns[seq] = now
        conn.send(Frame("SEND", headers, str(seq).encode().ljust(settings["body_size"])))
    conn.close()
    results.put(("producer", {"sent_ns": sent_ns.tobytes(), "expires": expires.tobytes()}))


def consumer(settings: dict[str, Any], stop: Any, results: Any) -> None:
    """Take each message for `service_ms`, then ACK it, until `stop` is set."""
    fine_sleeps()
    conn = Stomp(settings["port"])
    subscribe = {"destination": f"/queue/{QUEUE}", "id": "0", "ack": "client-individual"}
    subscribe["consumer-flow-limit"] = str(settings["flow_limit"])
    conn.send(Frame("SUBSCRIBE", {**subscribe, "receipt": "subscribed"}))
    conn.expect("RECEIPT")
    conn.sock.settimeout(POLL)
    total = len(settings["kinds"])
    taken_ns = array.array("q", [-1]) * total  # wall clock the work on it began; -1: never
    acked_ns = array.array("q", [-1]) * total  # wall clock its ACK was written
    duplicated = unexpected = 0
    service = settings["service_ms"] / 1000
    spin = settings["work"] == "spin"
    results.put(("consumer-ready", os.getpid()))
    while not stop.is_set():
        if not conn.read():
            continue
        while (frame := conn.next_frame()) is not None:
            if frame.command != "MESSAGE":
                continue
            taken = time.time_ns()
            until = time.perf_counter() + service
            if spin:
                while time.perf_counter() < until:
                    pass
            elif (left := until - time.perf_counter()) > 0:
                time.sleep(left)
            acked = time.time_ns()
            conn.send(Frame("ACK", {"id": frame.headers["ack"]}))
            seq = int(frame.body.split(maxsplit=1)[0])
            if not 0 <= seq < total:
                unexpected += 1
            elif acked_ns[seq] >= 0:
                duplicated += 1
            else:
                taken_ns[seq], acked_ns[seq] = taken, acked
    conn.sock.settimeout(CONNECT_TIMEOUT)
    conn.close()
    report = {"taken_ns": taken_ns.tobytes(), "acked_ns": acked_ns.tobytes()}
    results.put(("consumer", {**report, "duplicated": duplicated, "unexpected": unexpected}))


# ---------------------------------------------------------------- one run, in the parent


def cpu_seconds(pid: int) -> float:
    """utime + stime of a live process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def queue_detail(admin_port: int) -> dict[str, Any]:
    """The queue as the broker's admin API shows it (summary, totals, properties...)."""
    url = f"http://127.0.0.1:{admin_port}/api/v1/destinations/queue/{QUEUE}"
    with urllib.request.urlopen(url, timeout=CONNECT_TIMEOUT) as response:
        detail: dict[str, Any] = json.load(response)
    return detail


@contextlib.contextmanager
def started_broker(order: str, properties: list[str]) -> Iterator[BrokerProcess]:
    """A fresh broker whose auto-created queues deliver in `order`, stopped however it ends."""
    options = ["-D", f"imq.autocreate.queue.deliveryOrder={order}"]
    options += ["-D", f"imq.message.expiration.interval={SWEEP_SECONDS}"]
    for item in properties:
        options += ["-D", item]
    try:
        broker = BrokerProcess(*options)
    except RuntimeError as exc:  # its message holds the whole log: keep the last line
        last = [line for line in str(exc).splitlines() if line.strip()][-1:]
        raise RuntimeError(f"the broker did not start: {' '.join(last).strip()}") from None
    with broker:
        yield broker
        broker.stop()


class Run:
    """The processes of one run and the reports they sent."""

    def __init__(self, broker: BrokerProcess, processes: list[Any], results: Any) -> None:
        self.broker = broker
        self.processes = processes
        self.results = results
        self.reports: dict[str, Any] = {}

    def check(self) -> None:
        for process in self.processes:
            if process.exitcode not in (None, 0):
                raise RuntimeError(f"the {process.name} failed (exit status {process.exitcode})")
        if self.broker.process.poll() is not None:
            raise RuntimeError(f"the broker exited (status {self.broker.process.returncode})")

    def wait_for(self, name: str, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while name not in self.reports:
            self.check()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(
                    f"no report from the {name.split('-', maxsplit=1)[0]} within {timeout:.0f} s"
                )
            with contextlib.suppress(Exception):
                key, value = self.results.get(timeout=min(remaining, POLL))
                self.reports[key] = value
        return self.reports[name]

    def wait_until_drained(self, timeout: float) -> dict[str, Any]:
        """The queue's detail once it holds nothing: each message consumed or expired."""
        deadline = time.monotonic() + timeout
        while True:
            self.check()
            detail = queue_detail(self.broker.admin_port)
            if detail["summary"]["msgs"] == 0:
                return detail
            if time.monotonic() > deadline:
                held = detail["summary"]["msgs"]
                raise RuntimeError(
                    f"the queue still held {held} messages {timeout:.0f} s after the last send: "
                    "raise --drain-timeout, or lower --rate"
                )
            time.sleep(POLL)


def run_once(args: argparse.Namespace, order: str, kinds: bytes) -> dict[str, Any]:
    settings = {
        "kinds": kinds,
        "ttls": [kind.ttl_ms for kind in args.mix],
        "rate": args.rate,
        "body_size": args.body_size,
        "flow_limit": args.flow_limit,
        "service_ms": args.service_ms,
        "work": args.work,
    }
    context = multiprocessing.get_context("spawn")
    with started_broker(order, args.broker_property) as broker:
        settings["port"] = broker.port
        results, control, stop = context.Queue(), context.Queue(), context.Event()
        processes = [
            context.Process(target=consumer, args=(settings, stop, results), name="consumer"),
            context.Process(target=producer, args=(settings, control, results), name="producer"),
        ]
        run = Run(broker, processes, results)
        try:
            processes[0].start()
            run.wait_for("consumer-ready", START_WAIT)
            processes[1].start()
            run.wait_for("producer-ready", START_WAIT)
            pids = {"broker": broker.process.pid, "producer": run.reports["producer-ready"]}
            pids["consumer"] = run.reports["consumer-ready"]
            control.put(time.monotonic_ns() + 200_000_000)
            before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            began = time.monotonic()
            run.wait_for("producer", args.seconds * 2 + START_WAIT)
            cpu = {
                n: (cpu_seconds(p) - before[n]) / (time.monotonic() - began)
                for n, p in pids.items()
            }
            detail = run.wait_until_drained(args.drain_timeout)
            stop.set()
            run.wait_for("consumer", START_WAIT)
        finally:
            stop.set()
            for process in (p for p in processes if p.pid is not None):  # those started
                process.join(timeout=5)
                if process.is_alive():
                    process.kill()
                    process.join(timeout=5)
            results.close()
            control.close()
    result = classify(args, order, kinds, run.reports)
    result["cpu_share"] = {name: round(share, 3) for name, share in cpu.items()}
    totals = detail["totals"]
    kept = ("msgs_in", "consumed", "expired", "late", "deadline_misses")
    result["broker"] = {k: totals[k] for k in kept}
    result["broker"]["delivery_order"] = detail["properties"].get("deliveryOrder")
    builds = [line.split(BUILD_LINE, 1)[1] for line in broker.lines if BUILD_LINE in line]
    result["broker"]["build"] = builds[0].strip() if builds else "not logged"
    never = sum(c["never"] for c in result["classes"].values())
    result["accounted"] = (
        totals["msgs_in"] == len(kinds)
        and totals["expired"] == never
        and not result["duplicated"]
        and not result["unexpected"]
    )
    return result


# ---------------------------------------------------------------- figures


ON_TIME, LATE, NEVER = 0, 1, 2  # what became of a message


def outcomes(expires: array.array[int], acked: array.array[int]) -> list[int]:
    """ON_TIME, LATE or NEVER for each message, by sequence number."""
    return [
        NEVER if a < 0 else ON_TIME if e == 0 or a / 1e6 <= e else LATE
        for e, a in zip(expires, acked, strict=True)
    ]


def counts(seqs: list[int], outcome: list[int]) -> dict[str, Any]:
    """Sent, on time, late, never delivered, and the on-time share, of messages `seqs`."""
    tally = [0, 0, 0]
    for seq in seqs:
        tally[outcome[seq]] += 1
    share = round(tally[ON_TIME] / len(seqs), 4) if seqs else None
    on_time, late, never = tally
    return {"sent": len(seqs), "on_time": on_time, "late": late, "never": never, "share": share}


def waits(seqs: list[int], sent: array.array[int], taken: array.array[int]) -> dict[str, float]:
    """Percentiles (nearest rank, ms) of send to start of work, over the delivered `seqs`."""
    values = sorted(taken[s] - sent[s] for s in seqs if taken[s] >= 0)
    if not values:
        return {}

    def rank(p: float) -> float:
        return round(values[min(len(values) - 1, math.ceil(len(values) * p / 100) - 1)] / 1e6, 1)

    return {"p50": rank(50), "p99": rank(99), "max": round(values[-1] / 1e6, 1)}


def classify(
    args: argparse.Namespace, order: str, kinds: bytes, reports: dict[str, Any]
) -> dict[str, Any]:
    made, got = reports["producer"], reports["consumer"]
    sent, expires = array.array("q", made["sent_ns"]), array.array("q", made["expires"])
    taken, acked = array.array("q", got["taken_ns"]), array.array("q", got["acked_ns"])
    start = sent[0]
    outcome = outcomes(expires, acked)
    longest = max(kind.ttl_ms or 0 for kind in args.mix)
    steady = (args.warmup * 1e9, (args.seconds - longest / 1000) * 1e9)
    classes: dict[str, Any] = {}
    with_deadline: list[int] = []
    steady_with_deadline: list[int] = []
    for number, kind in enumerate(args.mix):
        seqs = [seq for seq, k in enumerate(kinds) if k == number]
        in_steady = [s for s in seqs if steady[0] <= sent[s] - start < steady[1]]
        classes[kind.name] = counts(seqs, outcome)
        classes[kind.name]["steady"] = counts(in_steady, outcome)
        classes[kind.name]["wait_ms"] = waits(seqs, sent, taken)
        # [on time, late, never] of the messages sent in each second of the run.
        by_second = [[0, 0, 0] for _ in range(math.ceil(args.seconds))]
        for seq in seqs:
            by_second[min(len(by_second) - 1, (sent[seq] - start) // 10**9)][outcome[seq]] += 1
        classes[kind.name]["by_second"] = by_second
        if kind.ttl_ms is not None:
            with_deadline += seqs
            steady_with_deadline += in_steady
    # Rates while the producer sent: what the consumer took, against what it was offered.
    span = (sent[-1] - start) / 1e9
    served = sum(1 for a in acked if start <= a <= sent[-1])
    rates = dict.fromkeys(("consumer_rate", "offered_rate", "overload"))
    if span > 0 and served:
        rates = {
            "consumer_rate": round(served / span, 1),
            "offered_rate": round(len(kinds) / span, 1),
            "overload": round(len(kinds) / served, 2),
        }
    return {
        "order": order,
        "with_deadline": counts(with_deadline, outcome),
        "steady_with_deadline": counts(steady_with_deadline, outcome),
        "classes": classes,
        **rates,
        "duplicated": got["duplicated"],
        "unexpected": got["unexpected"],
    }


def spread(values: list[float | None]) -> dict[str, float] | None:
    present = [v for v in values if v is not None]
    if not present:
        return None
    return {"median": statistics.median(present), "min": min(present), "max": max(present)}


def summarise(runs: list[dict[str, Any]], mix: list[Kind]) -> dict[str, Any]:
    """Per order: the median and range over the runs of each figure, overall and per class."""
    summary: dict[str, Any] = {}
    for order in ORDERS:
        mine = [r for r in runs if r["order"] == order]
        summary[order] = {
            "with_deadline": spread([r["with_deadline"]["share"] for r in mine]),
            "steady_with_deadline": spread([r["steady_with_deadline"]["share"] for r in mine]),
            "late_with_deadline": spread([r["with_deadline"]["late"] for r in mine]),
            "consumer_rate": spread([r["consumer_rate"] for r in mine]),
            "overload": spread([r["overload"] for r in mine]),
            "classes": {},
        }
        for kind in mix:
            of = [r["classes"][kind.name] for r in mine]
            summary[order]["classes"][kind.name] = {
                "share": spread([c["share"] for c in of]),
                "steady_share": spread([c["steady"]["share"] for c in of]),
                "wait_p50_ms": spread([c["wait_ms"].get("p50") for c in of]),
            }
    return summary


def verdict(summary: dict[str, Any]) -> dict[str, Any]:
    """The issue's question: does `deadline` deliver a larger share before the deadline?"""
    answer: dict[str, Any] = {}
    for key in ("with_deadline", "steady_with_deadline"):
        fifo, deadline = summary["fifo"][key], summary["deadline"][key]
        if fifo is None or deadline is None:
            continue
        answer[key] = {
            "fifo": fifo["median"],
            "deadline": deadline["median"],
            "deadline_better": deadline["median"] > fifo["median"],
        }
    return answer


# ---------------------------------------------------------------- command line


def positive(kind: type[int] | type[float]) -> Any:
    def check(text: str) -> int | float:
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
        return value

    return check


def mix_option(text: str) -> list[Kind]:
    try:
        return parse_mix(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add = parser.add_argument
    add("--seconds", type=positive(float), default=20.0, help="how long the producer sends")
    add("--service-ms", type=positive(float), default=1.0, help="consumer's time per message")
    add("--work", choices=("sleep", "spin"), default="sleep", help="how it spends that time")
    add("--overload", type=positive(float), default=1.5, help="rate / (1000 / --service-ms)")
    add("--rate", type=positive(float), help="messages/s (default: from --overload)")
    add(
        "--mix",
        type=mix_option,
        default=parse_mix("200:45,5000:45,none:10"),
        help="TTL_MS:WEIGHT,... (TTL `none`: no expires header); default 200:45,5000:45,none:10",
    )
    add("--flow-limit", type=positive(int), default=10, help="consumer-flow-limit (messages)")
    add("--body-size", type=positive(int), default=128, help="bytes")
    add("--warmup", type=float, default=2.0, help="seconds left out of the steady figures")
    add("--drain-timeout", type=positive(float), default=60.0, help="s after the last send")
    add("--seed", type=int, default=1, help="of the class drawn for each message")
    add("--runs", type=positive(int), default=1, help="pairs of runs (fifo and deadline)")
    add("--broker-property", action="append", default=[], metavar="NAME=VALUE")
    add("--json", type=Path, default=RESULTS, help="where to write the result")
    args = parser.parse_args(argv)
    if args.rate is None:
        args.rate = args.overload * 1000 / args.service_ms
    if args.warmup < 0:
        parser.error(f"--warmup must be 0 or more, got {args.warmup}")
    if args.rate * args.seconds > 2_000_000:
        parser.error("--rate x --seconds must stay under 2,000,000 messages")
    if args.rate * args.seconds < 1:
        parser.error("--rate x --seconds comes to no message at all: raise either")
    for item in args.broker_property:
        if "=" not in item:
            parser.error(f"--broker-property takes NAME=VALUE, got {item!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    try:
        return measure(args)
    except (RuntimeError, OSError) as exc:
        print(f"deadlines: {exc}", file=sys.stderr)
        return 2
    finally:
        gc.collect()  # the last run's queues release their semaphores while the tracker runs
        tracker = getattr(resource_tracker, "_resource_tracker", None)
        with contextlib.suppress(AttributeError, OSError, ChildProcessError):
            tracker._stop()  # type: ignore[union-attr]  # else it outlives this process


def percent(share: float | None) -> str:
    return "n/a" if share is None else f"{share:.1%}"


def describe(number: int, result: dict[str, Any]) -> str:
    total = result["with_deadline"]
    parts = ", ".join(f"{name} {percent(c['share'])}" for name, c in result["classes"].items())
    return (
        f"run {number} {result['order']:>8}: {percent(total['share'])} of messages with a"
        f" deadline on time ({parts}); late {total['late']}, never {total['never']} of"
        f" {total['sent']}; consumer {result['consumer_rate']} msg/s,"
        f" offered {result['offered_rate']} ({result['overload']} x)"
    )


def ranged(figures: dict[str, float] | None) -> str:
    if figures is None:
        return "n/a"
    return f"{figures['median']:.1%} ({figures['min']:.1%}-{figures['max']:.1%})"


def measure(args: argparse.Namespace) -> int:
    draw = random.Random(args.seed)  # noqa: S311  (a reproducible mix, not a secret)
    count = round(args.rate * args.seconds)
    weights = [kind.weight for kind in args.mix]
    kinds = bytes(draw.choices(range(len(args.mix)), weights, k=count))
    runs = []
    for number in range(args.runs):
        for order in ORDERS if number % 2 == 0 else ORDERS[::-1]:
            result = run_once(args, order, kinds)
            result["run"] = number + 1
            runs.append(result)
            print(describe(number + 1, result), flush=True)
    summary = summarise(runs, args.mix)
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "mix")}
    settings["mix"] = [{"class": k.name, "ttl_ms": k.ttl_ms, "weight": k.weight} for k in args.mix]
    document = {
        "settings": settings,
        "machine": {"cores": os.cpu_count(), "python": sys.version.split()[0]},
        "summary": summary,
        "verdict": verdict(summary),
        "runs": runs,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(document, indent=2) + "\n")
    for order in ORDERS:
        mine = summary[order]
        print(
            f"{order:>8}: on time {ranged(mine['with_deadline'])},"
            f" steady {ranged(mine['steady_with_deadline'])} (median, range of {args.runs})"
        )
    return 0 if all(r["accounted"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
