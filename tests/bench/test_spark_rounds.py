"""benchmarks/spark_source.py's rounds (also spark_sink.py's): each round measures every run,
the order turned by one, and the figures are medians over the rounds, each share of the
in-memory floor taken within its own round."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = str(Path(__file__).parents[2] / "benchmarks")


@pytest.fixture(scope="module")
def spark_source() -> Iterator[ModuleType]:
    pytest.importorskip("pyspark", reason="the Spark benchmarks need pyspark (the spark extra)")
    sys.path.insert(0, BENCHMARKS)
    try:
        yield importlib.import_module("spark_source")
    finally:
        sys.path.remove(BENCHMARKS)
        for name in ("spark_source", "spark_cluster"):
            sys.modules.pop(name, None)


def test_each_round_turns_the_order_by_one(spark_source: ModuleType) -> None:
    order = list(spark_source.rounds_of(["topic", "queue", "synthetic"], 4))
    assert order == [
        (0, "topic"), (0, "queue"), (0, "synthetic"),
        (1, "queue"), (1, "synthetic"), (1, "topic"),
        (2, "synthetic"), (2, "topic"), (2, "queue"),
        (3, "topic"), (3, "queue"), (3, "synthetic"),
    ]  # fmt: skip


def test_figures_are_medians_and_shares_are_taken_round_by_round(
    spark_source: ModuleType,
) -> None:
    seconds = {"topic": [10.0, 12.0, 30.0], "synthetic": [8.0, 12.0, 9.0]}
    results = spark_source.summarize(seconds, 1200, "synthetic", "msgs_per_s")
    assert results["topic"] == {
        "seconds": 12.0,
        "msgs_per_s": 100,
        "seconds_per_round": [10.0, 12.0, 30.0],
        "share_of_synthetic": 0.8,  # the shares 0.8, 1.0 and 0.3: not 9 / 12
    }
    assert results["synthetic"]["seconds"] == 9.0
    assert "share_of_synthetic" not in results["synthetic"]


def test_one_round_keeps_the_single_figures(spark_source: ModuleType) -> None:
    results = spark_source.summarize({"counting": [4.0]}, 100, "counting", "rows_per_s")
    assert results == {"counting": {"seconds": 4.0, "rows_per_s": 25}}
