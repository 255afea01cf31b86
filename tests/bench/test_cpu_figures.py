"""`sluiceway bench` against a real broker process reports each load process's CPU share, and
the broker's (found by the port it listens on), and warns when a share is above the threshold.

Speed is never asserted: only that the figures are there and within what the machine has.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sluiceway.cli.main import main
from sluiceway.testing import BrokerProcess

pytestmark = pytest.mark.timeout(60)


def test_every_process_has_a_cpu_share_and_a_zero_threshold_warns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "result.json"
    with BrokerProcess() as broker:
        status = main([
            "bench", "queue", "--messages", "2000", "--producers", "2", "--consumers", "2",
            "--port", str(broker.port), "--timeout", "5", "--busy-warning", "0",
            "--json", str(out),
        ])  # fmt: skip
        broker_pid = broker.process.pid
    assert status == 0
    result = json.loads(out.read_text())
    cores = os.cpu_count() or 1
    processes = {p["process"]: p for p in result["processes"]}
    assert sorted(processes) == ["consumer 0", "consumer 1", "producer 0", "producer 1"]
    for figures in processes.values():
        assert figures["pid"] not in (0, os.getpid(), broker_pid)
        assert 0 <= figures["share"] <= cores
        assert 0 <= figures["cpu_seconds"] <= figures["seconds"] * cores + 0.01
        assert figures["seconds"] > 0  # each one worked: sent or received something
    assert len({p["pid"] for p in processes.values()}) == 4  # a process each
    broker_cpu = result["broker_cpu"]
    assert broker_cpu["pid"] == broker_pid  # found listening on --port
    assert 0 <= broker_cpu["share"] <= cores
    assert result["busy_share"] == 0
    busy = [name for name, p in processes.items() if p["share"] > 0]
    assert busy  # someone did some work
    assert result["generator_saturated"] == busy
    err = capsys.readouterr().err
    for name in busy:
        assert f"sluiceway bench: warning: {name} (pid {processes[name]['pid']}) used" in err
    assert "bounded by the load generator, not the broker" in err
