"""benchmarks/spark_cluster.py: a standalone Spark cluster starts its master and workers on
127.0.0.1, and leaves no process behind, even when the block using it fails. (Running a query on
it is the Spark source benchmark's `--master standalone`: a session costs too much for here.)"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import pytest

from tests.spark.conftest import java_problem

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "spark_cluster.py"


@pytest.fixture(scope="module")
def spark_cluster() -> Iterator[ModuleType]:
    problem = java_problem()
    if problem is not None:
        pytest.skip(problem)
    spec = importlib.util.spec_from_file_location("spark_cluster", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["spark_cluster"] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules["spark_cluster"]


def live_members(group: int) -> list[str]:
    """The processes of process group `group` that have not ended (zombies aside)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # ended while looking
        state, _parent, pgrp = text.rpartition(")")[2].split()[:3]
        if int(pgrp) == group and state != "Z":
            found.append(text[: text.index(")") + 1])
    return found


def check_and_fail(cluster: Any, groups: list[int]) -> NoReturn:
    """What a started cluster shows: its master's URL, its worker registered with the cores
    given; its process groups (into `groups`) alive. Then fails, as a benchmark might."""
    assert re.fullmatch(r"spark://127\.0\.0\.1:\d+", cluster.url)
    master, worker = cluster.daemons
    registered = master.wait_for(re.compile(r"Registering worker (\S+) with (\d+) cores"), 30)
    assert registered.group(1).startswith("127.0.0.1:")
    assert registered.group(2) == "1"
    groups.extend([master.process.pid, worker.process.pid])
    assert all(live_members(group) for group in groups)
    raise RuntimeError("the block failed")


@pytest.mark.timeout(150)  # two JVMs start and stop on two cores; each wait is bounded
def test_the_cluster_registers_its_worker_and_stops_every_process_even_on_failure(
    spark_cluster: ModuleType,
) -> None:
    groups: list[int] = []
    cluster = spark_cluster.StandaloneCluster(workers=1, cores=1, memory="512m")
    with pytest.raises(RuntimeError, match="the block failed"), cluster:
        check_and_fail(cluster, groups)
    assert len(groups) == 2
    assert [live_members(group) for group in groups] == [[], []]
