"""`sluiceway broker` as a real process: start-up, the ready line, SIGTERM, configuration errors."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluiceway.testing import BrokerProcess
from tests.e2e.rawclient import ConnectionClosed, RawClient


def sluiceway(*args: str) -> list[str]:
    return [sys.executable, "-m", "sluiceway", *args]


@pytest.fixture
def broker_process() -> Iterator[BrokerProcess]:
    with BrokerProcess() as broker:
        yield broker


def test_ready_line_then_clean_shutdown_on_sigterm(broker_process: BrokerProcess) -> None:
    client = RawClient(broker_process.port)
    client.connect()
    client.subscribe("/queue/q")
    client.request("SEND", {"destination": "/queue/q"}, b"hello")
    assert client.receive(1)[0].body == b"hello"
    code, log = broker_process.stop()
    assert code == 0
    assert "shutting down" in log
    assert "stopped" in log
    error = client.expect("ERROR")  # the client is told why before the socket closes
    assert "shutting down" in error.headers["message"]
    with pytest.raises(ConnectionClosed):
        client.read_some(time.monotonic() + 5)
    client.close()


def test_unknown_property_stops_start_up() -> None:
    result = subprocess.run(
        sluiceway("broker", "-D", "imq.system.max_cont=5"),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert "unknown property imq.system.max_cont" in result.stderr


def test_bad_value_in_file_names_property_and_accepted_values(tmp_path: Path) -> None:
    path = tmp_path / "broker.properties"
    path.write_text("imq.autocreate.queue.dispatchPolicy = roundrobin\n")
    result = subprocess.run(
        sluiceway("broker", "--config", str(path)),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert "imq.autocreate.queue.dispatchPolicy" in result.stderr
    assert "one of openmq, fair" in result.stderr


def test_config_file_is_applied(tmp_path: Path) -> None:
    path = tmp_path / "broker.properties"
    path.write_text("imq.destination.queue.capped.consumerFlowLimit=2\n")
    with BrokerProcess("--config", str(path)) as broker:
        client = RawClient(broker.port)
        client.connect()
        receipt = client.subscribe("/queue/capped", consumer_flow_limit="50")
        assert receipt.headers["consumer-flow-limit"] == "2"
        client.close()
        assert broker.stop()[0] == 0


def test_help_and_property_list() -> None:
    result = subprocess.run(
        sluiceway("broker", "--help"), capture_output=True, text=True, timeout=25, check=True
    )
    assert "--config" in result.stdout
    assert "-D NAME=VALUE" in result.stdout
    listing = subprocess.run(
        sluiceway("broker", "--list-properties"),
        capture_output=True,
        text=True,
        timeout=25,  # the two runs' bounds add up to less than the test's 60 s
        check=True,
    )
    assert "`imq.protocol.tcp.nodelay`" in listing.stdout


def test_port_in_use_is_a_clear_error(broker_process: BrokerProcess, tmp_path: Path) -> None:
    # Its own data directory: it opens the store before the port, and the default one is in the
    # directory the tests run from.
    result = subprocess.run(
        sluiceway("broker", "--port", str(broker_process.port), "--data-dir", str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1
    assert "cannot start" in result.stderr
    assert "address already in use" in result.stderr.lower()
