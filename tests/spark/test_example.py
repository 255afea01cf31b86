"""The example pipeline runs with one command and reports every order through once."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.processes import run_group
from tests.spark.conftest import java_problem, spark_environment

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "orders_pipeline.py"


@pytest.mark.slow
@pytest.mark.timeout(360)  # a whole Spark application; the run below is bounded at 300 s
def test_the_orders_example_runs_end_to_end() -> None:
    problem = java_problem()
    if problem is not None:
        pytest.skip(problem)
    # Its own process group, killed whole however the test ends: the example starts a broker
    # and Spark's JVM, which a kill of the example alone would leave running.
    result = run_group(
        [sys.executable, str(EXAMPLE), "--orders", "1500"],
        timeout=300,
        env={**os.environ, **spark_environment()},
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "sent 1500 orders to /queue/orders" in result.stdout
    assert "1500 enriched orders received: 0 missing, 0 duplicated, 0 with a wrong total" in (
        result.stdout
    )
