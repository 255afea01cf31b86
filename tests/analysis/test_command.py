"""`sluiceway analyze` before Spark starts: options, where the history is looked for, the
standalone master it must reach, and how each failure is reported (one line on stderr, an exit
status per cause). Nothing here starts Spark."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import pytest

from sluiceway.analysis.errors import AnalysisUsageError, HistoryNotFound
from sluiceway.analysis.options import build_options, parse_pool_size, parse_time
from sluiceway.analysis.sources import history_files, hour_of, is_remote

NOW: Final = datetime(2026, 3, 24, 12, 0, tzinfo=UTC)
NOW_MS: Final = round(NOW.timestamp() * 1000)
HOUR_MS: Final = 3_600_000


def analyze(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluiceway", "analyze", *args],
        capture_output=True,
        text=True,
        timeout=45,  # below the test's 60 s, with room to report what it printed
        check=False,
        env=env,
    )


def error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("sluiceway analyze: ")
    return lines[0]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-03-24T09:30", NOW_MS - 150 * 60_000),  # no offset: UTC
        ("2026-03-24 10:30:00+01:00", NOW_MS - 150 * 60_000),
        ("2026-03-24", NOW_MS - 12 * HOUR_MS),
        ("90m", NOW_MS - 90 * 60_000),
        ("2h", NOW_MS - 2 * HOUR_MS),
        ("1d", NOW_MS - 24 * HOUR_MS),
        ("45s", NOW_MS - 45_000),
    ],
)
def test_times_are_iso_or_a_span_before_now(text: str, expected: int) -> None:
    assert parse_time(text, NOW, "--since") == expected


def test_a_time_it_cannot_read_is_a_usage_error() -> None:
    with pytest.raises(AnalysisUsageError, match=r"--until 'yesterday' is neither"):
        parse_time("yesterday", NOW, "--until")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("32", ("", 32)), ("/queue/orders=16", ("/queue/orders", 16))],
)
def test_pool_sizes_for_all_or_one_destination(text: str, expected: tuple[str, int]) -> None:
    assert parse_pool_size(text) == expected


@pytest.mark.parametrize("text", ["0", "many", "orders=4", "/queue/orders=-1"])
def test_bad_pool_sizes_are_refused(text: str) -> None:
    with pytest.raises(AnalysisUsageError, match="--pool-size"):
        parse_pool_size(text)


def test_options_check_the_range_and_the_ratio() -> None:
    def build(since: str | None, until: str | None, ratio: float) -> None:
        build_options(
            history="h",
            out="o",
            master="local[2]",
            since=since,
            until=until,
            pool_sizes=[],
            imbalance_ratio=ratio,
            conf=[],
            now=NOW,
        )

    with pytest.raises(AnalysisUsageError, match="is not before"):
        build("1h", "2h", 2.0)
    with pytest.raises(AnalysisUsageError, match="must be above 1"):
        build(None, None, 1.0)
    options = build_options(
        history="h",
        out="o",
        master="local[2]",
        since="2h",
        until=None,
        pool_sizes=["8", "/queue/a=64"],
        imbalance_ratio=3.0,
        conf=["spark.driver.memory=2g"],
        now=NOW,
    )
    assert (options.since_ms, options.until_ms) == (NOW_MS - 2 * HOUR_MS, None)
    assert (options.pool_size("/queue/a"), options.pool_size("/queue/b")) == (64, 8)
    assert options.spark_conf == {"spark.driver.memory": "2g"}


def test_history_files_are_chosen_by_their_hour(tmp_path: Path) -> None:
    names = ["20260324-09.jsonl", "20260324-10.jsonl", "20260324-11.jsonl", "copied.jsonl"]
    for name in names:
        (tmp_path / name).write_text("")
    (tmp_path / "notes.txt").write_text("not history")
    ten = hour_of(tmp_path / "20260324-10.jsonl")
    assert ten == NOW_MS - 2 * HOUR_MS
    chosen = history_files(tmp_path, since_ms=ten + 1, until_ms=ten + HOUR_MS - 1)
    # The hour that holds the range, and the file whose hour cannot be told from its name.
    assert [p.name for p in chosen] == ["20260324-10.jsonl", "copied.jsonl"]
    assert len(history_files(tmp_path, None, None)) == 4


def test_no_history_says_where_it_looked_and_how_to_turn_it_on(tmp_path: Path) -> None:
    with pytest.raises(HistoryNotFound) as missing:
        history_files(tmp_path / "metrics", None, None)
    assert str(tmp_path / "metrics") in str(missing.value)
    with pytest.raises(HistoryNotFound) as empty:
        history_files(tmp_path, None, None)
    for text in (str(tmp_path), "imq.metrics.enabled=true", "imq.metrics.history.retention"):
        assert text in str(empty.value)
    (tmp_path / "20260324-10.jsonl").write_text("")
    with pytest.raises(HistoryNotFound, match=r"holds 20260324-10\.jsonl to 20260324-10\.jsonl"):
        history_files(tmp_path, since_ms=NOW_MS, until_ms=None)


def test_remote_histories_are_left_to_spark() -> None:
    assert is_remote("hdfs://namenode/sluiceway/metrics")
    assert is_remote("s3a://bucket/metrics")
    assert not is_remote("file:///var/lib/sluiceway/metrics")
    assert not is_remote("./sluiceway-data/metrics")


def test_the_command_without_history_fails_in_one_line(tmp_path: Path) -> None:
    done = analyze("--data-dir", str(tmp_path), "--out", str(tmp_path / "out"))
    assert done.returncode == 1
    line = error_line(done)
    assert f"no metrics history: {tmp_path / 'metrics'} is not a directory" in line
    assert "imq.metrics.enabled=true" in line
    assert not (tmp_path / "out").exists()


def test_the_command_refuses_bad_options_with_status_2(tmp_path: Path) -> None:
    done = analyze("--data-dir", str(tmp_path), "--since", "last tuesday")
    assert done.returncode == 2
    assert "--since 'last tuesday' is neither" in error_line(done)


def test_without_java_the_command_says_so(tmp_path: Path) -> None:
    history = tmp_path / "metrics"
    history.mkdir()
    (history / "20260324-10.jsonl").write_text('{"ts":1774346400000,"kind":"broker"}\n')
    # Only the interpreter's own directory on the PATH, and no JAVA_HOME: no java to be found.
    environment = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    environment["PATH"] = str(Path(sys.executable).parent)
    done = analyze("--history", str(history), "--out", str(tmp_path / "out"), env=environment)
    assert done.returncode == 3
    assert "Spark needs Java 17 or later and none was found" in error_line(done)


def free_port() -> int:
    """A port nobody listens on: bound, then let go (no other process takes it in between on
    a test machine, and a refused connection is all the test needs)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_an_unreachable_master_is_one_line_naming_it_and_why(tmp_path: Path) -> None:
    history = tmp_path / "metrics"
    history.mkdir()
    (history / "20260324-10.jsonl").write_text('{"ts":1774346400000,"kind":"broker"}\n')
    master = f"spark://127.0.0.1:{free_port()}"
    started = time.monotonic()
    done = analyze("--history", str(history), "--master", master, "--out", str(tmp_path / "out"))
    took = time.monotonic() - started
    assert done.returncode == 3
    line = error_line(done)  # one line, no traceback, nothing from Spark
    assert f"cannot reach the Spark master {master}" in line
    assert "connection refused, nothing listens on that port" in line
    assert "sbin/start-master.sh" in line
    # Told before Spark starts: Spark itself would try for a minute and name no cause.
    assert took < 30, f"{took:.0f} s"
    assert not (tmp_path / "out").exists()
