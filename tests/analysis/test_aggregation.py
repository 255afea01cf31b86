"""The Spark job on a hand-written history whose every total is known: counters with resets and a
broker restart, pause episodes from `flow_paused_for`, held and throttled producers and how
each hold ended, stranded time, shares among the consumers that were there together, and a time
range; and the session it runs in (its shuffle partitions, how an error of the JVM is told).

One local Spark session for the module (it takes 10-20 s to start on two cores).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Final

import pytest
from pyspark.sql import SparkSession

from sluiceway.analysis import job
from sluiceway.analysis.results import Collected, ConsumerStats, DestinationStats, Outcome
from sluiceway.analysis.session import find_java, spark_error, spark_session

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),  # the first test pays for Spark's start
    pytest.mark.skipif(
        find_java() is None,
        reason="Spark needs Java 17 or later: no java in JAVA_HOME or on the PATH",
    ),
]

T0: Final = 1_774_346_400_000  # 2026-03-24T10:00:00Z, the first sample
RUN_A: Final = T0 - 500  # the broker started half a second before it
RUN_B: Final = T0 + 20_000  # and again after a stop
Q: Final = "/queue/q"
R: Final = "/queue/r"

# Run A: ten samples a second apart. Consumer 1/a on Q is paused at samples 2-4 (one pause that
# began at T0+1.5 s), at sample 7 (a pause that began at T0+6.8 s) and at samples 8-9 (another,
# begun at T0+7.9 s: after sample 7, so a new one).
PAUSED_FOR: Final = {2: 0.5, 3: 1.5, 4: 2.5, 7: 0.2, 8: 0.1, 9: 1.1}
# Connection 9 held on Q: three episodes. The first ends while Q takes messages in (accepted),
# the second while it takes none (refused), the third when the broker stops.
HELD_FOR: Final = {2: 0.25, 3: 1.25, 7: 0.5, 9: 0.1}
R_MSGS_IN: Final = [5, 10, 3, 6, 6, 6, 6, 6, 6, 6]  # R was destroyed and created again at 2


def broker(ts: int, started: int) -> dict[str, Any]:
    return {"ts": ts, "kind": "broker", "started": started, "msgs": 0, "throttled": 0}


def destination(ts: int, name: str, **fields: Any) -> dict[str, Any]:
    row = {
        "ts": ts,
        "kind": "destination",
        "destination": name,
        "type": "queue",
        "state": "RUNNING",
        "msgs": 0,
        "pending": 0,
        "unacked": 0,
        "consumers": 3,
        "held_sends": 0,
        "throttled": False,
        "consumer_flow_limit": 1000,
        "limit_behavior": "REJECT_NEWEST",
        "dispatch_policy": "openmq",
    }
    return row | fields


def consumer(ts: int, connection: int, sub: str, **fields: Any) -> dict[str, Any]:
    row = {
        "ts": ts,
        "kind": "consumer",
        "destination": Q,
        "connection": connection,
        "subscription": sub,
        "ack": "client-individual",
        "backup": False,
        "window_limit": 100,
        "window_threshold": 50,
        "outstanding": 1,
        "unacked": 0,
        "delivered": 0,
        "flow_paused_for": None,
    }
    return row | fields


def run_a() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for i in range(10):
        ts = T0 + 1000 * i
        stranded = 5 <= i <= 8  # 1/a holds 5 unconsumed, 2/b none, nothing waits
        rows.append(broker(ts, RUN_A))
        count = min(10 * i, 40)
        rows.append(destination(ts, Q, msgs_in=count, msgs_out=count, pending=5 if i == 1 else 0))
        rows.append(destination(ts, R, msgs_in=R_MSGS_IN[i], throttled=i in (5, 6)))
        rows.append(
            consumer(
                ts,
                1,
                "a",
                delivered=6 * (i + 1),
                outstanding=100 if 2 <= i <= 4 else 5 if stranded else 1,
                flow_paused_for=PAUSED_FOR.get(i),
            )
        )
        idle = stranded or i == 1  # at sample 1 it is empty while 5 messages wait: starved
        rows.append(consumer(ts, 2, "b", delivered=2 * (i + 1), outstanding=0 if idle else 1))
        rows.append(consumer(ts, 3, "c", backup=True, outstanding=0))
        if i in HELD_FOR:
            rows.append(
                {
                    "ts": ts,
                    "kind": "held_producer",
                    "connection": 9,
                    "destination": Q,
                    "reason": "destination full",
                    "limit": "maxNumMsgs",
                    "detail": "full",
                    "held_for": HELD_FOR[i],
                    "held_sends": i,
                    "held_bytes": 10,
                }
            )
    return rows


def run_b() -> list[dict[str, Any]]:
    """After a restart: counters and connection numbers start again; 1/a is a new consumer."""
    rows: list[dict[str, Any]] = []
    for j in range(3):
        ts = T0 + 20_500 + 1000 * j
        rows.append(broker(ts, RUN_B))
        rows.append(destination(ts, Q, msgs_in=3 * (j + 1), msgs_out=3 * (j + 1)))
        paused = 0.4 if j == 2 else None  # still paused at the last sample
        rows.append(consumer(ts, 1, "a", delivered=7, flow_paused_for=paused))
    return rows


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    with spark_session("local[2]", {}) as session:
        yield session


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    directory = tmp_path_factory.mktemp("metrics")
    lines = [json.dumps(row) for row in run_a() + run_b()]
    lines.insert(3, '{"ts": 17743464')  # a line torn by a crash: ignored
    (directory / "20260324-10.jsonl").write_text("\n".join(lines) + "\n")
    return [str(directory / "20260324-10.jsonl")]


@pytest.fixture(scope="module")
def everything(spark: SparkSession, history: list[str]) -> Collected:
    return job.run(spark, history, None, None, "test history")


@pytest.fixture(scope="module")
def from_sample_3(spark: SparkSession, history: list[str]) -> Collected:
    return job.run(spark, history, T0 + 3000, T0 + 9000, "test history")


def stats_of(collected: Collected, name: str) -> DestinationStats:
    (stats,) = [d for d in collected.destinations if d.destination == name]
    return stats


def consumer_of(collected: Collected, label: str, run: int = RUN_A) -> ConsumerStats:
    (found,) = [c for c in collected.consumers if c.label == label and c.run == run]
    return found


def test_the_timeline_spans_both_runs(everything: Collected) -> None:
    timeline = everything.timeline
    assert (timeline.first_ms, timeline.last_ms) == (T0, T0 + 22_500)
    assert (timeline.samples, timeline.runs, timeline.interval_s) == (13, 2, 1.0)


def test_counters_add_up_across_resets_and_restarts(everything: Collected) -> None:
    q = stats_of(everything, Q)
    assert (q.msgs_in, q.msgs_out) == (40 + 9, 40 + 9)  # each run started inside the range
    assert q.peak_in_rate == 10.0
    assert q.mean_in_rate == pytest.approx(46 / 11)  # first samples have no rate
    assert stats_of(everything, R).msgs_in == 5 + 5 + 3 + 3
    assert q.pending_share == pytest.approx(1 / 13)
    assert (q.consumer_flow_limit, q.dispatch_policy) == (1000, "openmq")


def test_pauses_are_told_apart_and_their_ends_placed_between_samples(
    everything: Collected,
) -> None:
    paused = consumer_of(everything, "1/a")
    # 1.5 s -> 4.5 s (half-way to sample 5); 6.8 s -> 7.5 s (half-way to sample 8, before the
    # next pause began at 7.9 s); 7.9 s -> 9.5 s (the broker stopped: half an interval).
    assert paused.pause_episodes == 3
    assert paused.paused_s == pytest.approx(3.0 + 0.7 + 1.6)
    assert paused.longest_pause_s == pytest.approx(3.0)
    after_restart = consumer_of(everything, "1/a", run=RUN_B)
    assert after_restart.pause_episodes == 1
    assert after_restart.paused_s == pytest.approx(0.4)
    assert stats_of(everything, Q).paused_s == pytest.approx(5.3 + 0.4)


def test_shares_compare_the_consumers_that_were_there_together(everything: Collected) -> None:
    (spread,) = everything.distributions
    assert (spread.destination, spread.consumers, spread.delivered) == (Q, 2, 80)
    assert (spread.max_consumer, spread.min_consumer) == ("1/a", "2/b")
    assert (spread.max_share, spread.min_share, spread.ratio) == (0.75, 0.25, 3.0)
    backup = consumer_of(everything, "3/c")
    assert (backup.backup, backup.share) == (True, None)
    assert consumer_of(everything, "1/a", run=RUN_B).share is None  # three samples of thirteen


def test_stranded_and_starved_time(everything: Collected) -> None:
    q = stats_of(everything, Q)
    assert (q.stranded_s, q.stranded_peak) == (4.0, 5)
    assert consumer_of(everything, "2/b").starved_s == 1.0
    assert consumer_of(everything, "1/a").starved_s == 0.0


def test_producer_episodes(everything: Collected) -> None:
    held = [(e.connection, e.start_ms - T0, e.end_ms - T0) for e in everything.episodes]
    assert held == [(9, 1750, 3500), (None, 4500, 6500), (9, 6500, 7500), (9, 8900, 9500)]
    throttled = everything.episodes[1]
    assert (throttled.destination, throttled.reason) == (R, "producer throttled")
    assert (throttled.limit, throttled.ongoing) == ("imq.throttling.destination.threshold", False)
    first = everything.episodes[0]
    assert (first.reason, first.limit, first.max_held_sends) == (
        "destination full",
        "maxNumMsgs",
        3,
    )
    q = stats_of(everything, Q)
    assert q.held_s == pytest.approx(1.75 + 1.0 + 0.6)
    assert q.held_episodes == 3


def test_how_each_producer_episode_ended(everything: Collected) -> None:
    # Q took 10 messages in by the sample after the first hold, none after the second; the
    # third was the last sample before the broker stopped; R's throttling was lifted.
    assert [e.outcome for e in everything.episodes] == [
        Outcome.ACCEPTED,
        Outcome.LIFTED,
        Outcome.REFUSED,
        Outcome.STOPPED,
    ]
    assert [e.describe() for e in everything.episodes] == [
        "held 1.8 s, then accepted",
        "lasted 2.0 s, then lifted",
        "held 1.0 s, then refused",
        "held 0.6 s, until the broker stopped",
    ]
    assert (stats_of(everything, R).held_s, stats_of(everything, R).held_episodes) == (0.0, 1)


def test_the_series_has_one_point_per_sample_and_destination(everything: Collected) -> None:
    points = [p for p in everything.series if p.destination == Q]
    assert len(points) == 13
    assert [p.in_rate for p in points[:6]] == [None, 10.0, 10.0, 10.0, 10.0, 0.0]


def test_a_range_counts_only_what_happened_inside_it(from_sample_3: Collected) -> None:
    timeline = from_sample_3.timeline
    assert (timeline.first_ms, timeline.last_ms, timeline.samples) == (T0 + 3000, T0 + 9000, 7)
    assert stats_of(from_sample_3, Q).msgs_in == 10  # the run began before the range
    paused = consumer_of(from_sample_3, "1/a")
    # The first pause counts from the range's start; the last is still going at its end.
    assert paused.paused_s == pytest.approx(1.5 + 0.7 + 1.1)
    assert (
        consumer_of(from_sample_3, "1/a").delivered,
        consumer_of(from_sample_3, "2/b").delivered,
    ) == (36, 12)
    (first, *_, last) = from_sample_3.episodes
    assert (first.start_ms - T0, first.end_ms - T0) == (3000, 3500)
    assert first.outcome is Outcome.ACCEPTED  # Q's counter grew after sample 3
    assert (last.start_ms - T0, last.outcome) == (8900, Outcome.ONGOING)  # at the range's end


def test_the_job_runs_with_one_shuffle_partition_per_core(
    spark: SparkSession, everything: Collected
) -> None:
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"  # local[2], not Spark's 200
    assert everything.shuffle_partitions == 2


def test_an_error_of_the_jvm_is_told_by_its_cause(spark: SparkSession) -> None:
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    # A real error of the JVM that PySpark passes on as Py4J raised it (PySpark converts only
    # some kinds), whose cause is what went wrong.
    future = jvm.java.util.concurrent.CompletableFuture()
    future.completeExceptionally(jvm.java.net.ConnectException("Connection refused"))
    with pytest.raises(Exception, match="An error occurred while calling") as raised:
        future.get()
    assert spark_error(raised.value) == "java.net.ConnectException: Connection refused"
    assert spark_error(ValueError("not from Java\nsecond line")) == "not from Java"
