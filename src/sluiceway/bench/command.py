"""`sluiceway bench`: measure any STOMP broker with the same load.

    sluiceway bench queue --messages 100000 --producers 2 --consumers 2
    sluiceway bench fairness --delays 5,1,1,1 --ack client-individual --prefetch 1
    sluiceway bench fairness --delays 5,1,1,1 --prefetch auto

Exit status: 0 every message arrived once; 1 a message was lost or duplicated, or the broker
sent an ERROR; 2 usage error; 3 cannot connect (or the broker refused the login).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Final, TextIO

from sluiceway.bench.cpu import BUSY_SHARE, listening_pid
from sluiceway.bench.report import Report, build_report, render_table, write_json, write_plot
from sluiceway.bench.runner import Run, Scenario, Settings, StartError, probe
from sluiceway.bench.stream import Refused
from sluiceway.bench.workers import AUTO_PREFETCH_CAP, PREFETCH_AUTO, Target

EXIT_OK: Final = 0
EXIT_LOST: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNREACHABLE: Final = 3
ACK_MODES: Final = ("auto", "client", "client-individual")
DEFAULT_DESTINATION: Final = {Scenario.TOPIC: "/topic/bench"}
LOCAL_HOSTS: Final = ("127.0.0.1", "localhost", "::1")


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `bench` to the `sluiceway` command's subcommands."""
    p = commands.add_parser(
        "bench",
        help="measure a STOMP broker (this one or any other) under load",
        description="Measure any STOMP 1.2 broker: throughput, latency, fairness, losses. "
        "See docs/bench.md.",
    )
    p.add_argument("scenario", choices=[s.value for s in Scenario])
    p.add_argument("--host", default="127.0.0.1", help="broker address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=61613, help="STOMP port (default 61613)")
    p.add_argument("--login", default="", help="CONNECT login")
    p.add_argument("--passcode", default="", help="CONNECT passcode")
    p.add_argument("--vhost", default="/", help="CONNECT host header: the virtual host")
    p.add_argument("--destination", help="default /queue/bench, or /topic/bench for topic")
    p.add_argument("--messages", type=int, default=10_000, help="in all, across producers")
    p.add_argument("--size", type=int, default=1024, help="body bytes (at least about 30)")
    p.add_argument("--producers", type=int, default=1)
    p.add_argument("--consumers", type=int, default=1, help="consumers, or subscribers (topic)")
    p.add_argument("--persistent", action="store_true", help="send persistent:true")
    p.add_argument("--ack", choices=ACK_MODES, help="default auto; client-individual (fairness)")
    p.add_argument(
        "--prefetch",
        default="0",
        metavar="N|auto",
        help="unacknowledged messages per subscription (0: the broker's default); auto: "
        "consumer-flow-limit:auto, a window the broker sizes from each consumer's pace "
        "(Sluiceway; up to 1000)",
    )
    p.add_argument(
        "--ack-every",
        type=int,
        default=0,
        metavar="N",
        help="--ack client: one cumulative ACK every N messages (default 0: half the prefetch, "
        "or every message without one or with auto)",
    )
    p.add_argument("--receipts", action="store_true", help="ask a receipt for every send")
    p.add_argument("--window", type=int, default=500, help="unanswered sends with --receipts")
    p.add_argument("--rate", type=float, default=0.0, help="messages/s in all (latency: needed)")
    p.add_argument("--delays", default="", help="fairness: ms per message per consumer: 5,1,1")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds without progress")
    p.add_argument(
        "--broker-pid",
        type=int,
        help="report this process's CPU and peak RSS (default: the local process listening on "
        "--port, if it can be found; 0: none)",
    )
    p.add_argument(
        "--busy-warning",
        type=float,
        default=BUSY_SHARE * 100,
        metavar="PERCENT",
        help="warn when a load process used more of a core than this (default 80)",
    )
    p.add_argument("--json", metavar="FILE", help="write the result as JSON ('-': stdout)")
    p.add_argument("--plot", metavar="FILE.png", help="plot throughput and latency over time")


def settings_from(args: argparse.Namespace) -> Settings:
    """Check the options together; raise ValueError with what to change."""
    scenario = Scenario(args.scenario)
    delays = _delays(args.delays)
    consumers = args.consumers
    if scenario is Scenario.FAIRNESS:
        if not delays:
            raise ValueError("fairness needs --delays, e.g. --delays 5,1,1,1 (ms per message)")
        consumers = len(delays)
    elif delays:
        raise ValueError("--delays is for the fairness scenario")
    if scenario is Scenario.LATENCY and args.rate <= 0:
        raise ValueError("latency needs --rate N (messages per second, all producers together)")
    for name in ("messages", "producers", "consumers", "window", "size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be at least 1")
    prefetch = _prefetch(str(args.prefetch))
    if args.rate < 0 or args.timeout <= 0:
        raise ValueError("--rate cannot be negative; --timeout must be positive")
    if args.ack_every < 0 or (args.ack_every and args.ack != "client"):
        raise ValueError(
            "--ack-every N is for --ack client (cumulative acknowledgements), N 1 or more"
        )
    most = AUTO_PREFETCH_CAP if prefetch == PREFETCH_AUTO else prefetch
    if most and args.ack_every > most:
        shown = f"auto's cap of {most}" if prefetch == PREFETCH_AUTO else f"--prefetch {most}"
        raise ValueError(
            f"--ack-every {args.ack_every} is more than {shown}: the broker stops delivering "
            "at the prefetch, so the ACK would never come; lower --ack-every"
        )
    if args.broker_pid and not os.path.exists(f"/proc/{args.broker_pid}"):
        raise ValueError(f"--broker-pid {args.broker_pid}: no such process")
    if args.busy_warning < 0:
        raise ValueError("--busy-warning is a percentage of one core: 0 or more")
    default_ack = "client-individual" if scenario is Scenario.FAIRNESS else "auto"
    return Settings(
        scenario=scenario,
        target=Target(args.host, args.port, args.login, args.passcode, args.vhost),
        destination=args.destination or DEFAULT_DESTINATION.get(scenario, "/queue/bench"),
        messages=args.messages,
        size=args.size,
        producers=args.producers,
        consumers=consumers,
        persistent=args.persistent,
        ack=args.ack or default_ack,
        prefetch=prefetch,
        ack_every=args.ack_every,
        receipts=args.receipts,
        window=args.window,
        rate=args.rate,
        delays_ms=delays,
        timeout=args.timeout,
        broker_pid=_broker_pid(args),
        busy_share=args.busy_warning / 100,
    )


def _broker_pid(args: argparse.Namespace) -> int:
    """--broker-pid, or else the process listening on --port on this machine (Linux), unless
    that is this one (a broker run in-process, as in tests: its CPU would include ours)."""
    if args.broker_pid is not None:
        return int(args.broker_pid)
    if args.host not in LOCAL_HOSTS:
        return 0
    pid = listening_pid(args.port)
    return pid if pid != os.getpid() else 0


def _prefetch(text: str) -> int:
    """--prefetch: a count of messages, 0 for the broker's default, or auto (PREFETCH_AUTO)."""
    if text.strip().lower() == "auto":
        return PREFETCH_AUTO
    try:
        prefetch = int(text)
    except ValueError:
        raise ValueError(
            f"--prefetch {text!r}: give a number of messages (0: the broker's default) or auto"
        ) from None
    if prefetch < 0:
        raise ValueError("--prefetch cannot be negative (0: the broker's default; or auto)")
    return prefetch


def _delays(text: str) -> tuple[float, ...]:
    try:
        delays = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"--delays {text!r}: give milliseconds separated by commas") from None
    if any(delay < 0 for delay in delays):
        raise ValueError("--delays cannot be negative")
    return delays


def run(
    args: argparse.Namespace, stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    """Run the scenario, report, and return the exit status."""
    stdout = stdout or sys.stdout  # looked up now, not at import, so redirections are seen
    stderr = stderr or sys.stderr
    try:
        settings = settings_from(args)
    except ValueError as exc:
        print(f"sluiceway bench: {exc}", file=stderr)
        return EXIT_USAGE
    where = f"{settings.target.address}:{settings.target.port}"
    try:
        asyncio.run(probe(settings.target))
    except (OSError, TimeoutError, Refused, ConnectionError) as exc:
        print(f"sluiceway bench: cannot connect to {where}: {exc}", file=stderr)
        return EXIT_UNREACHABLE
    progress = ProgressBar(stderr) if stderr.isatty() else None
    try:
        outcome = Run(settings, progress.update if progress else None).execute()
    except StartError as exc:
        print(f"sluiceway bench: cannot start the load on {where}: {exc}", file=stderr)
        return EXIT_UNREACHABLE
    except KeyboardInterrupt:
        print(file=stderr)
        return 130
    finally:
        if progress is not None:
            progress.close()
    report = build_report(outcome)
    return publish(report, args, stdout, stderr)


def publish(report: Report, args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    if args.json != "-":
        stdout.write(render_table(report))
    if args.json:
        write_json(report, args.json, stdout)
    if args.plot:
        write_plot(report, args.plot)
    for line in report.warnings:
        print(f"sluiceway bench: {line}", file=stderr)
    for error in report.errors:
        print(f"sluiceway bench: {error}", file=stderr)
    if report.lost_or_duplicated:
        print(
            f"sluiceway bench: {report.missing:,} messages missing, "
            f"{report.duplicated:,} duplicated",
            file=stderr,
        )
    return EXIT_LOST if report.lost_or_duplicated or report.errors else EXIT_OK


class ProgressBar:
    """One line on a terminal, rewritten in place; at most ten times a second."""

    WIDTH = 30

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.shown = ""

    def update(self, sent: int, received: int, expected: int) -> None:
        done = min(1.0, received / expected) if expected else 0.0
        filled = round(done * self.WIDTH)
        line = f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] sent {sent:,} received {received:,}"
        if line != self.shown:
            self.stream.write("\r" + line)
            self.stream.flush()
            self.shown = line

    def close(self) -> None:
        if self.shown:
            self.stream.write("\r" + " " * len(self.shown) + "\r")
            self.stream.flush()
