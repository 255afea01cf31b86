"""A second latency generator for a STOMP queue, independent of `sluiceway bench`.

It shares no code with Sluiceway's client or bench: plain blocking sockets and a few lines of
STOMP framing, one producer process and one consumer process (`multiprocessing`, spawn).

- The producer sends message i at start + i / rate, read from CLOCK_MONOTONIC (one clock for
  every process of a Linux machine). It sleeps until each send time and never catches up by
  shifting the schedule: a late send is sent at once, and keeps its scheduled time.
- The consumer subscribes with `ack:client-individual` and `consumer-flow-limit` (the prefetch)
  and writes one ACK per message as soon as the message is decoded.
- Latency is receive time minus *scheduled* send time. Measured from the actual send time, a
  producer held up (by the scheduler, by a full socket buffer, by the broker's flow control)
  would send late and then report short latencies: the stall would be left out of the figures
  (coordinated omission). Both are reported; the scheduled one is the figure.
- Messages scheduled in the first `--warmup` seconds are not counted; the next `--seconds`
  seconds are. The CPU share of each process (and of the broker, when its pid is known) is
  read from /proc over that same interval.

    .venv/bin/python benchmarks/latency_probe.py --rate 2000 --seconds 20 --runs 3

Without `--port` it starts a broker (`python -m sluiceway broker --port 0`) for each run.
Results go to benchmarks/results/latency_probe.json (`--json` to change).
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
import socket
import statistics
import sys
import time
from collections.abc import Iterator
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any, Final

RESULTS: Final = Path(__file__).parent / "results" / "latency_probe.json"
PR_SET_TIMERSLACK: Final = 29  # <linux/prctl.h>
CONNECT_TIMEOUT: Final = 10.0
READ_SIZE: Final = 65536
MAX_FRAME: Final = 1 << 20  # a frame longer than this is a protocol error, not a message
SLOWEST: Final = 20  # how many of the slowest messages the result lists
CPU_WARNING: Final = 0.80
PROCESSES: Final = ("producer", "consumer", "broker")
HEADER: Final = 64  # bytes of the body that carry "seq scheduled_ns sent_ns"


# ---------------------------------------------------------------- STOMP on a blocking socket


class Stomp:
    """One STOMP 1.2 connection: frames out, frames in, nothing else."""

    def __init__(self, host: str, port: int, nodelay: bool) -> None:
        self.sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, int(nodelay))
        self.buffer = bytearray()
        self.send_frame("CONNECT", {"accept-version": "1.2", "host": "/", "heart-beat": "0,0"})
        command, _, _ = self.read_frame()
        if command != "CONNECTED":
            raise RuntimeError(f"the broker at {host}:{port} answered CONNECT with {command}")

    def send_frame(self, command: str, headers: dict[str, str], body: bytes = b"") -> None:
        self.sock.sendall(frame(command, headers, body))

    def read_frame(self) -> tuple[str, dict[str, str], bytes]:
        """The next frame, waiting for it (bounded by the socket's timeout)."""
        while True:
            parsed = parse(self.buffer)
            if parsed is not None:
                return parsed
            chunk = self.sock.recv(READ_SIZE)
            if not chunk:
                raise RuntimeError("the broker closed the connection")
            self.buffer += chunk

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def frame(command: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    lines = [command, *(f"{k}:{v}" for k, v in headers.items())]
    if body:
        lines.append(f"content-length:{len(body)}")
    return ("\n".join(lines) + "\n\n").encode() + body + b"\0"


def parse(buffer: bytearray) -> tuple[str, dict[str, str], bytes] | None:
    """Take one frame off the front of `buffer`, or None if it holds no whole frame."""
    start = 0
    while start < len(buffer) and buffer[start] in b"\r\n":  # heart-beats
        start += 1
    end_of_headers = buffer.find(b"\n\n", start)
    if end_of_headers < 0:
        if len(buffer) - start > MAX_FRAME:
            raise RuntimeError("a frame's headers are longer than 1 MiB: not a STOMP broker?")
        del buffer[:start]
        return None
    lines = buffer[start:end_of_headers].decode().split("\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        key, _, value = line.partition(":")
        headers.setdefault(key, value)
    body_start = end_of_headers + 2
    if "content-length" in headers:
        length = int(headers["content-length"])
        if length > MAX_FRAME:
            raise RuntimeError(f"a frame of {length} bytes, over 1 MiB: not one the probe sent")
        body_end = body_start + length
        if len(buffer) < body_end + 1:
            return None
    else:
        body_end = buffer.find(b"\0", body_start)
        if body_end < 0:
            return None
    body = bytes(buffer[body_start:body_end])
    del buffer[: body_end + 1]
    return lines[0].strip(), headers, body


# ---------------------------------------------------------------- the two processes


def quiet_collector() -> None:
    """Keep this process's own cycle collections out of what it measures."""
    gc.collect()
    gc.freeze()
    gc.disable()


def producer(settings: dict[str, Any], control: Any, results: Any) -> None:
    """Send `total` messages at start + i / rate; `start` arrives on `control`."""
    with contextlib.suppress(OSError, AttributeError):  # finer sleeps, where Linux allows
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
    conn = Stomp(settings["host"], settings["port"], settings["nodelay"])
    quiet_collector()
    results.put(("producer-ready", os.getpid()))
    start: int = control.get(timeout=30)
    period = 1e9 / settings["rate"]
    padding = b"x" * max(0, settings["body_size"] - HEADER)
    headers = frame("SEND", {"destination": settings["destination"]}).split(b"\n\n")[0]
    headers += f"\ncontent-length:{max(HEADER, settings['body_size'])}\n\n".encode()
    sock = conn.sock
    late = 0
    for seq in range(settings["total"]):
        scheduled = start + round(seq * period)
        now = time.monotonic_ns()
        if now < scheduled:
            time.sleep((scheduled - now) / 1e9)
        else:
            late += 1
        sent = time.monotonic_ns()
        stamp = f"{seq} {scheduled} {sent}".encode().ljust(HEADER)
        sock.sendall(headers + stamp + padding + b"\0")
    conn.send_frame("DISCONNECT", {"receipt": "bye"})
    with contextlib.suppress(OSError, RuntimeError):
        conn.read_frame()
    conn.close()
    results.put(("producer", {"late_sends": late}))


def subscribe(settings: dict[str, Any]) -> Stomp:
    conn = Stomp(settings["host"], settings["port"], settings["nodelay"])
    conn.send_frame(
        "SUBSCRIBE",
        {
            "destination": settings["destination"],
            "id": "0",
            "ack": "client-individual",
            "consumer-flow-limit": str(settings["prefetch"]),
            "receipt": "subscribed",
        },
    )
    command, _, _ = conn.read_frame()
    if command != "RECEIPT":
        raise RuntimeError(f"the broker answered SUBSCRIBE with {command}")
    conn.sock.settimeout(settings["timeout"])  # a run ends after this long without a message
    return conn


def consumer(settings: dict[str, Any], results: Any) -> None:
    """Receive `total` messages, ACK each one; report per-message latencies."""
    conn = subscribe(settings)
    total: int = settings["total"]
    from_scheduled = array.array("q", [-1]) * total  # ns, by sequence number; -1: not seen
    from_sent = array.array("q", [-1]) * total
    per_read = array.array("H", [0]) * total  # messages decoded from the read that brought it
    duplicated = out_of_order = unexpected = received = 0
    last_seq = -1
    per_message_acks = settings["ack_write"] == "message"
    sock, buffer = conn.sock, conn.buffer
    quiet_collector()
    results.put(("consumer-ready", os.getpid()))
    with contextlib.suppress(TimeoutError):
        while received < total:
            chunk = sock.recv(READ_SIZE)
            now = time.monotonic_ns()  # one receive time for everything this read brought
            if not chunk:
                raise RuntimeError("the broker closed the consumer's connection")
            buffer += chunk
            acks: list[bytes] = []
            first = received
            seqs: list[int] = []
            while (parsed := parse(buffer)) is not None:
                command, headers, body = parsed
                if command != "MESSAGE":
                    raise RuntimeError(f"the consumer got {command}: {headers.get('message')}")
                seq_text, scheduled_text, sent_text = body[:HEADER].split()[:3]
                seq = int(seq_text)
                ack = frame("ACK", {"id": headers["ack"]})
                if per_message_acks:
                    sock.sendall(ack)
                else:
                    acks.append(ack)
                if not 0 <= seq < total:
                    unexpected += 1
                    continue
                if from_scheduled[seq] >= 0:
                    duplicated += 1
                    continue
                out_of_order += seq < last_seq
                last_seq = max(last_seq, seq)
                from_scheduled[seq] = now - int(scheduled_text)
                from_sent[seq] = now - int(sent_text)
                seqs.append(seq)
                received += 1
            for seq in seqs:
                per_read[seq] = min(received - first, 65535)
            if acks:
                sock.sendall(b"".join(acks))
    conn.close()
    results.put(
        (
            "consumer",
            {
                "from_scheduled": from_scheduled.tobytes(),
                "from_sent": from_sent.tobytes(),
                "per_read": per_read.tobytes(),
                "duplicated": duplicated,
                "out_of_order": out_of_order,
                "unexpected": unexpected,
            },
        )
    )


# ---------------------------------------------------------------- one run, in the parent


def cpu_seconds(pid: int) -> float:
    """utime + stime of a live process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def runqueue_wait_seconds(pid: int) -> float:
    """Time the process (its main thread) was ready to run but waited for a core (Linux)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9


def machine_seconds() -> tuple[float, float]:
    """(busy, stolen): CPU seconds all the machine's cores ran anything, and the seconds a
    virtual machine's cores were ready but the host ran something else (/proc/stat)."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / tick, steal / tick


def sleep_until(deadline_ns: int) -> None:
    delay = (deadline_ns - time.monotonic_ns()) / 1e9
    if delay > 0:
        time.sleep(delay)


@contextlib.contextmanager
def broker_for(args: argparse.Namespace) -> Iterator[tuple[int, int | None]]:
    """(port, pid or None): the one given, or a broker started for this run."""
    if args.port:
        yield args.port, args.broker_pid
        return
    from sluiceway.testing import BrokerProcess  # noqa: PLC0415  (only when starting one)

    with BrokerProcess("-D", "imq.admin.http.port=-1") as broker:
        yield broker.port, broker.process.pid
        broker.stop()


def run_once(args: argparse.Namespace) -> dict[str, Any]:
    warm = round(args.rate * args.warmup)
    measured = round(args.rate * args.seconds)
    settings = {
        "host": args.host,
        "rate": args.rate,
        "body_size": args.body_size,
        "prefetch": args.prefetch,
        "total": warm + measured,
        "nodelay": not args.nagle,
        "ack_write": args.ack_write,
        "timeout": args.timeout,
        # A queue of the run's own: nothing left by another run on the same broker reaches it.
        "destination": f"/queue/latency-probe-{os.getpid()}-{time.monotonic_ns()}",
    }
    context = multiprocessing.get_context("spawn")
    with broker_for(args) as (port, broker_pid):
        settings["port"] = port
        results = context.Queue()
        control = context.Queue()
        processes = [
            context.Process(target=consumer, args=(settings, results), name="consumer"),
            context.Process(target=producer, args=(settings, control, results), name="producer"),
        ]
        try:
            reports = exchange(args, processes, results, control, broker_pid)
        finally:
            for process in (p for p in processes if p.pid is not None):  # those started
                process.join(timeout=5)
                if process.is_alive():
                    process.kill()
                    process.join(timeout=5)
    return summarise(args, warm, measured, reports)


def exchange(
    args: argparse.Namespace,
    processes: list[Any],
    results: Any,
    control: Any,
    broker_pid: int | None,
) -> dict[str, Any]:
    """Start the consumer, then the producer; time the run; collect both reports."""
    reports: dict[str, Any] = {}

    def wait_for(name: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while name not in reports:
            if any(p.exitcode not in (None, 0) for p in processes):
                raise RuntimeError("a probe process failed (its traceback is above)")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(f"no {name} report within {timeout:.0f} s")
            with contextlib.suppress(Exception):
                key, value = results.get(timeout=min(remaining, 0.5))
                reports[key] = value

    processes[0].start()
    wait_for("consumer-ready", 30)
    processes[1].start()
    wait_for("producer-ready", 30)
    pids = {"producer": reports["producer-ready"], "consumer": reports["consumer-ready"]}
    if broker_pid:
        pids["broker"] = broker_pid
    start = time.monotonic_ns() + 200_000_000
    control.put(start)
    measure_from = start + round(args.warmup * 1e9)
    measure_to = measure_from + round(args.seconds * 1e9)
    # Sampled a little before the end: the producer exits once its last message is sent.
    measure_to -= round(min(0.1, args.seconds / 10) * 1e9)
    sleep_until(measure_from)
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    before["machine"], before["stolen"] = machine_seconds()
    waited = {name: runqueue_wait_seconds(pid) for name, pid in pids.items()}
    sleep_until(measure_to)
    after = {name: cpu_seconds(pid) for name, pid in pids.items()}
    after["machine"], after["stolen"] = machine_seconds()
    waited = {n: runqueue_wait_seconds(pid) - waited[n] for n, pid in pids.items()}
    span = (measure_to - measure_from) / 1e9
    share = {n: round((after[n] - before[n]) / span, 3) for n in after}
    # What the rest of the machine used meanwhile, in cores: other work competes
    # with the broker and the probe for the same cores. "stolen": cores' worth of time the
    # host of a virtual machine gave to others.
    # In a virtual machine a process's own CPU time may include time stolen from it (its
    # clock ran while the host ran something else), so the difference can come out below
    # zero: it is then taken as zero, and "stolen" says why.
    stolen = share.pop("stolen")
    share["others"] = round(max(0.0, share.pop("machine") - sum(share.values())), 3)
    share["stolen"] = stolen
    reports["cpu_share"] = share
    # Share of the interval each process was runnable and not running: time lost to the
    # other processes of the machine, whatever the process itself does.
    reports["runqueue_wait_share"] = {n: round(w / span, 4) for n, w in waited.items()}
    wait_for("producer", args.timeout + 10)
    wait_for("consumer", args.timeout + 10)
    return reports


def percentiles(values_ns: list[int]) -> dict[str, float]:
    """Exact (nearest-rank) percentiles in ms of sorted values."""
    if not values_ns:
        return {}
    n = len(values_ns)

    def rank(p: float) -> float:
        return values_ns[min(n - 1, max(0, math.ceil(n * p / 100) - 1))] / 1e6

    return {
        "p50": round(rank(50), 3),
        "p90": round(rank(90), 3),
        "p99": round(rank(99), 3),
        "p99.9": round(rank(99.9), 3),
        "max": round(values_ns[-1] / 1e6, 3),
        "mean": round(statistics.fmean(values_ns) / 1e6, 3),
    }


def summarise(
    args: argparse.Namespace, warm: int, measured: int, reports: dict[str, Any]
) -> dict[str, Any]:
    got = reports["consumer"]
    from_scheduled = array.array("q", got["from_scheduled"])[warm:]
    from_sent = array.array("q", got["from_sent"])[warm:]
    per_read = array.array("H", got["per_read"])[warm:]
    seen = [i for i, v in enumerate(from_scheduled) if v >= 0]
    slowest = sorted(seen, key=lambda i: from_scheduled[i], reverse=True)[:SLOWEST]
    cpu = reports["cpu_share"]
    return {
        "count": len(seen),
        "expected": measured,
        "missing": measured - len(seen),
        "duplicated": got["duplicated"],
        "out_of_order": got["out_of_order"],
        "unexpected": got["unexpected"],
        "late_sends": reports["producer"]["late_sends"],
        "latency_ms": percentiles(sorted(from_scheduled[i] for i in seen)),
        "latency_from_sent_ms": percentiles(sorted(from_sent[i] for i in seen)),
        "producer_lag_ms": percentiles(sorted(from_scheduled[i] - from_sent[i] for i in seen)),
        "cpu_share": cpu,
        "runqueue_wait_share": reports["runqueue_wait_share"],
        "cpu_warnings": [n for n, share in cpu.items() if n in PROCESSES and share > CPU_WARNING],
        "cores": os.cpu_count(),
        "slowest": [
            {
                "seq": warm + i,
                "ms": round(from_scheduled[i] / 1e6, 3),
                "producer_lag_ms": round((from_scheduled[i] - from_sent[i]) / 1e6, 3),
                "messages_in_same_read": per_read[i],
            }
            for i in slowest
        ],
    }


# ---------------------------------------------------------------- command line


def positive(kind: type[int] | type[float]) -> Any:
    def check(text: str) -> int | float:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
        return value

    return check


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="a running broker (default: start one)")
    parser.add_argument("--broker-pid", type=int, help="with --port: report this process's CPU")
    parser.add_argument("--rate", type=positive(float), default=2000.0, help="messages/s")
    parser.add_argument("--seconds", type=positive(float), default=20.0, help="measured interval")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds not counted first")
    parser.add_argument("--body-size", type=positive(int), default=1024, help="bytes")
    parser.add_argument("--prefetch", type=positive(int), default=1000, help="consumer window")
    parser.add_argument(
        "--ack-write",
        choices=("message", "read"),
        default="message",
        help="one write per ACK, or one write for the ACKs of a read",
    )
    parser.add_argument("--nagle", action="store_true", help="leave TCP_NODELAY off (Nagle on)")
    parser.add_argument("--runs", type=positive(int), default=1, help="report the median of N")
    parser.add_argument("--timeout", type=positive(float), default=5.0, help="s without progress")
    parser.add_argument("--json", type=Path, default=RESULTS, help="where to write the result")
    args = parser.parse_args(argv)
    if args.warmup < 0:
        parser.error(f"--warmup must be 0 or more, got {args.warmup}")
    if args.rate * (args.warmup + args.seconds) > 10_000_000:
        parser.error("--rate x (--warmup + --seconds) must stay under 10,000,000 messages")
    return args


def stop_resource_tracker() -> None:
    """Stop, and wait for, the helper process `multiprocessing` starts for spawned children:
    left to exit on its own after this process, it would outlive it as an orphan."""
    tracker = getattr(resource_tracker, "_resource_tracker", None)
    with contextlib.suppress(AttributeError, OSError, ChildProcessError):
        tracker._stop()  # type: ignore[union-attr]


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    try:
        return measure(args)
    except (RuntimeError, OSError) as exc:
        print(f"latency_probe: {exc}", file=sys.stderr)
        return 2
    finally:
        stop_resource_tracker()


def measure(args: argparse.Namespace) -> int:
    runs = []
    for number in range(args.runs):
        result = run_once(args)
        runs.append(result)
        lat, cpu = result["latency_ms"], result["cpu_share"]
        print(
            f"run {number + 1}: {result['count']}/{result['expected']} messages, latency ms "
            + ", ".join(f"{k} {v}" for k, v in lat.items())
            + "; CPU "
            + ", ".join(f"{k} {v:.0%}" for k, v in cpu.items()),
            flush=True,
        )
        for name in result["cpu_warnings"]:
            print(f"warning: {name} used over 80 % of a core: it may be what limits the figures")
    keys = ("p50", "p90", "p99", "p99.9", "max")
    summary = {
        key: {
            "median": round(statistics.median(r["latency_ms"][key] for r in runs), 3),
            "min": min(r["latency_ms"][key] for r in runs),
            "max": max(r["latency_ms"][key] for r in runs),
        }
        for key in keys
        if all(r["latency_ms"] for r in runs)
    }
    settings = {k: v for k, v in vars(args).items() if k != "json"}
    settings["latency_from"] = "scheduled send time"
    document = {"settings": settings, "latency_ms": summary, "runs": runs}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(document, indent=2) + "\n")
    if args.runs > 1:
        print(
            "median of runs, ms: "
            + ", ".join(f"{k} {v['median']} ({v['min']}-{v['max']})" for k, v in summary.items())
        )
    return 1 if any(r["missing"] or r["duplicated"] for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
