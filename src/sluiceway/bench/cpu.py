"""How busy each process was: the generator's own, to tell when they and not the broker set the
figures, and the broker's.

- A load process measures itself (`BusyWindow`): its CPU clock (`time.process_time_ns`, every
  thread, nanoseconds) and the monotonic clock, read when its work starts and each time it
  does some. A producer works from its first send to the broker's answer to its DISCONNECT; a
  consumer from the read that brought its first message to the one that brought its last. The
  spans are those of sent/s and received/s, so a share is of the time the figure covers.
- The broker is read from outside, in /proc/PID/stat (Linux: user and system time of every
  thread, in clock ticks of 1/100 s), when the producers are let go and when the run ends.

A share is CPU seconds per second of wall time: 1.0 is one core kept busy. An asyncio process
near 1.0 (above `BUSY_SHARE`: the rest goes on waiting for the kernel) cannot go faster, so the
figure is the generator's limit, not the broker's.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

BUSY_SHARE = 0.8  # a load process above this share of one core is taken as saturated


@dataclass
class BusyWindow:
    """A process's own CPU and wall time over the span in which it worked (nanoseconds)."""

    wall_start: int = 0
    cpu_start: int = 0
    wall_end: int = 0
    cpu_end: int = 0

    def begin(self, wall_ns: int = 0, cpu_ns: int = 0) -> None:
        """The work starts now (or at readings taken earlier); only the first call counts."""
        if not self.wall_start:
            self.wall_start = wall_ns or time.monotonic_ns()
            self.cpu_start = cpu_ns or time.process_time_ns()
            self.wall_end, self.cpu_end = self.wall_start, self.cpu_start

    def mark(self) -> None:
        """Some work was done up to now."""
        if self.wall_start:
            self.wall_end = time.monotonic_ns()
            self.cpu_end = time.process_time_ns()

    @property
    def seconds(self) -> float:
        return (self.wall_end - self.wall_start) / 1e9

    @property
    def cpu_seconds(self) -> float:
        return (self.cpu_end - self.cpu_start) / 1e9


def share(cpu_seconds: float, seconds: float) -> float:
    """CPU seconds per second of wall time; 0 for a span too short to tell."""
    return cpu_seconds / seconds if seconds > 0 else 0.0


@dataclass(frozen=True, slots=True)
class ProcessCpu:
    """One process's CPU over its span, as reported."""

    process: str  # "producer 0", "consumer 2"
    pid: int
    cpu_seconds: float
    seconds: float  # the span it worked
    share: float  # of one core


def saturated(processes: list[ProcessCpu], threshold: float = BUSY_SHARE) -> list[ProcessCpu]:
    """The processes whose share of a core was above `threshold` (a fraction: 0.8 is 80 %)."""
    return [p for p in processes if p.share > threshold]


def advice(busy: ProcessCpu, scenario: str) -> str:
    """What spreads `busy`'s work over more processes, for a warning."""
    if busy.process.startswith("producer"):
        return "run more producer processes (--producers N): they share the sends"
    if scenario in ("topic", "fairness"):
        # Every subscriber gets every message; fairness takes its consumers from --delays.
        return "more consumers would not share this load: lower the rate (--rate N)"
    return "run more consumer processes (--consumers N): they share the messages"


def warning(busy: ProcessCpu, scenario: str, threshold: float = BUSY_SHARE) -> str:
    return (
        f"warning: {busy.process} (pid {busy.pid}) used {busy.share:.0%} of a core "
        f"(above {threshold:.0%}): the figures are bounded by the load generator, not the "
        f"broker; {advice(busy, scenario)}"
    )


TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # of /proc


def process_cpu_seconds(pid: int) -> float | None:
    """User and system CPU seconds of process `pid` so far (Linux /proc); None once it is gone
    or where there is no /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return None
    return stat_cpu_seconds(text)


def stat_cpu_seconds(text: bytes) -> float:
    """User plus system seconds from the text of a /proc/PID/stat file."""
    # The name, in brackets, may hold spaces and brackets: the fields follow the last ')'.
    fields = text[text.rindex(b")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / TICKS_PER_SECOND


class ProcessClock:
    """Another process's CPU share between `start` and `stop` (Linux /proc)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._wall = 0
        self._cpu: float | None = None
        self.result: ProcessCpu | None = None  # once stopped, if the process could be read

    def start(self) -> None:
        self._wall, self._cpu = time.monotonic_ns(), process_cpu_seconds(self.pid)

    def stop(self) -> ProcessCpu | None:
        end = process_cpu_seconds(self.pid)
        if self._wall and self._cpu is not None and end is not None:
            seconds = (time.monotonic_ns() - self._wall) / 1e9
            cpu = end - self._cpu
            self.result = ProcessCpu("broker", self.pid, cpu, seconds, share(cpu, seconds))
        return self.result


def listening_pid(port: int) -> int:
    """The process with a socket listening on TCP `port` (Linux /proc), 0 if none is seen
    (none, no /proc, or the process is not ours to read)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as lines:
                next(lines)
                for line in lines:
                    parts = line.split()
                    if parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(f"socket:[{parts[9]}]")
        except OSError:
            continue
    if not inodes:
        return 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    return int(pid)
        except OSError:
            continue  # gone, or not ours to read
    return 0
