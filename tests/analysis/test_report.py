"""`sluiceway analyze` end to end: a scripted broker run, then the command in a process of its own
(real local Spark), then what its report says about that run.

The command runs once for the module (Spark takes 10-20 s to start on two cores); each test
reads one part of the same report.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest

from sluiceway.analysis.session import find_java
from tests.analysis import scenario

pytestmark = [
    pytest.mark.slow,
    # The first test to run pays for the scripted run (about 30 s) and the command (Spark).
    pytest.mark.timeout(420),
    pytest.mark.skipif(
        find_java() is None,
        reason="Spark needs Java 17 or later: no java in JAVA_HOME or on the PATH",
    ),
]
ANALYZE_TIMEOUT: Final = 240.0  # seconds: Spark's start and a few dozen small jobs on two cores
# A pause's end is placed half-way between two samples a second apart; the client's clock adds
# a little on each side.
PAUSE_TOLERANCE_S: Final = 1.0
PARTITIONS: Final = "spark.sql.shuffle.partitions"
USER_PARTITIONS: Final = 3


@dataclass(frozen=True)
class Run:
    measured: scenario.Measured
    status: int
    out: str
    err: str
    report: Path
    summary: dict[str, Any]


def analyze(*args: str, timeout: float = ANALYZE_TIMEOUT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluiceway", "analyze", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    data_dir = tmp_path_factory.mktemp("broker")
    out = tmp_path_factory.mktemp("report")
    measured = scenario.run(data_dir)
    # A shuffle partition count of the user's own, which the command must keep.
    done = analyze(
        "--data-dir", str(data_dir), "--out", str(out), "--conf", f"{PARTITIONS}={USER_PARTITIONS}"
    )
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    return Run(measured, done.returncode, done.stdout, done.stderr, out / "report.html", summary)


def by_destination(rows: list[dict[str, Any]], destination: str) -> dict[str, Any]:
    (row,) = [r for r in rows if r["destination"] == destination]
    return row


def test_the_command_writes_the_report_and_names_the_change(run: Run) -> None:
    assert run.status == 0, run.err
    lines = run.out.splitlines()
    assert lines[0] == f"report: {run.report}"
    assert lines[1] == f"summary: {run.report.parent / 'summary.json'}"
    (headline,) = [line for line in lines if line.startswith(scenario.HOARD)]
    assert "consumerFlowLimit 1000 -> " in headline
    assert "uneven-distribution" in headline
    page = run.report.read_text()
    assert page.count('src="data:image/png;base64,') >= 5  # throughput x3, pauses, shares, holds
    for section in (
        "Recommended flow settings",
        "Throughput and backlog",
        "held or throttled",
        "paused by flow control",
        "Distribution across consumers",
    ):
        assert section in page


def test_it_reports_the_uneven_queue(run: Run) -> None:
    assert run.summary["uneven_queues"] == [scenario.HOARD]
    spread = by_destination(run.summary["distribution"], scenario.HOARD)
    assert spread["consumers"] == 3
    assert spread["delivered"] == scenario.HOARD_MESSAGES
    assert spread["max_consumer"].endswith("/slow")
    # summary.json rounds shares to 4 decimals and ratios to 3.
    share = scenario.SLOW_WINDOW / scenario.HOARD_MESSAGES
    assert spread["max_share"] == pytest.approx(share, abs=1e-4)
    fewest = min(run.measured.fast_received)
    assert spread["min_share"] == pytest.approx(fewest / scenario.HOARD_MESSAGES, abs=1e-4)
    assert spread["max_min_ratio"] == pytest.approx(scenario.SLOW_WINDOW / fewest, rel=1e-3)
    assert spread["uneven"] is True
    assert spread["stranded_s"] >= 2.0  # the fast ones sat empty while the slow one worked
    # The other queues have a single consumer each: nothing to compare.
    assert [d["destination"] for d in run.summary["distribution"]] == [scenario.HOARD]


def test_it_recommends_a_lower_limit_for_the_uneven_queue(run: Run) -> None:
    advice = by_destination(run.summary["recommendations"], scenario.HOARD)
    limit = advice["consumerFlowLimit"]
    assert limit["destination"] == 1000
    assert limit["window_in_use"] == scenario.SLOW_WINDOW
    assert limit["changed"] is True
    assert 1 <= limit["recommended"] < scenario.SLOW_WINDOW
    (rule,) = advice["rules"]
    assert (rule["rule"], rule["setting"], rule["value"]) == (
        "uneven-distribution",
        "consumerFlowLimit",
        limit["recommended"],
    )
    reason = rule["reason"]
    ratio = by_destination(run.summary["distribution"], scenario.HOARD)["max_min_ratio"]
    assert scenario.HOARD in reason
    said = re.search(r"max/min (\d+\.\d)", reason)
    assert said is not None, reason
    assert float(said.group(1)) == pytest.approx(ratio, abs=0.051)  # the reason rounds to .1
    assert f"largest window was {scenario.SLOW_WINDOW} messages" in reason
    assert f"consumerFlowLimit={limit['recommended']}" in reason
    assert "dispatchPolicy=fair" in reason
    # A single consumer, paused for a while, needs no other limit.
    kept = by_destination(run.summary["recommendations"], scenario.PAUSED)
    assert kept["rules"] == []
    assert kept["consumerFlowLimit"]["changed"] is False
    assert "no rule fired" in kept["note"]


def test_it_measures_the_time_paused_by_flow_control(run: Run) -> None:
    (consumer,) = [c for c in run.summary["consumers"] if c["destination"] == scenario.PAUSED]
    assert consumer["subscription"] == "p"
    assert consumer["window_limit"] == scenario.PAUSE_WINDOW
    assert consumer["pause_episodes"] == 2
    assert consumer["paused_s"] == pytest.approx(run.measured.paused_s, abs=PAUSE_TOLERANCE_S)
    totals = by_destination(run.summary["destinations"], scenario.PAUSED)
    assert totals["consumers_paused_s"] == pytest.approx(consumer["paused_s"])
    slow = [c for c in run.summary["consumers"] if c["subscription"] == "slow"]
    assert slow[0]["paused_s"] > 0  # its window of 200 was full until it had consumed 100


def test_it_reports_the_held_producer(run: Run) -> None:
    episodes = run.summary["producer_episodes"]
    assert [e["destination"] for e in episodes] == [scenario.FULL, scenario.REFUSE]
    episode = by_destination(episodes, scenario.FULL)
    assert episode["reason"] == "destination full"
    assert episode["limit"] == "maxNumMsgs"
    assert episode["ongoing"] is False
    assert episode["max_held_sends"] == scenario.FULL_SENT - scenario.FULL_LIMIT
    assert episode["duration_s"] == pytest.approx(run.measured.held_s, abs=PAUSE_TOLERANCE_S)


def test_a_hold_that_ended_in_acceptance_is_told_from_a_refusal(run: Run) -> None:
    accepted = by_destination(run.summary["producer_episodes"], scenario.FULL)
    assert accepted["outcome"] == "accepted"
    said = f"held {accepted['duration_s']:,.1f} s, then accepted"
    assert accepted["described"] == said
    refused = by_destination(run.summary["producer_episodes"], scenario.REFUSE)
    assert (refused["outcome"], refused["reason"], refused["max_held_sends"]) == (
        "refused",
        "destination full",
        1,
    )
    assert refused["duration_s"] == pytest.approx(run.measured.refused_s, abs=PAUSE_TOLERANCE_S)
    assert refused["described"] == f"held {refused['duration_s']:,.1f} s, then refused"
    page = run.report.read_text()
    assert f"<td>{said}</td>" in page
    assert f"<td>{refused['described']}</td>" in page


def test_it_lists_the_pipeline_readers_and_their_lag(run: Run) -> None:
    readers = run.summary["readers"]
    assert [(r["destination"], r["kind"], r["group"]) for r in readers] == [
        (scenario.ETL, "lease-group", "etl"),
        (scenario.CLICKS, "cursor-group", "spark"),
    ]
    behind = scenario.READER_SENT - scenario.READER_TAKEN
    for reader in readers:
        assert reader["lag_messages"] == behind
        assert reader["peak_lag_messages"] >= behind
        # The oldest message it has not taken was sent during the run, before the last sample.
        assert 0 < reader["lag_seconds"] <= reader["peak_lag_seconds"] < 60
        assert reader["present_s"] > 0
    assert (readers[0]["open_leases"], readers[1]["open_leases"]) == (0, None)
    assert run.summary["readers_left_off"] == 0
    for path in (scenario.ETL, scenario.CLICKS):
        stats = by_destination(run.summary["destinations"], path)
        assert (stats["max_consumers"], stats["max_pipeline_readers"]) == (0, 1)
        # Drained by its reader: not a destination without consumers.
        note = by_destination(run.summary["recommendations"], path)["note"]
        assert not note.startswith("no consumers"), note
        assert "drained by 1 pipeline reader(s)" in note
    page = run.report.read_text()
    assert "<h2>Pipeline readers</h2>" in page
    assert f"<td>{scenario.ETL}</td><td>lease-group</td><td>etl</td>" in page


def test_the_job_keeps_the_users_shuffle_partitions(run: Run) -> None:
    assert run.summary["spark"] == {"master": "local[*]", "shuffle_partitions": USER_PARTITIONS}


def test_it_counts_the_traffic(run: Run) -> None:
    hoard = by_destination(run.summary["destinations"], scenario.HOARD)
    assert (hoard["msgs_in"], hoard["msgs_out"]) == (scenario.HOARD_MESSAGES,) * 2
    assert hoard["peak_msgs"] >= scenario.SLOW_WINDOW // 2  # sampled while the slow one worked
    full = by_destination(run.summary["destinations"], scenario.FULL)
    assert full["msgs_in"] == scenario.FULL_SENT
    assert full["limit_behavior"] == "FLOW_CONTROL"
    assert full["producer_episodes"] == 1
    assert by_destination(run.summary["destinations"], scenario.REFUSE)["msgs_in"] == 1


def test_a_range_without_history_is_refused_before_spark_starts(run: Run) -> None:
    data_dir = str(run.measured.data_dir)
    done = analyze("--data-dir", data_dir, "--until", "2001-01-01", timeout=30)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.startswith("sluiceway analyze: no metrics history in the time range")
    assert done.stderr.count("\n") == 1


def test_it_reports_the_windows_the_broker_sized(run: Run) -> None:
    advice = by_destination(run.summary["recommendations"], scenario.ADAPTIVE)
    limit = advice["consumerFlowLimit"]
    assert (limit["destination"], limit["text"], limit["changed"]) == (-2, "auto", False)
    assert advice["rules"] == []  # already auto: no number recommended
    (window,) = advice["adaptive_windows"]
    assert window["consumer"].endswith("/tuned")
    assert window["window_cap"] == 1000  # neither side gave a number
    assert 1 <= window["window_low"] <= window["window_now"] <= window["window_high"] <= 1000
    # It took ADAPTIVE_WORK_S (10 ms) a message; the broker's moving average is near that.
    assert window["pace_ms"] >= scenario.ADAPTIVE_WORK_S * 1000 / 2
    assert window["round_trip_ms"] is None or window["round_trip_ms"] > 0
    assert advice["chosen_windows"].startswith("the broker sized the windows of 1 consumer(s)")
    (line,) = [line for line in run.out.splitlines() if line.startswith(scenario.ADAPTIVE)]
    low, high = window["window_low"], window["window_high"]
    span = str(low) if low == high else f"{low} to {high}"
    assert line == f"{scenario.ADAPTIVE}: auto windows of {span} messages for 1 consumer(s)"
    assert "<h2>Windows the broker sized</h2>" in run.report.read_text()


def test_it_counts_deadline_misses_and_suggests_deadline_order(run: Run) -> None:
    quotes = by_destination(run.summary["destinations"], scenario.QUOTES)
    assert quotes["delivery_order"] == "fifo"
    assert quotes["msgs_in"] == scenario.QUOTES_EXPIRED + 1  # expired ones were accepted first
    assert quotes["deadline_misses"] == {
        "expired": scenario.QUOTES_EXPIRED,
        "consumed_late": 1,
        "total": scenario.QUOTES_EXPIRED + 1,
        "share_of_received": 1.0,
    }
    advice = by_destination(run.summary["recommendations"], scenario.QUOTES)
    assert advice["deliveryOrder"] == {"in_use": "fifo", "recommended": "deadline", "changed": True}
    (rule,) = advice["rules"]
    assert (rule["rule"], rule["setting"], rule["value"]) == (
        "deadline-misses",
        "deliveryOrder",
        "deadline",
    )
    assert (
        f"{scenario.QUOTES_EXPIRED} expired before delivery and 1 acknowledged" in (rule["reason"])
    )
    # Queues that never saw a message with a deadline missed none.
    hoard = by_destination(run.summary["destinations"], scenario.HOARD)
    assert hoard["deadline_misses"]["total"] == 0
    (line,) = [line for line in run.out.splitlines() if line.startswith(scenario.QUOTES)]
    assert line.startswith(f"{scenario.QUOTES}: deliveryOrder fifo -> deadline (deadline-misses)")
