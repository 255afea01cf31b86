"""Sluiceway beside RabbitMQ and ActiveMQ Classic: every scenario of `sluiceway bench`, run
several times with the brokers interleaved, and the results table of benchmarks/README.md.

Each measurement starts the broker afresh (a new state directory under a temporary directory),
waits for its STOMP port, runs `sluiceway bench ... --json` against it with `--broker-pid` set
to the process that listens on the port, and stops it. Runs are interleaved: run 1 of every
scenario on every broker, then run 2, and so on, with the order of the brokers rotated from run
to run, so that a slow spell of the machine does not fall on one broker alone. RabbitMQ and
ActiveMQ come from the OS packages (`benchmarks/peers.sh install`) and run with the packages'
default settings. The large-body scenarios also run through `relay.py`, which is no broker but
the same frames carried from producer to consumer with nothing kept: the ceiling.

Each figure is the median of the runs; beside it, its ratio to the best peer's figure in the
same run (median of those ratios), so that 2.00x reads "twice the best peer" whichever way the
figure points (for latency and memory, lower is better and the ratio is best peer / figure).
A figure is marked `*` when, in one of its runs, a process of the load generator used more than
80 % of a core (`sluiceway bench` reports each one's share): the figure may then be the
generator's limit rather than the broker's.

    .venv/bin/python benchmarks/compare.py [--runs 3] [--brokers sluiceway,rabbitmq,activemq,relay]
        [--scenarios queue,latency,...] [--scale 0.1]

Writes benchmarks/results/compare.json (every run; `--results PATH` writes elsewhere) and,
unless `--no-readme`, the table in benchmarks/README.md between its `compare:begin` and
`compare:end` markers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluiceway.bench.cpu import BUSY_SHARE, ProcessCpu, listening_pid, saturated

HERE = Path(__file__).parent
RESULTS = HERE / "results" / "compare.json"
README = HERE / "README.md"
BEGIN, END = "<!-- compare:begin -->", "<!-- compare:end -->"
PEERS = ("rabbitmq", "activemq")
# Not a broker: the same bytes carried by a minimal relay (relay.py), the ceiling for large bodies.
CEILING = "relay"
COLUMNS = ("sluiceway", *PEERS, CEILING)
START_TIMEOUT = 90.0


@dataclass(frozen=True)
class Figure:
    label: str
    key: str  # a key of the bench JSON, or one derived in `figure_value`
    higher_is_better: bool = True
    count: bool = False  # a number of messages: shown without decimals


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    bench: tuple[str, ...]  # `sluiceway bench` arguments, message counts included
    figures: tuple[Figure, ...]
    properties: tuple[str, ...] = ()  # broker properties for Sluiceway's run (-D NAME=VALUE)
    brokers: tuple[str, ...] = ("sluiceway", *PEERS)
    target: str = ""  # shown beside the first figure, unless `targets` names that one
    peers_from: str = ""  # for a Sluiceway-only variant: the scenario whose peers it is held to
    targets: tuple[tuple[str, str], ...] = ()  # (figure key, target): shown beside that figure

    def target_of(self, figure: Figure) -> str:
        named = dict(self.targets)
        if figure.key in named:
            return named[figure.key]
        return self.target if figure is self.figures[0] else ""


RECEIVED = Figure("received/s", "received_per_second")
SENT = Figure("sent/s", "sent_per_second")
FINISH = Figure("finished after (s)", "finish_seconds", higher_is_better=False)
IDLE = Figure("most idle consumer (s)", "max_idle_seconds", higher_is_better=False)
# Idle while another consumer held messages it had not started: what better dispatch avoids.
IDLE_WHILE_HELD = Figure(
    "most idle while another held unstarted messages (s)",
    "max_idle_while_held",
    higher_is_better=False,
)
# Messages a consumer held at once, received and not acknowledged: the client's memory.
HELD = Figure(
    "most held unacknowledged by one consumer", "max_held", higher_is_better=False, count=True
)
QUEUE_ACKS = ("--ack", "client-individual", "--prefetch", "1000")
# The targets for adaptive windows (consumerFlowLimit=auto), on the rows they apply to.
AUTO_FINISH = "finish <= fairness-fair (fair, prefetch 1000)"
AUTO_IDLE = "<= 0.3 s"
AUTO_HELD = ">= 5x fewer than fairness (prefetch 1000)"
# By default Sluiceway, as Open MQ, holds at most 100,000 messages in an auto-created queue and
# throttles producers once it holds 100,000 messages in all and a destination has 1,000 waiting
# (the JMS IQ throttling). The backlog scenario asks for a million with no consumer, so both are
# lifted; memory is left to the defaults: beyond the swap point messages go to disk.
UNLIMITED = ("imq.autocreate.destination.maxNumMsgs=-1", "imq.throttling.server.threshold=0")


MEGABYTES = Figure("MB/s of bodies received", "megabytes_per_second")


def large(label: str, size: int, messages: int) -> Scenario:
    """Large bodies, one producer and one consumer, also through the relay (the ceiling)."""
    return Scenario(
        f"large-{label.replace(' ', '').lower()}",
        f"{label} bodies, 1 producer, 1 consumer, client-individual acks, prefetch 100",
        ("queue", "--messages", str(messages), "--size", str(size),
         "--ack", "client-individual", "--prefetch", "100"),
        (MEGABYTES, RECEIVED),
        brokers=("sluiceway", *PEERS, CEILING),
        target="2x best peer",
    )  # fmt: skip


def fairness(key: str, title: str, prefetch: int | str, **options: Any) -> Scenario:
    """4 consumers taking 5, 1, 1 and 1 ms per message: when is the work done, who idled, and
    how many messages a consumer held."""
    return Scenario(
        key,
        f"4 consumers sleeping 5, 1, 1, 1 ms per message, {title}",
        ("fairness", "--delays", "5,1,1,1", "--messages", "8000", "--prefetch", str(prefetch)),
        (FINISH, IDLE, IDLE_WHILE_HELD, HELD, RECEIVED),
        **options,
    )


AUTO_FAIRNESS_TARGETS = (
    (FINISH.key, AUTO_FINISH),
    (IDLE_WHILE_HELD.key, AUTO_IDLE),
    (HELD.key, AUTO_HELD),
)


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "queue",
        "queue, non-persistent, 1 producer, 1 consumer, client-individual acks, prefetch 1000",
        ("queue", "--messages", "100000", *QUEUE_ACKS),
        (RECEIVED,),
        target="2x best peer",
    ),
    Scenario(
        "queue-auto",
        "same, adaptive window (--prefetch auto: consumer-flow-limit:auto)",
        ("queue", "--messages", "100000", "--ack", "client-individual", "--prefetch", "auto"),
        (RECEIVED,),
        brokers=("sluiceway",),
        peers_from="queue",
        target=">= 0.95x queue (prefetch 1000)",
    ),
    Scenario(
        "latency",
        "same, at a fixed 2,000 msg/s",
        ("latency", "--rate", "2000", "--messages", "20000", *QUEUE_ACKS),
        (
            Figure("p50 (ms)", "latency_p50", higher_is_better=False),
            Figure("p99 (ms)", "latency_p99", higher_is_better=False),
        ),
        target="p99 < 1 ms",
    ),
    Scenario(
        "persistent",
        "persistent, a receipt per SEND, 100 outstanding, no consumer attached",
        ("backlog", "--persistent", "--receipts", "--window", "100", "--messages", "50000"),
        (SENT,),
        target="2x best peer",
    ),
    Scenario(
        "persistent-consumer",
        "persistent, a receipt per SEND, 100 outstanding, 1 consumer (client-individual)",
        (
            "queue",
            "--persistent",
            "--receipts",
            "--window",
            "100",
            *QUEUE_ACKS,
            "--messages",
            "50000",
        ),
        (SENT, RECEIVED),
        target="2x best peer",
    ),
    Scenario(
        "topic",
        "topic, 4 subscribers, non-persistent (received/s: deliveries)",
        ("topic", "--consumers", "4", "--messages", "100000"),
        (RECEIVED,),
        target="2x best peer",
    ),
    Scenario(
        "backlog",
        "backlog of 1,000,000 msgs, no consumer (sent/s: filling, received/s: draining)",
        ("backlog", "--messages", "1000000", "--timeout", "30"),
        (SENT, RECEIVED, Figure("peak RSS (MB)", "rss_mb", higher_is_better=False)),
        properties=UNLIMITED,
        target="RSS < 200 MB, rates >= best peer",
    ),
    large("16 KiB", 16 * 1024, 40_000),
    large("64 KiB", 64 * 1024, 10_000),
    large("1 MiB", 1024 * 1024, 1_000),
    Scenario(
        "small-many",
        "128-byte bodies, 4 producers, 4 consumers, ack:client with an ACK per message, "
        "prefetch 1000",
        (
            "queue",
            "--messages",
            "200000",
            "--size",
            "128",
            "--producers",
            "4",
            "--consumers",
            "4",
            "--ack",
            "client",
            "--ack-every",
            "1",
            "--prefetch",
            "1000",
        ),
        (RECEIVED,),
        # The peers hold producers that outrun the consumers; Sluiceway does so when asked
        # (by default it refuses past 100,000 messages, and without receipts they are lost).
        properties=("imq.autocreate.destination.limitBehavior=FLOW_CONTROL",),
        target="2x best peer",
    ),
    fairness("fairness", "prefetch 1000, default dispatch", 1000, target="no idling"),
    fairness(
        "fairness-fair",
        "prefetch 1000, Sluiceway's `fair` dispatch",
        1000,
        properties=("imq.autocreate.queue.dispatchPolicy=fair",),
        brokers=("sluiceway",),
        peers_from="fairness",
        target="finish <= prefetch 1",
    ),
    fairness(
        "fairness-auto",
        "adaptive windows (--prefetch auto), default dispatch",
        "auto",
        brokers=("sluiceway",),
        peers_from="fairness",
        targets=AUTO_FAIRNESS_TARGETS,
    ),
    fairness(
        "fairness-auto-fair",
        "adaptive windows (--prefetch auto), Sluiceway's `fair` dispatch",
        "auto",
        properties=("imq.autocreate.queue.dispatchPolicy=fair",),
        brokers=("sluiceway",),
        peers_from="fairness",
        targets=AUTO_FAIRNESS_TARGETS,
    ),
    fairness("fairness-1", "prefetch 1, default dispatch", 1),
)


@dataclass
class Broker:
    name: str
    port: int
    login: tuple[str, str]

    def command(self, state: Path, properties: tuple[str, ...]) -> list[str]:
        if self.name == CEILING:
            return [sys.executable, str(HERE / "relay.py"), "--port", str(self.port)]
        if self.name == "sluiceway":
            sluiceway = str(Path(sys.executable).with_name("sluiceway"))
            args = [sluiceway, "broker", "--port", str(self.port), "--data-dir", str(state)]
            for prop in ("imq.admin.http.port=-1", *properties):
                args += ["-D", prop]
            return args
        return ["bash", str(HERE / "peers.sh"), self.name, str(state), str(self.port)]


BROKERS = {
    "sluiceway": Broker("sluiceway", 61713, ("", "")),
    "rabbitmq": Broker("rabbitmq", 61723, ("guest", "guest")),  # +1, +2: AMQP, distribution
    "activemq": Broker("activemq", 61733, ("admin", "admin")),
    CEILING: Broker(CEILING, 61743, ("", "")),
}


@dataclass
class Measurement:
    run: int
    scenario: str
    broker: str
    figures: dict[str, float] = field(default_factory=dict)
    error: str = ""
    # The load processes that used more than BUSY_SHARE of a core: "consumer 0 93%".
    saturated: list[str] = field(default_factory=list)


def wait_for_port(port: int, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the broker exited with status {process.returncode} at start")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.25)
    raise RuntimeError(f"nothing listened on port {port} within {timeout:.0f} s")


@contextmanager
def running(broker: Broker, properties: tuple[str, ...]) -> Iterator[int]:
    """Start `broker` with a fresh state directory; yield the pid listening on its port."""
    if holder := listening_pid(broker.port):
        # Otherwise the run would measure that process, started for some other purpose.
        raise RuntimeError(
            f"port {broker.port}, where {broker.name} is to listen, is already taken by process"
            f" {holder}: stop it and run again"
        )
    with tempfile.TemporaryDirectory(prefix=f"compare-{broker.name}-") as state:
        log = open(Path(state) / "console.log", "wb")  # noqa: SIM115  (closed below)
        process = subprocess.Popen(
            broker.command(Path(state) / "broker", properties),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            wait_for_port(broker.port, process, START_TIMEOUT)
            pid = listening_pid(broker.port)
            if pid and os.getpgid(pid) != process.pid:  # another process took the port meanwhile
                raise RuntimeError(
                    f"port {broker.port} answered from process {pid}, not the broker"
                )
            yield pid
        finally:
            stop(process)
            log.close()


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the broker's process group, then SIGKILL to whatever is left of it."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    with suppress(subprocess.TimeoutExpired):
        process.wait(60)
    with suppress(ProcessLookupError):  # the group may outlive its leader (RabbitMQ's script)
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def bench(scenario: Scenario, broker: Broker, pid: int, scale: float) -> dict[str, Any]:
    args = list(scenario.bench)
    index = args.index("--messages") + 1
    args[index] = str(max(1000, round(int(args[index]) * scale)))
    login, passcode = broker.login
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [
            str(Path(sys.executable).with_name("sluiceway")), "bench", *args,
            "--port", str(broker.port), "--login", login, "--passcode", passcode,
            "--broker-pid", str(pid), "--json", out.name,
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
        if done.returncode not in (0, 1):
            raise RuntimeError(done.stderr.strip() or f"bench exited {done.returncode}")
        result: dict[str, Any] = json.loads(Path(out.name).read_text())
        if done.returncode == 1:
            result["errors"] = [*result.get("errors", []), done.stderr.strip()]
        return result


def figure_value(result: dict[str, Any], key: str) -> float | None:
    """A figure of a bench result; None when the result does not have it."""
    if key.startswith("latency_"):
        return float(result["latency_ms"][key.removeprefix("latency_")])
    if key == "rss_mb":
        return (result["broker_peak_rss_bytes"] or 0) / 1e6
    if key == "finish_seconds":
        rate = result["received_per_second"]
        return result["received"] / rate if rate else float("inf")
    if key == "max_idle_seconds":
        return max((c["idle_seconds"] for c in result["consumers"]), default=0.0)
    if key == "max_idle_while_held":
        key = "max_idle_while_others_held"  # null without --delays
    value = result.get(key)
    return None if value is None else float(value)


def measure(scenario: Scenario, name: str, run: int, scale: float) -> Measurement:
    broker = BROKERS[name]
    properties = scenario.properties if name == "sluiceway" else ()
    found = Measurement(run, scenario.key, name)
    try:
        with running(broker, properties) as pid:
            result = bench(scenario, broker, pid, scale)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        found.error = str(exc)
        return found
    found.figures = {
        f.key: value for f in scenario.figures if (value := figure_value(result, f.key)) is not None
    }
    found.saturated = busy_processes(result)
    if result["missing"] or result["duplicated"] or result["errors"]:
        found.error = "; ".join(result["errors"]) or (
            f"{result['missing']} missing, {result['duplicated']} duplicated"
        )
    return found


def busy_processes(result: dict[str, Any]) -> list[str]:
    """The load processes of a bench result that used more than BUSY_SHARE of a core."""
    processes = [ProcessCpu(**p) for p in result.get("processes", [])]
    return [f"{p.process} {p.share:.0%}" for p in saturated(processes, BUSY_SHARE)]


def ratio(value: float, best: float, higher_is_better: bool) -> float:
    if value <= 0 or best <= 0:
        return 0.0
    return value / best if higher_is_better else best / value


def peer_ratio(m: Measurement, others: list[Measurement], figure: Figure) -> float | None:
    """`m`'s figure as a ratio to the best peer's in the same run, if a peer has it."""
    peers = [
        p.figures[figure.key]
        for p in others
        if p.run == m.run and p.broker in PEERS and not p.error and figure.key in p.figures
    ]
    if not peers:
        return None
    best = max(peers) if figure.higher_is_better else min(peers)
    value = m.figures[figure.key]
    if value <= 0 or best <= 0:
        return None  # no ratio to or from nothing (a consumer that never idled, say)
    return ratio(value, best, figure.higher_is_better)


def summarise(scenario: Scenario, measurements: list[Measurement]) -> list[str]:
    """The table rows of `scenario`: per figure, each broker's median and median ratio."""
    mine = [m for m in measurements if m.scenario == scenario.key and not m.error]
    peers = [m for m in measurements if m.scenario == scenario.peers_from and not m.error]
    rows = []
    for figure in scenario.figures:
        cells = []
        for name in COLUMNS:
            ran = [m for m in mine if m.broker == name]
            runs = [m for m in ran if figure.key in m.figures]
            if not runs:
                # Runs saved before this figure existed did not measure it.
                gone = "not measured" if ran else "failed"
                cells.append("n/a" if name not in scenario.brokers else gone)
                continue
            values = [m.figures[figure.key] for m in runs]
            ratios = [r for m in runs if (r := peer_ratio(m, mine + peers, figure)) is not None]
            median = statistics.median(values)
            shown = number(median, whole=figure.count)
            shown += "*" if any(m.saturated for m in runs) else ""
            shown += f" ({statistics.median(ratios):.2f}x)" if ratios else ""
            if len(values) > 1:
                low, high = (
                    number(v, median, whole=figure.count) for v in (min(values), max(values))
                )
                shown += f" [{low}-{high}]"
            cells.append(shown)
        target = scenario.target_of(figure)
        rows.append(f"| {scenario.title}: {figure.label} | {' | '.join(cells)} | {target} |")
    return rows


def number(value: float, like: float | None = None, *, whole: bool = False) -> str:
    """`value` with no decimals from 100 up (or when `whole`), else two; as `like` would be
    shown, if given."""
    if whole or (value if like is None else like) >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}"


def table(measurements: list[Measurement], runs: int) -> str:
    failed = [m for m in measurements if m.error]
    lines = [
        f"Medians of {runs} interleaved runs; in round brackets, the ratio to the best peer in "
        "the same run (higher is better for every ratio); in square brackets, the lowest and "
        "highest of the runs. The relay is no broker: it carries the same frames from the "
        "producer to the consumer and keeps nothing (relay.py), the ceiling for large bodies. "
        "In the fairness rows, a consumer reads what the broker sends into a local queue and "
        "works it off one message at a time; the figure held is the most messages one consumer "
        "held at once, received and not yet acknowledged (its client's memory), and idle while "
        "another held unstarted messages is the longest any consumer waited with nothing to do "
        "while another had messages in its local queue.",
        "",
        "| scenario: figure | Sluiceway | RabbitMQ 3.10 | ActiveMQ 5.17 | relay (ceiling) "
        "| target |",
        "|---|---|---|---|---|---|",
    ]
    for scenario in SCENARIOS:
        lines += summarise(scenario, measurements)
    lines += [
        "",
        "The scenarios' command lines (each broker also gets `--port`, `--login`, "
        "`--passcode` and `--broker-pid`; `-D` are Sluiceway's broker properties):",
        "",
    ]
    for scenario in SCENARIOS:
        properties = "".join(f" -D {p}" for p in scenario.properties)
        only = "" if scenario.brokers != ("sluiceway",) else " (Sluiceway only)"
        lines.append(f"- `{scenario.key}`{only}: `sluiceway bench {' '.join(scenario.bench)}`"
                     + (f"; broker{properties}" if properties else ""))  # fmt: skip
    busy = [m for m in measurements if m.saturated and not m.error]
    if busy:
        lines += [
            "",
            "Figures marked * were measured while a process of the load generator used more "
            f"than {BUSY_SHARE:.0%} of a core, in these runs: there the figure may be the "
            "generator's limit, not the broker's.",
            "",
        ]
        lines += [
            f"- run {m.run}, {m.scenario}, {m.broker}: {', '.join(m.saturated)}" for m in busy
        ]
    if failed:
        lines += ["", "Runs that failed or lost messages (left out of the medians):", ""]
        lines += [f"- run {m.run}, {m.scenario}, {m.broker}: {m.error[:300]}" for m in failed]
    return "\n".join(lines) + "\n"


def write_readme(text: str) -> None:
    readme = README.read_text()
    head, _, rest = readme.partition(BEGIN)
    _, _, tail = rest.partition(END)
    README.write_text(f"{head}{BEGIN}\n{text}{END}{tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--brokers", default=",".join(COLUMNS))
    parser.add_argument("--scenarios", default=",".join(s.key for s in SCENARIOS))
    parser.add_argument("--scale", type=float, default=1.0, help="multiply message counts")
    parser.add_argument(
        "--no-readme", action="store_true", help="print the table, leave README.md as it is"
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=RESULTS,
        help="where every run's figures go (default results/compare.json; --merge and "
        "--from-results read it)",
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the other scenarios' measurements from results/compare.json (run again "
        "only the scenarios named)",
    )
    parser.add_argument(
        "--from-results", action="store_true", help="measure nothing: table from compare.json"
    )
    args = parser.parse_args()
    if args.from_results:
        saved = json.loads(args.results.read_text())
        measurements = [Measurement(**m) for m in saved["measurements"]]
        publish(
            measurements, saved["runs"], saved["scale"], args.results, readme=not args.no_readme
        )
        return
    chosen = chosen_scenarios(args.scenarios)
    unknown = sorted(set(args.brokers.split(",")) - set(COLUMNS))
    if unknown:
        sys.exit(f"compare.py: --brokers: no broker {', '.join(unknown)}; one of {COLUMNS}")
    measurements = []
    if args.merge:
        keys = {s.key for s in chosen}
        saved = json.loads(args.results.read_text())
        if saved["runs"] != args.runs or saved["scale"] != args.scale:
            sys.exit("compare.py: --merge needs the --runs and --scale of compare.json")
        measurements = [
            Measurement(**m) for m in saved["measurements"] if m["scenario"] not in keys
        ]
    measurements += run_all(chosen, args.brokers.split(","), args.runs, args.scale)
    publish(measurements, args.runs, args.scale, args.results, readme=not args.no_readme)


def chosen_scenarios(names: str) -> list[Scenario]:
    """The scenarios named (comma-separated), in the table's order; exits on an unknown name."""
    wanted = {name.strip() for name in names.split(",") if name.strip()}
    unknown = sorted(wanted - {s.key for s in SCENARIOS})
    if unknown:
        sys.exit(
            f"compare.py: --scenarios: no scenario {', '.join(unknown)}; the scenarios are "
            + ", ".join(s.key for s in SCENARIOS)
        )
    return [s for s in SCENARIOS if s.key in wanted]


def run_all(
    chosen: list[Scenario], brokers: list[str], runs: int, scale: float
) -> list[Measurement]:
    measurements = []
    for run in range(1, runs + 1):
        order = brokers[run - 1 :] + brokers[: run - 1]  # rotated each run
        for scenario in chosen:
            for name in (b for b in order if b in scenario.brokers):
                m = measure(scenario, name, run, scale)
                measurements.append(m)
                shown = ", ".join(f"{k} {v:,.2f}" for k, v in m.figures.items())
                print(f"run {run} {scenario.key} {name}: {shown} {m.error}".rstrip(), flush=True)
    return measurements


def publish(
    measurements: list[Measurement], runs: int, scale: float, results: Path, *, readme: bool
) -> None:
    text = table(measurements, runs)
    results.parent.mkdir(exist_ok=True)
    results.write_text(json.dumps({
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
                   f"{platform.python_version()}",
        "runs": runs,
        "scale": scale,
        "measurements": [m.__dict__ for m in measurements],
    }, indent=2) + "\n")  # fmt: skip
    print(text)
    if readme:
        write_readme(text)


if __name__ == "__main__":
    main()
