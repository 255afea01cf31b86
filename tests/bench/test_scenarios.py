"""`sluiceway bench` end to end: every scenario against a real broker process, small counts.

Speed is never asserted: only counts, shares, what is reported missing, and exit statuses.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluiceway.cli.main import main
from sluiceway.testing import BrokerProcess

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def broker() -> Iterator[BrokerProcess]:
    # A queue that holds at most 50 messages and refuses the rest (REJECT_NEWEST, the default):
    # the way to lose messages for real when no receipt is asked.
    # And one that holds its producers once 50 wait (FLOW_CONTROL): a producer the broker stops.
    with BrokerProcess(
        "-D", "imq.destination.queue.small.maxNumMsgs=50",
        "-D", "imq.destination.queue.held.maxNumMsgs=50",
        "-D", "imq.destination.queue.held.limitBehavior=FLOW_CONTROL",
    ) as process:  # fmt: skip
        yield process


def bench(broker: BrokerProcess, tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "result.json"
    status = main(
        ["bench", *args, "--port", str(broker.port), "--timeout", "2", "--json", str(out)]
    )
    return status, json.loads(out.read_text())


def test_queue_shares_every_message_once_among_the_consumers(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    status, result = bench(
        broker, tmp_path, "queue", "--messages", "3000", "--producers", "2", "--consumers", "3",
        "--destination", "/queue/shared", "--broker-pid", str(broker.process.pid),
    )  # fmt: skip
    assert status == 0
    assert (result["sent"], result["received"]) == (3000, 3000)
    assert (result["missing"], result["duplicated"], result["unexpected"]) == (0, 0, 0)
    assert sum(c["received"] for c in result["consumers"]) == 3000
    assert len(result["consumers"]) == 3
    assert result["max_share"] >= 1 / 3 >= result["min_share"]
    assert result["broker_peak_rss_bytes"] > 10 * 2**20
    assert result["generator_cpu_seconds"] > 0
    assert 0 < result["latency_ms"]["p50"] <= result["latency_ms"]["p99"]
    assert result["latency_ms"]["p99"] <= result["latency_ms"]["max"]


def test_topic_gives_every_subscriber_every_message(broker: BrokerProcess, tmp_path: Path) -> None:
    status, result = bench(
        broker, tmp_path, "topic", "--messages", "1000", "--producers", "2", "--consumers", "3"
    )
    assert status == 0
    assert (result["sent"], result["received"]) == (1000, 3000)
    assert [c["received"] for c in result["consumers"]] == [1000, 1000, 1000]
    assert (result["missing"], result["duplicated"], result["out_of_order"]) == (0, 0, 0)


def test_fairness_gives_the_slow_consumer_fewer_messages(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    result = _fairness(broker, tmp_path, prefetch=1)
    assert result["received"] == 300
    slow, *fast = result["consumers"]
    assert [c["delay_ms"] for c in result["consumers"]] == [20, 1, 1]
    # At 20 ms a message the slow one takes far less than a third; the shares add up.
    assert all(slow["received"] < c["received"] for c in fast)
    assert sum(c["received"] for c in result["consumers"]) == 300
    assert result["min_share"] == slow["share"]
    assert all(c["idle_seconds"] >= 0 for c in result["consumers"])


def test_fairness_reports_the_time_fast_consumers_wait_with_nothing_to_do(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    # Prefetch 100 of 300 messages: each consumer is given 100. The fast two are done in a
    # fraction of a second, then hear nothing more while the slow one works 2 s on its share.
    result = _fairness(broker, tmp_path, prefetch=100)
    slow, *fast = result["consumers"]
    assert [c["received"] for c in result["consumers"]] == [100, 100, 100]
    assert all(c["idle_seconds"] > 1.0 for c in fast)
    assert slow["idle_seconds"] < min(c["idle_seconds"] for c in fast)


def _fairness(broker: BrokerProcess, tmp_path: Path, *, prefetch: int) -> dict[str, Any]:
    """300 messages to consumers taking 20, 1 and 1 ms each; the run must succeed."""
    status, result = bench(
        broker, tmp_path, "fairness", "--delays", "20,1,1", "--prefetch", str(prefetch),
        "--messages", "300", "--destination", f"/queue/fair-{prefetch}",
    )  # fmt: skip
    assert status == 0
    return result


def test_backlog_fills_then_drains_in_order(broker: BrokerProcess, tmp_path: Path) -> None:
    status, result = bench(
        broker, tmp_path, "backlog", "--messages", "2000", "--receipts", "--ack", "client",
        "--prefetch", "100", "--destination", "/queue/backlog",
    )  # fmt: skip
    assert status == 0
    assert (result["sent"], result["received"], result["refused"]) == (2000, 2000, 0)
    assert (result["missing"], result["out_of_order"]) == (0, 0)
    assert result["sent_per_second"] > 0
    assert result["received_per_second"] > 0


def test_latency_paces_the_producers_and_reports_percentiles(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    plot = tmp_path / "run.png"
    status, result = bench(
        broker, tmp_path, "latency", "--rate", "500", "--messages", "500",
        "--producers", "2", "--destination", "/queue/latency", "--plot", str(plot),
    )  # fmt: skip
    assert status == 0
    assert result["received"] == 500
    # 500 messages at 500/s take about a second: the pacing is what set the span.
    assert result["wall_seconds"] >= 0.9
    assert sum(result["series"]["received_per_second"]) == 500
    sent = result["series"]["sent_per_second"]
    assert sum(sent) == 500
    assert result["latency_ms"]["max"] >= result["latency_ms"]["p99"] > 0
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_messages_dropped_by_a_full_queue_are_reported_missing_and_fail_the_run(
    broker: BrokerProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, result = bench(
        broker, tmp_path, "backlog", "--messages", "300", "--destination", "/queue/small"
    )
    assert status == 1
    assert (result["sent"], result["received"], result["missing"]) == (300, 50, 250)
    assert "250 messages missing" in capsys.readouterr().err


def test_refusals_heard_by_the_producer_are_not_losses(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    status, result = bench(
        broker, tmp_path, "backlog", "--messages", "300", "--receipts",
        "--destination", "/queue/small",
    )  # fmt: skip
    assert status == 0
    assert (result["sent"], result["refused"], result["received"]) == (300, 250, 50)
    assert result["missing"] == 0


def test_a_producer_the_broker_stops_taking_from_is_reported(
    broker: BrokerProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # No consumer while filling: the broker holds the producer after 50 messages, for good.
    status, result = bench(
        broker, tmp_path, "backlog", "--messages", "5000", "--destination", "/queue/held"
    )
    assert status == 1
    assert result["timed_out"]
    assert 50 <= result["sent"] <= 5000  # written to the socket; the broker took 50
    (error,) = result["errors"]
    assert error.startswith("producer 0: stopped after ")
    assert "took no more messages" in capsys.readouterr().err


def test_usage_errors_exit_2(broker: BrokerProcess, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "latency", "--port", str(broker.port)]) == 2
    assert "latency needs --rate" in capsys.readouterr().err
    assert main(["bench", "fairness", "--port", str(broker.port)]) == 2
    assert main(["bench", "queue", "--delays", "1,x", "--port", str(broker.port)]) == 2


def test_no_broker_exits_3_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with BrokerProcess() as gone:
        port = gone.port
    assert main(["bench", "queue", "--port", str(port)]) == 3
    err = capsys.readouterr().err
    assert err.startswith(f"sluiceway bench: cannot connect to 127.0.0.1:{port}")
    assert err.count("\n") == 1


def test_many_small_producers_and_consumers_acknowledging_each_message(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    status, result = bench(
        broker, tmp_path, "queue", "--messages", "4000", "--producers", "4", "--consumers", "4",
        "--size", "128", "--ack", "client", "--ack-every", "1", "--prefetch", "100",
        "--destination", "/queue/small-acks",
    )  # fmt: skip
    assert status == 0
    assert (result["sent"], result["received"]) == (4000, 4000)
    assert (result["missing"], result["duplicated"]) == (0, 0)
    assert len(result["consumers"]) == 4


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--ack", "client-individual", "--ack-every", "5"], "is for --ack client"),
        (["--ack", "client", "--ack-every", "50", "--prefetch", "10"], "more than --prefetch 10"),
    ],
)
def test_an_ack_every_that_cannot_work_is_refused(
    capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    assert main(["bench", "queue", "--port", "1", *args]) == 2
    assert says in capsys.readouterr().err
