"""Password checks under a flood of wrong passwords: an authenticated client's round trip.

A broker process is started with authentication on (a users file of one user, `bench`). An
authenticated client connects first, then sends a non-persistent SEND with a receipt every
`--interval-ms` and times each SEND/RECEIPT round trip on its open connection. The rounds
alternate two phases of `--seconds` each:

- quiet: nothing else talks to the broker;
- attack: `--attackers` connections (60) from a child process each send a CONNECT for `bench`
  with a wrong passcode, wait for the answer (an ERROR; the broker then closes the connection),
  open a new connection and try again at once: as fast as the broker answers. The round trips
  are counted from one second after the attack started, once every attacker is in its loop.

For each phase: the round trips' median, p99 and max (ms), the broker's CPU (its process,
every thread), and for the attack the attempts answered, their statuses and how long an
attacker waited for each answer (median, max). The load average before and after each run is
recorded: the machine is shared, and a busy one shows in the quiet phase's figures. Prints a
table and writes benchmarks/results/password_checks.json (or `--results FILE`).

    ./dev bench password_checks [--rounds 3] [--seconds 8] [--attackers 60] [-D name=value]...

`-D` passes a broker property (`-D imq.authentication.workers=2`). `--pythonpath DIR` runs the
broker from another source tree (`git archive` of another commit, unpacked), to compare builds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Final

from sluiceway import BUILD
from sluiceway.security.users import UserFile

RESULTS: Final = Path(__file__).parent / "results" / "password_checks.json"
USER: Final = "bench"
PASSWORD: Final = "bench-password-7Qx"  # noqa: S105  (the benchmark's own user)
WRONG: Final = "not-the-password"
WARM_UP_S: Final = 1.0  # attack phase: the first second is not counted
START_TIMEOUT_S: Final = 60.0
ANSWER_TIMEOUT_S: Final = 30.0  # a round trip or an attacker's answer slower than this fails
CONNECT: Final = (
    "CONNECT\naccept-version:1.2\nhost:bench\nheart-beat:0,0\nlogin:{}\npasscode:{}\n\n\0"
)


# -- the authenticated client ----------------------------------------------------------------------


class Client:
    """A blocking STOMP client that connects and times SEND/RECEIPT round trips."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=ANSWER_TIMEOUT_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""
        self.sent = 0
        self.sock.sendall(CONNECT.format(USER, PASSWORD).encode())
        frame = self._frame()
        if not frame.startswith(b"CONNECTED"):
            raise RuntimeError(f"the client was not let in: {frame[:300]!r}")

    def _frame(self) -> bytes:
        while b"\0" not in self.buffer:
            data = self.sock.recv(65536)
            if not data:
                raise RuntimeError("the broker closed the client's connection")
            self.buffer += data
        frame, _, self.buffer = self.buffer.partition(b"\0")
        return frame.lstrip(b"\r\n")

    def round_trip(self) -> float:
        """One SEND with a receipt; the seconds until its RECEIPT."""
        self.sent += 1
        receipt = f"r{self.sent}"
        frame = f"SEND\ndestination:/queue/bench-rtt\npersistent:false\nreceipt:{receipt}\n\nx\0"
        started = time.perf_counter()
        self.sock.sendall(frame.encode())
        answer = self._frame()
        elapsed = time.perf_counter() - started
        if not answer.startswith(b"RECEIPT") or f"receipt-id:{receipt}".encode() not in answer:
            raise RuntimeError(f"expected the RECEIPT of {receipt}, got {answer[:300]!r}")
        return elapsed

    def measure(self, seconds: float, interval: float) -> list[float]:
        """Round trips, one every `interval` (or as soon as the last is back), for `seconds`."""
        times: list[float] = []
        end = time.perf_counter() + seconds
        next_at = time.perf_counter()
        while next_at < end:
            pause = next_at - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            times.append(self.round_trip())
            next_at = max(next_at + interval, time.perf_counter())
        return times

    def close(self) -> None:
        self.sock.close()


# -- the attackers (a child process) ---------------------------------------------------------------


async def _attacker(port: int, answers: list[tuple[str, float]], stop: asyncio.Event) -> None:
    request = CONNECT.format(USER, WRONG).encode()
    while not stop.is_set():
        started = time.perf_counter()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError as exc:
            answers.append((f"connect failed: {exc.strerror}", time.perf_counter() - started))
            await asyncio.sleep(0.1)
            continue
        try:
            writer.write(request)
            async with asyncio.timeout(ANSWER_TIMEOUT_S):
                frame = await reader.readuntil(b"\0")
            answers.append((_status(frame), time.perf_counter() - started))
        except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
            answers.append((type(exc).__name__, time.perf_counter() - started))
        finally:
            writer.close()


def _status(frame: bytes) -> str:
    for line in frame.split(b"\n"):
        if line.startswith(b"status:"):
            return line[7:].decode()
    return frame.split(b"\n", 1)[0].decode(errors="replace")


async def _attack(port: int, count: int) -> None:
    """Attack until a line (or end of file) on stdin; then print what was answered, as JSON."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    answers: list[tuple[str, float]] = []
    tasks = [asyncio.create_task(_attacker(port, answers, stop)) for _ in range(count)]
    print("attacking", flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)
    marked = len(answers)  # the parent says when the counted part starts: a first line
    started = time.perf_counter()
    await loop.run_in_executor(None, sys.stdin.readline)
    seconds = time.perf_counter() - started
    counted = answers[marked:]
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    print(json.dumps({"seconds": seconds, "answers": counted}), flush=True)


class Attack:
    """The child process that runs the attackers."""

    def __init__(self, port: int, count: int) -> None:
        command = [sys.executable, __file__, "--attack-child", str(port), str(count)]
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        if self.process.stdout.readline().strip() != "attacking":
            self.process.kill()
            raise RuntimeError("the attackers did not start")

    def mark(self) -> None:
        """The counted part starts now."""
        assert self.process.stdin is not None
        self.process.stdin.write("mark\n")
        self.process.stdin.flush()

    def stop(self) -> dict[str, Any]:
        assert self.process.stdin is not None
        out, _ = self.process.communicate("stop\n", timeout=ANSWER_TIMEOUT_S + 30)
        row: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return row

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


# -- the broker ------------------------------------------------------------------------------------


class Broker:
    """A broker process with authentication on and one user."""

    def __init__(self, directory: Path, properties: list[str], pythonpath: Path | None) -> None:
        users = directory / "passwd"
        UserFile(users).add(USER, PASSWORD, ())
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if pythonpath is not None:
            env["PYTHONPATH"] = str(pythonpath)
        defines = [
            "imq.authentication.enabled=true",
            f"imq.user_repository.file.filename={users}",
            "imq.admin.http.port=-1",
            *properties,
        ]
        command = [sys.executable, "-m", "sluiceway", "broker", "--port", "0"]
        command += ["--data-dir", str(directory / "data")]
        for define in defines:
            command += ["-D", define]
        self.process = subprocess.Popen(
            command, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
        )
        self.port = self._wait_ready()

    def _wait_ready(self) -> int:
        stderr = self.process.stderr
        assert stderr is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        lines = []
        while time.monotonic() < deadline:
            line = stderr.readline()
            if not line:
                break
            lines.append(line)
            if " ready" in line and "STOMP on " in line:
                port = int(line.split("STOMP on ", 1)[1].split(",", 1)[0].rsplit(":", 1)[1])
                # The broker logs every refusal: read its log so a full pipe never blocks it.
                self._drain = threading.Thread(target=stderr.read, daemon=True)
                self._drain.start()
                return port
        self.stop()
        raise RuntimeError("the broker never logged its ready line:\n" + "".join(lines))

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        drain = getattr(self, "_drain", None)
        if drain is not None:
            drain.join(timeout=30)


# -- measuring -------------------------------------------------------------------------------------


def _ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {"count": 0}
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {
        "count": len(ordered),
        "median_ms": statistics.median(ordered) * 1000,
        "p99_ms": p99 * 1000,
        "max_ms": ordered[-1] * 1000,
    }


def quiet_phase(broker: Broker, client: Client, args: argparse.Namespace) -> dict[str, Any]:
    cpu = broker.cpu_seconds()
    times = client.measure(args.seconds, args.interval_ms / 1000)
    return {
        "phase": "quiet",
        "round_trips": _ms(times),
        "broker_cpu_share": (broker.cpu_seconds() - cpu) / args.seconds,
    }


def attack_phase(broker: Broker, client: Client, args: argparse.Namespace) -> dict[str, Any]:
    attack = Attack(broker.port, args.attackers)
    try:
        client.measure(WARM_UP_S, args.interval_ms / 1000)  # (not counted)
        attack.mark()
        cpu = broker.cpu_seconds()
        times = client.measure(args.seconds, args.interval_ms / 1000)
        cpu = broker.cpu_seconds() - cpu
        seen = attack.stop()
    finally:
        attack.kill()
    answers = seen["answers"]
    statuses = Counter(status for status, _ in answers)
    return {
        "phase": "attack",
        "round_trips": _ms(times),
        "broker_cpu_share": cpu / args.seconds,
        "attempts_answered": len(answers),
        "attempts_per_s": len(answers) / seen["seconds"],
        "statuses": dict(statuses),
        "attacker_wait": _ms([seconds for _, seconds in answers]),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="password-checks-") as directory:
        broker = Broker(Path(directory), args.define, args.pythonpath)
        try:
            client = Client(broker.port)
            try:
                phases = []
                for _ in range(args.rounds):
                    phases.append(quiet_phase(broker, client, args))
                    print(json.dumps(phases[-1]), flush=True)
                    phases.append(attack_phase(broker, client, args))
                    print(json.dumps(phases[-1]), flush=True)
            finally:
                client.close()
        finally:
            broker.stop()
    return {"phases": phases, "load_before": load_before, "load_after": os.getloadavg()}


def _merged(phases: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """The medians over the rounds of one phase's figures."""
    rows = [phase for phase in phases if phase["phase"] == name]
    figures = ("median_ms", "p99_ms", "max_ms")
    merged: dict[str, Any] = {
        key: statistics.median(row["round_trips"][key] for row in rows) for key in figures
    }
    merged["max_of_rounds_ms"] = max(row["round_trips"]["max_ms"] for row in rows)
    merged["broker_cpu_share"] = statistics.median(row["broker_cpu_share"] for row in rows)
    if name == "attack":
        merged["attempts_per_s"] = statistics.median(row["attempts_per_s"] for row in rows)
        merged["attacker_wait_median_ms"] = statistics.median(
            row["attacker_wait"]["median_ms"] for row in rows if row["attacker_wait"]["count"]
        )
        statuses: Counter[str] = Counter()
        for row in rows:
            statuses.update(row["statuses"])
        merged["statuses"] = dict(statuses)
    return merged


def _table(summary: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| phase | round trip median | p99 | max (median of rounds) | max (all rounds) "
        "| broker CPU | attempts answered/s | attacker's wait, median |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, row in summary.items():
        attack = name == "attack"
        lines.append(
            f"| {name} | {row['median_ms']:.2f} ms | {row['p99_ms']:.2f} ms "
            f"| {row['max_ms']:.2f} ms | {row['max_of_rounds_ms']:.2f} ms "
            f"| {row['broker_cpu_share']:.0%} "
            f"| {row['attempts_per_s']:.1f} | {row['attacker_wait_median_ms']:.0f} ms |"
            if attack
            else f"| {name} | {row['median_ms']:.2f} ms | {row['p99_ms']:.2f} ms "
            f"| {row['max_ms']:.2f} ms | {row['max_of_rounds_ms']:.2f} ms "
            f"| {row['broker_cpu_share']:.0%} | | |"
        )
    return "\n".join(lines)


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="quiet and attack phases, in turn")
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each phase")
    parser.add_argument("--attackers", type=int, default=60, help="connections guessing")
    parser.add_argument("--interval-ms", type=float, default=5.0, help="between round trips")
    parser.add_argument("-D", dest="define", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--pythonpath", type=Path, help="run the broker from this source tree")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--note", default="", help="written into the results as it is")
    parser.add_argument("--attack-child", nargs=2, type=int, help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = _parse()
    if args.attack_child is not None:
        asyncio.run(_attack(*args.attack_child))
        return
    measured = run(args)
    summary = {name: _merged(measured["phases"], name) for name in ("quiet", "attack")}
    command = shlex.join(["benchmarks/password_checks.py", *sys.argv[1:]])
    results = {
        "command": command,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "build": BUILD.reason if args.pythonpath is None else f"source tree {args.pythonpath}",
        "broker_properties": args.define,
        "attackers": args.attackers,
        "seconds_per_phase": args.seconds,
        "interval_ms": args.interval_ms,
        "note": args.note,
        "summary": summary,
        **measured,
    }
    args.results.parent.mkdir(exist_ok=True)
    args.results.write_text(json.dumps(results, indent=2) + "\n")
    print()
    print(_table(summary))
    print(f"load average before {measured['load_before']}, after {measured['load_after']}")


if __name__ == "__main__":
    main()
