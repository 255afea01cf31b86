"""benchmarks/deadlines.py end to end at a tiny scale: both delivery orders, real brokers.

Speed and shares are never asserted: only that the figures have their shape and that every
message sent is accounted for, by the consumer's records and by the broker's own counts.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.processes import run_group

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "deadlines.py"
RATE = 150  # messages/s: over what a consumer spending 10 ms on each takes
SECONDS = 1.5
MIX = "50:45,500:45,none:10"  # the longest time to live ends soon after the last send
CLASSES = {"50ms", "500ms", "none"}


@pytest.fixture(scope="module")
def script() -> Iterator[ModuleType]:
    """The script as a module, for what needs no process: its command line."""
    spec = importlib.util.spec_from_file_location("deadlines_bench", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["deadlines_bench"] = module  # dataclasses look their module up while being made
    spec.loader.exec_module(module)
    yield module
    del sys.modules["deadlines_bench"]


def check_counts(counts: dict[str, Any]) -> None:
    assert counts["on_time"] + counts["late"] + counts["never"] == counts["sent"], counts
    if counts["sent"]:
        assert counts["share"] == round(counts["on_time"] / counts["sent"], 4), counts
    else:
        assert counts["share"] is None


def check_run(run: dict[str, Any]) -> None:
    classes = run["classes"]
    assert set(classes) == CLASSES
    for counts in classes.values():
        check_counts(counts)
        check_counts(counts["steady"])
        assert counts["steady"]["sent"] <= counts["sent"]
        # [on time, late, never] per second of sending: the same messages, spread over time.
        by_second = counts["by_second"]
        assert len(by_second) == 2  # 1.5 s, in whole seconds
        totals = [sum(second[i] for second in by_second) for i in range(3)]
        assert totals == [counts["on_time"], counts["late"], counts["never"]]
    assert sum(c["sent"] for c in classes.values()) == RATE * SECONDS
    # Messages without a deadline are never late and never expire.
    assert (classes["none"]["late"], classes["none"]["never"]) == (0, 0)
    with_deadline = run["with_deadline"]
    check_counts(with_deadline)
    for key in ("sent", "on_time", "late", "never"):
        assert with_deadline[key] == classes["50ms"][key] + classes["500ms"][key]
    check_counts(run["steady_with_deadline"])
    # The broker's own counts agree: it took every message, and let expire exactly those the
    # consumer never got.
    broker = run["broker"]
    assert broker["delivery_order"] == run["order"]
    assert broker["build"].startswith(("compiled", "Python source")), broker["build"]
    assert broker["msgs_in"] == RATE * SECONDS
    assert broker["expired"] == sum(c["never"] for c in classes.values())
    assert broker["consumed"] == RATE * SECONDS - broker["expired"]
    assert broker["deadline_misses"] == broker["expired"] + broker["late"]
    assert (run["duplicated"], run["unexpected"], run["accounted"]) == (0, 0, True)
    assert run["consumer_rate"] > 0
    assert run["offered_rate"] > 0
    assert set(run["cpu_share"]) == {"broker", "producer", "consumer"}


def test_both_orders_account_for_every_message(tmp_path: Path) -> None:
    out = tmp_path / "deadlines.json"
    # A process group of its own, killed however the run ends: the script's brokers, producers
    # and consumers are all in it.
    done = run_group(
        [
            sys.executable, str(SCRIPT), "--seconds", str(SECONDS), "--rate", str(RATE),
            "--service-ms", "10", "--mix", MIX, "--flow-limit", "2", "--warmup", "0",
            "--drain-timeout", "20", "--json", str(out),
        ],
        timeout=50,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    document = json.loads(out.read_text())
    assert set(document) == {"settings", "machine", "summary", "verdict", "runs"}
    assert document["settings"]["mix"] == [
        {"class": "50ms", "ttl_ms": 50, "weight": 45.0},
        {"class": "500ms", "ttl_ms": 500, "weight": 45.0},
        {"class": "none", "ttl_ms": None, "weight": 10.0},
    ]
    runs = document["runs"]
    assert [r["order"] for r in runs] == ["fifo", "deadline"]
    for run in runs:
        check_run(run)
    # The same seeded mix for both orders.
    assert [{k: c["sent"] for k, c in r["classes"].items()} for r in runs] == [
        {k: c["sent"] for k, c in runs[0]["classes"].items()}
    ] * 2
    # One run of each: the medians are that run's figures, and the verdict compares them.
    for run in runs:
        summary = document["summary"][run["order"]]
        share = run["with_deadline"]["share"]
        assert summary["with_deadline"] == {"median": share, "min": share, "max": share}
        assert set(summary["classes"]) == CLASSES
    verdict = document["verdict"]["with_deadline"]
    fifo, deadline = (r["with_deadline"]["share"] for r in runs)
    assert verdict == {"fifo": fifo, "deadline": deadline, "deadline_better": deadline > fifo}
    assert "fifo: on time" in done.stdout
    assert "deadline: on time" in done.stdout


def test_a_broker_that_cannot_start_ends_the_run_with_one_line(tmp_path: Path) -> None:
    out = tmp_path / "deadlines.json"
    done = run_group(
        [
            sys.executable, str(SCRIPT), "--seconds", "1", "--rate", "10", "--json", str(out),
            "--broker-property", "imq.message.expiration.interval=0",
        ],
        timeout=40,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("deadlines: the broker did not start: "), done.stderr
    assert "imq.message.expiration.interval" in done.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    ("mix", "says"),
    [
        ("200", "is not TTL:WEIGHT"),
        ("200:x", "WEIGHT a number"),
        ("0:5", "must be above 0"),
        ("200:1,200:2", "appears twice"),
        ("none:1", "needs a time to live"),
    ],
)
def test_a_bad_mix_is_refused_with_what_is_wrong(
    script: ModuleType, mix: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        script.main(["--mix", mix])
    assert exited.value.code == 2
    assert says in capsys.readouterr().err


def test_the_default_rate_is_the_overload_over_what_the_service_time_allows(
    script: ModuleType,
) -> None:
    assert script.arguments(["--service-ms", "2", "--overload", "1.5"]).rate == 750
    assert script.arguments(["--rate", "90"]).rate == 90
