"""The example pipeline runs with one command, says what it is doing as it goes, and reports every
order through once."""

from __future__ import annotations

import itertools
import os
import re
import sys
from pathlib import Path
from typing import Final

import pytest

from tests.processes import run_group
from tests.spark.conftest import java_problem, spark_environment

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "orders_pipeline.py"
ORDERS: Final = 1500
# The example says something at least every 5 s (its QUIET_S); its watcher looks twice a second.
# The rest is room for a loaded machine.
LONGEST_SILENCE_S: Final = 8.0
LINE = re.compile(r"\[\s*(\d+\.\d) s\] (.*)")


@pytest.mark.slow
@pytest.mark.timeout(360)  # a whole Spark application; the run below is bounded at 300 s
def test_the_orders_example_runs_end_to_end() -> None:
    problem = java_problem()
    if problem is not None:
        pytest.skip(problem)
    # Its own process group, killed whole however the test ends: the example starts a broker
    # and Spark's JVM, which a kill of the example alone would leave running.
    result = run_group(
        [sys.executable, str(EXAMPLE), "--orders", str(ORDERS)],
        timeout=300,
        env={**os.environ, **spark_environment()},
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    said = [LINE.fullmatch(line) for line in result.stdout.splitlines()]
    assert all(said), result.stdout  # every line it prints says when
    times = [float(match.group(1)) for match in said if match]
    lines = [match.group(2) for match in said if match]
    steps = [line for line in lines if line.endswith("...")]
    assert [step.split(" (")[0].removesuffix("...") for step in steps] == [
        "starting a broker",
        "starting Spark",
        f"sending {ORDERS} orders to /queue/orders",
        "streaming the orders through Spark",
        "draining /queue/orders.enriched and checking every order",
        "stopping Spark",
        "stopping the broker",
    ]
    assert "takes a while" in steps[1]  # a first run is told why it waits
    for expected in (
        "broker ready: STOMP on 127.0.0.1:",
        "Spark ready",
        "  sent 1000 of 1500",
        f"sent {ORDERS} orders to /queue/orders",
        "  batch 0: 1000 orders enriched (1000 so far, ",
        "  batch 1: 500 orders enriched (1500 so far, ",
        "Spark published the enriched orders to /queue/orders.enriched",
        "  received 1000 of 1500",
    ):
        assert any(line.startswith(expected) for line in lines), (expected, result.stdout)
    assert f"{ORDERS} enriched orders received: 0 missing, 0 duplicated, 0 with a wrong total" in (
        result.stdout
    )
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert max(gaps) <= LONGEST_SILENCE_S, result.stdout
