"""The cycle-collector policy of long-running processes: the broker and the generator's workers."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys

import pytest

from sluiceway.bench import workers
from sluiceway.collector import GC_YOUNG_THRESHOLD
from tests.cli.support import free_port


def test_tune_collector_freezes_what_is_alive_and_collects_the_youngest_less_often() -> None:
    # In a process of its own: freezing is for the life of a process.
    script = (
        "import gc; from sluiceway.collector import tune_collector; "
        "default = gc.get_threshold(); tune_collector(); "
        "print(gc.get_threshold()[0], gc.get_threshold()[1:] == default[1:], gc.get_freeze_count())"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=45
    )
    young, others_kept, frozen = out.stdout.split()
    assert int(young) == GC_YOUNG_THRESHOLD
    assert others_kept == "True"
    assert int(frozen) > 1000  # the modules loaded so far, at the least


def test_the_generators_processes_tune_the_collector_before_they_connect(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(workers, "tune_collector", lambda: calls.append("tuned"))
    context = multiprocessing.get_context("spawn")
    target = workers.Target("127.0.0.1", free_port())
    shared = workers.Shared(
        sent=[0], received=[0], ready=[0, 0], go=context.Event(), stop=context.Event(),
        results=context.Queue(),
    )  # fmt: skip
    producer = workers.ProducerSpec(target, 0, "/queue/q", 1, 64, False, False, 1, 0.0)
    consumer = workers.ConsumerSpec(target, 0, "/queue/q", (1,), "auto", 0, 0.0, 0)
    workers.producer_main(producer, shared, 1)
    workers.consumer_main(consumer, shared)
    results = [shared.results.get(timeout=10), shared.results.get(timeout=10)]
    assert calls == ["tuned", "tuned"]
    # Both ran to the connection, which failed: the tuning came first.
    assert isinstance(results[0], workers.ProducerResult)
    assert "Connect call failed" in results[0].error
    assert isinstance(results[1], workers.ConsumerResult)
    assert "Connect call failed" in results[1].error
