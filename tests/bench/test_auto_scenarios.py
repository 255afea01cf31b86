"""`sluiceway bench` with adaptive windows and eager consumers, against a real broker process.

Speed is never asserted: only counts, what the broker said on the SUBSCRIBE's RECEIPT, and the
bounds a window sets on what a consumer can hold.
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
    with BrokerProcess() as process:
        yield process


def bench(broker: BrokerProcess, tmp_path: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / "result.json"
    status = main(
        ["bench", *args, "--port", str(broker.port), "--timeout", "5", "--json", str(out)]
    )
    result: dict[str, Any] = json.loads(out.read_text())
    assert status == 0, result["errors"]
    return result


def test_fairness_with_adaptive_windows_delivers_everything_once(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    result = bench(
        broker, tmp_path, "fairness", "--delays", "20,1,1", "--prefetch", "auto",
        "--messages", "300", "--destination", "/queue/fair-auto",
    )  # fmt: skip
    assert (result["received"], result["missing"], result["duplicated"]) == (300, 0, 0)
    # The broker said, on each SUBSCRIBE's receipt, that it sizes the window.
    assert all(c["window_auto"] for c in result["consumers"])
    # An adaptive window never grows past its cap: nobody held more.
    assert 1 <= result["max_held"] <= 1000
    assert all(c["idle_while_others_held"] is not None for c in result["consumers"])


def test_a_slow_consumer_reads_its_window_at_once_and_never_holds_more(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    # Prefetch 100 of 300 messages: each consumer is given 100 at once. The slow one reads them
    # all into its local queue (it works 2 s on them); the fast two, done in a fraction of a
    # second, idle meanwhile while it holds messages it has not started.
    result = bench(
        broker, tmp_path, "fairness", "--delays", "20,1,1", "--prefetch", "100",
        "--messages", "300", "--destination", "/queue/fair-eager",
    )  # fmt: skip
    slow, *fast = result["consumers"]
    assert [c["received"] for c in result["consumers"]] == [100, 100, 100]
    assert not any(c["window_auto"] for c in result["consumers"])
    assert slow["held_peak"] >= 50  # read ahead, not left in the socket
    assert all(c["held_peak"] <= 100 for c in result["consumers"])  # the window bounds it
    assert all(c["idle_while_others_held"] > 1.0 for c in fast)
    assert slow["idle_while_others_held"] < min(c["idle_while_others_held"] for c in fast)
    # Idle while another held messages is part of all the idle time.
    assert all(c["idle_while_others_held"] <= c["idle_seconds"] + 0.2 for c in fast)


def test_cumulative_acks_with_an_adaptive_window_go_every_message(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    # Half a window at a time would wait for ever on a window of a few messages: with auto,
    # ack:client acknowledges every message unless --ack-every says otherwise.
    result = bench(
        broker, tmp_path, "queue", "--messages", "2000", "--ack", "client", "--prefetch",
        "auto", "--destination", "/queue/auto-client",
    )  # fmt: skip
    assert (result["received"], result["missing"]) == (2000, 0)
    (consumer,) = result["consumers"]
    assert consumer["window_auto"]
    assert consumer["held_peak"] >= 1
    assert consumer["idle_while_others_held"] is None  # no --delays: no spells kept
