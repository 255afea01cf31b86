"""report.html and summary.json from hand-made results (no Spark): every section, the plots,
escaping, and the shape of the summary."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sluiceway.analysis import report
from sluiceway.analysis.errors import SparkUnavailable
from sluiceway.analysis.options import Options
from sluiceway.analysis.results import (
    Collected,
    ConsumerStats,
    DestinationStats,
    Distribution,
    Outcome,
    ProducerEpisode,
    SeriesPoint,
    Timeline,
)
from sluiceway.analysis.rules import recommend_all
from sluiceway.analysis.session import (
    MAX_SHUFFLE_PARTITIONS,
    master_addresses,
    shuffle_partitions,
    spark_error,
    spark_settings,
)
from sluiceway.analysis.summary import Analysis

T0 = 1_774_346_400_000
ODD = "/queue/a<b>&c"  # names are the user's: they must be escaped in the page


def stats(name: str, **numbers: float) -> DestinationStats:
    return DestinationStats(
        destination=name,
        type="queue",
        msgs_in=int(numbers.get("msgs_in", 100)),
        msgs_out=100,
        mean_in_rate=1.5,
        mean_out_rate=1.5,
        peak_in_rate=9.0,
        peak_out_rate=8.0,
        peak_msgs=50,
        peak_pending=20,
        median_held=numbers.get("median_held", 30.0),
        pending_share=0.1,
        max_consumers=2,
        consumer_flow_limit=1000,
        dispatch_policy="openmq",
        limit_behavior="REJECT_NEWEST",
        stranded_s=numbers.get("stranded_s", 0.0),
        stranded_peak=40,
        paused_s=12.5,
        held_s=3.0,
        held_episodes=1,
    )


def consumer(name: str, sub: str, delivered: int, share: float, window: int) -> ConsumerStats:
    return ConsumerStats(
        destination=name,
        connection=4,
        subscription=sub,
        run=T0 - 1000,
        ack="client",
        backup=False,
        window_limit=window,
        window_threshold=50,
        delivered=delivered,
        share=share,
        present_s=60.0,
        paused_s=12.5 if sub == "slow" else 0.0,
        pause_episodes=2 if sub == "slow" else 0,
        longest_pause_s=10.0 if sub == "slow" else 0.0,
        starved_s=0.0,
        max_outstanding=window,
    )


def analysis(timeline: Timeline) -> Analysis:
    destinations = [stats(ODD, stranded_s=20.0), stats("/queue/quiet", msgs_in=5)]
    consumers = [
        consumer(ODD, "slow", 80, 0.8, 500),
        consumer(ODD, "fast", 20, 0.2, 10),
    ]
    collected = Collected(
        timeline=timeline,
        destinations=destinations,
        destinations_left_off=3,
        series=[
            SeriesPoint(ODD, T0, None, None, 10.0, 5.0, 5.0),
            SeriesPoint(ODD, T0 + 1000, 4.0, 2.0, 12.0, 6.0, 6.0),
        ],
        consumers=consumers,
        consumers_left_off=0,
        distributions=[Distribution(ODD, 2, 100, 0.8, 0.2, "4/slow", "4/fast")],
        episodes=[
            ProducerEpisode(
                ODD,
                7,
                "destination full",
                "maxNumMsgs",
                "full <now>",
                T0,
                T0 + 3000,
                Outcome.ACCEPTED,
                3,
            ),
            ProducerEpisode(
                "/queue/quiet", None, "producer throttled", "", "", T0, T0, Outcome.ONGOING, 0
            ),
        ],
        episodes_left_off=0,
        shuffle_partitions=2,
    )
    options = Options(history="/data/metrics", out="report")
    return Analysis(
        options=options,
        files=2,
        generated_ms=T0 + 60_000,
        collected=collected,
        recommendations=recommend_all(collected, 2.0, options.pool_size),
    )


def test_the_page_has_every_section_and_plot_and_escapes_names(tmp_path: Path) -> None:
    done = analysis(Timeline(T0, T0 + 1000, 2, 1.0, 1))
    page_path, summary_path = report.write(done, tmp_path / "new")
    page = page_path.read_text()
    assert page.startswith("<!DOCTYPE html>")
    for section in (
        "Recommended flow settings",
        "Throughput and backlog",
        "Producers held or throttled",
        "Consumers paused by flow control",
        "Distribution across consumers",
        "How this was measured",
    ):
        assert f"<h2>{section}</h2>" in page
    # traffic of one destination, the episodes, the pauses, one queue's shares
    assert len(re.findall(r'<img alt="[^"]*" src="data:image/png;base64,', page)) == 4
    assert ODD not in page
    assert "/queue/a&lt;b&gt;&amp;c" in page
    assert "full &lt;now&gt;" in page
    assert "<td>held 3.0 s, then accepted</td>" in page
    assert "<td>lasted 0.0 s, still going at the end of the range</td>" in page
    assert "Spark master local[*], 2 shuffle partitions" in page
    assert "3 more destinations not shown" in page
    assert "uneven-distribution" in page
    assert not list(tmp_path.glob("new/*.partial"))
    assert summary_path.name == "summary.json"


def test_the_summary_carries_the_findings(tmp_path: Path) -> None:
    _, summary_path = report.write(analysis(Timeline(T0, T0 + 1000, 2, 1.0, 1)), tmp_path)
    summary = json.loads(summary_path.read_text())
    assert summary["range"] == {
        "since": None,
        "until": None,
        "first_sample": "2026-03-24T10:00:00.000Z",
        "last_sample": "2026-03-24T10:00:01.000Z",
        "samples": 2,
        "interval_s": 1.0,
        "broker_runs": 1,
    }
    assert summary["uneven_queues"] == [ODD]
    assert summary["consumers_paused_s"] == 12.5
    (spread,) = summary["distribution"]
    assert (spread["max_min_ratio"], spread["uneven"], spread["stranded_s"]) == (4.0, True, 20.0)
    (advice, quiet) = summary["recommendations"]
    assert advice["consumerFlowLimit"] == {
        "destination": 1000,
        "window_in_use": 500,
        "recommended": 15,  # 30 held over 2 consumers
        "changed": True,
        "text": "15",
        "fixed_alternative": None,  # auto is not recommended
    }
    assert [r["rule"] for r in advice["rules"]] == ["uneven-distribution"]
    assert quiet["rules"] == []
    assert quiet["note"].startswith("no consumers")
    first, second = summary["producer_episodes"]
    assert (first["duration_s"], first["ongoing"], first["limit"]) == (3.0, False, "maxNumMsgs")
    assert (first["outcome"], first["described"]) == ("accepted", "held 3.0 s, then accepted")
    assert (second["connection"], second["ongoing"], second["limit"]) == (None, True, None)
    assert second["outcome"] == "ongoing"
    assert summary["spark"] == {"master": "local[*]", "shuffle_partitions": 2}
    assert summary["destinations_left_off"] == 3


def test_a_single_sample_still_plots(tmp_path: Path) -> None:
    page, _ = report.write(analysis(Timeline(T0, T0, 1, 1.0, 1)), tmp_path)
    assert "data:image/png;base64," in page.read_text()


def test_spark_settings_for_a_local_run_and_user_overrides(tmp_path: Path) -> None:
    log = tmp_path / "log4j2.properties"
    local = spark_settings("local[3]", log, {"spark.driver.memory": "2g"})
    assert local["spark.driver.memory"] == "2g"  # --conf is passed on
    assert local["spark.driver.host"] == "127.0.0.1"
    logging = f"-Dlog4j2.configurationFile={log.as_uri()}"
    assert local["spark.driver.extraJavaOptions"] == f"{logging} -XX:TieredStopAtLevel=1"
    override = spark_settings("local[3]", log, {"spark.driver.extraJavaOptions": "-Xss4m"})
    assert override["spark.driver.extraJavaOptions"] == "-Xss4m"  # --conf wins
    cluster = spark_settings("spark://head:7077", log, {})
    assert cluster["spark.driver.extraJavaOptions"] == logging  # a long-lived cluster driver
    assert "spark.driver.host" not in cluster
    # Shuffle partitions are set once the session runs, from its parallelism (test_aggregation).
    assert "spark.sql.shuffle.partitions" not in local


def test_shuffle_partitions_follow_the_cores_up_to_a_bound() -> None:
    assert [shuffle_partitions(n) for n in (0, 1, 2, 3)] == [1, 1, 2, 3]
    assert shuffle_partitions(200) == MAX_SHUFFLE_PARTITIONS  # a large cluster


@pytest.mark.parametrize(
    ("master", "expected"),
    [
        ("spark://head:7077", [("head", 7077)]),
        ("spark://a:7077,b:7078", [("a", 7077), ("b", 7078)]),  # masters kept by ZooKeeper
        ("spark://[::1]:7077", [("::1", 7077)]),
    ],
)
def test_standalone_master_addresses(master: str, expected: list[tuple[str, int]]) -> None:
    assert master_addresses(master) == expected


@pytest.mark.parametrize("master", ["spark://head", "spark://head:port", "spark://:7077"])
def test_a_master_url_without_host_and_port_says_how_to_write_it(master: str) -> None:
    with pytest.raises(SparkUnavailable, match=r"write spark://HOST:PORT \(7077 unless"):
        master_addresses(master)


def test_a_python_error_is_told_by_its_first_line() -> None:
    assert spark_error(RuntimeError("\n  Java gateway exited\n  more\n")) == "Java gateway exited"
    assert spark_error(RuntimeError("")) == "RuntimeError"
