"""The generator's CPU accounting, and the warning when a load process, not the broker, set the
figures: spans and shares from fake clock readings, the saturation rule from fake shares."""

from __future__ import annotations

import argparse
import io
import os
import socket
import time

import pytest

from sluiceway.bench.command import publish
from sluiceway.bench.cpu import (
    BusyWindow,
    ProcessClock,
    ProcessCpu,
    listening_pid,
    process_cpu_seconds,
    saturated,
    stat_cpu_seconds,
    warning,
)
from sluiceway.bench.report import build_report, render_table
from sluiceway.bench.runner import Outcome, Scenario, Settings
from sluiceway.bench.workers import ConsumerResult, ProducerResult, Target

pytestmark = pytest.mark.timeout(30)
SECOND = 1_000_000_000


def busy(wall_seconds: float, cpu_seconds: float) -> BusyWindow:
    """A window that began at 5 s (wall) and 2 s (CPU), as a worker's clocks would give it."""
    start_wall, start_cpu = 5 * SECOND, 2 * SECOND
    return BusyWindow(
        start_wall,
        start_cpu,
        start_wall + round(wall_seconds * SECOND),
        start_cpu + round(cpu_seconds * SECOND),
    )


def spin(seconds: float) -> None:
    """Keep this process on the CPU for `seconds` of its own CPU time (bounded by the clock)."""
    end = time.process_time() + seconds
    deadline = time.monotonic() + 10
    while time.process_time() < end and time.monotonic() < deadline:
        pass


def test_a_window_counts_from_its_first_begin_to_its_last_mark() -> None:
    window = BusyWindow()
    window.mark()  # before any work: nothing to extend
    assert window.seconds == window.cpu_seconds == 0
    window.begin()
    first = (window.wall_start, window.cpu_start)
    spin(0.02)
    window.begin()  # a later begin does not move the start
    window.mark()
    assert (window.wall_start, window.cpu_start) == first
    assert window.cpu_seconds >= 0.02
    assert window.seconds >= window.cpu_seconds * 0.99  # one thread cannot use more than wall


def test_a_window_can_begin_at_readings_taken_earlier() -> None:
    window = BusyWindow()
    window.begin(wall_ns=7 * SECOND, cpu_ns=3 * SECOND)
    assert (window.wall_start, window.cpu_start, window.wall_end) == (
        7 * SECOND,
        3 * SECOND,
        7 * SECOND,
    )


def test_proc_stat_is_read_past_a_name_holding_brackets_and_spaces() -> None:
    line = b"4242 (odd ) (name) S 1 2 3 0 -1 4194304 10 0 0 0 250 75 0 0 20 0 1 0 99 0 0"
    assert stat_cpu_seconds(line) == pytest.approx(3.25)  # (250 + 75) ticks of 1/100 s


def test_another_process_is_measured_from_proc_and_a_gone_one_is_none() -> None:
    clock = ProcessClock(os.getpid())
    clock.start()
    spin(0.05)
    measured = clock.stop()
    assert measured is not None
    assert measured.process == "broker"
    assert measured.cpu_seconds > 0
    assert 0 < measured.share <= (os.cpu_count() or 1)
    assert process_cpu_seconds(2**22 + 1) is None  # above Linux's largest pid
    gone = ProcessClock(2**22 + 1)
    gone.start()
    assert gone.stop() is None


def test_the_process_listening_on_a_port_is_found() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        assert listening_pid(listener.getsockname()[1]) == os.getpid()


def test_only_shares_above_the_threshold_are_saturated() -> None:
    processes = [
        ProcessCpu("producer 0", 11, 0.9, 1.0, 0.9),
        ProcessCpu("consumer 0", 12, 0.8, 1.0, 0.8),
        ProcessCpu("consumer 1", 13, 0.0, 1.0, 0.0),
    ]
    assert [p.process for p in saturated(processes)] == ["producer 0"]  # 80 % is not above
    assert [p.process for p in saturated(processes, 0.0)] == ["producer 0", "consumer 0"]


@pytest.mark.parametrize(
    ("process", "scenario", "advice"),
    [
        ("producer 0", "topic", "--producers N"),
        ("consumer 1", "queue", "--consumers N"),
        ("consumer 1", "backlog", "--consumers N"),
        ("consumer 1", "topic", "--rate N"),  # every subscriber gets every message
    ],
)
def test_the_warning_names_the_process_its_share_and_what_to_run(
    process: str, scenario: str, advice: str
) -> None:
    text = warning(ProcessCpu(process, 4242, 0.83, 1.0, 0.83), scenario)
    assert f"{process} (pid 4242) used 83% of a core (above 80%)" in text
    assert "bounded by the load generator, not the broker" in text
    assert advice in text


def outcome(busy_share: float, *windows: tuple[str, BusyWindow]) -> Outcome:
    settings = Settings(
        Scenario.QUEUE, Target("127.0.0.1", 1), "/queue/q", 10, busy_share=busy_share
    )
    found = Outcome(settings, start_ns=SECOND, end_ns=3 * SECOND)
    for name, window in windows:
        kind, index = name.split()
        if kind == "producer":
            found.producers.append(ProducerResult(int(index), busy=window, pid=100 + int(index)))
        else:
            bitmaps = [bytes(2)]  # the one producer's 10 messages: none seen
            consumer = ConsumerResult(
                int(index), bitmaps=bitmaps, busy=window, pid=200 + int(index)
            )
            found.consumers.append(consumer)
    found.broker_cpu = ProcessCpu("broker", 99, 1.5, 2.0, 0.75)
    return found


def test_the_report_gives_each_process_its_share_and_warns_of_the_saturated_ones() -> None:
    report = build_report(
        outcome(0.8, ("producer 0", busy(2.0, 1.8)), ("consumer 0", busy(0.5, 0.2)))
    )
    producer, consumer = report.processes
    assert (producer.process, producer.pid, producer.share) == ("producer 0", 100, 0.9)
    assert (consumer.process, consumer.cpu_seconds, consumer.share) == ("consumer 0", 0.2, 0.4)
    assert report.generator_saturated == ["producer 0"]
    (line,) = report.warnings
    assert "producer 0 (pid 100) used 90% of a core" in line
    table = render_table(report)
    assert "producer CPU  #0 90% of a core, while sending" in table
    assert "consumer CPU  #0 40% of a core, while receiving" in table
    assert "broker CPU    75% of a core (pid 99)" in table
    assert '"generator_saturated": [\n    "producer 0"\n  ]' in report.to_json()


def test_no_warning_below_the_threshold_and_every_one_at_zero() -> None:
    quiet = build_report(outcome(0.8, ("producer 0", busy(1.0, 0.3))))
    assert (quiet.generator_saturated, quiet.warnings) == ([], [])
    forced = build_report(
        outcome(0.0, ("producer 0", busy(1.0, 0.3)), ("consumer 0", busy(1.0, 0.1)))
    )
    assert forced.generator_saturated == ["producer 0", "consumer 0"]


def test_the_warning_goes_to_stderr_and_does_not_fail_the_run() -> None:
    report = build_report(outcome(0.8, ("consumer 3", busy(1.0, 0.95))))
    stdout, stderr = io.StringIO(), io.StringIO()
    args = argparse.Namespace(json=None, plot=None)
    assert publish(report, args, stdout, stderr) == 0  # nothing was sent, none missing
    assert "sluiceway bench: warning: consumer 3 (pid 203) used 95% of a core" in (
        stderr.getvalue()
    )
    assert "--consumers N" in stderr.getvalue()
