"""The plain STOMP listener turned off (imq.stomp.tcp.port=-1): a broker that serves STOMP over
WebSocket or TLS only, and everything that reports listeners while the plain one is absent."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from sluiceway.app.services import Services
from sluiceway.config import build_config
from sluiceway.core.broker import Broker
from sluiceway.errors import ConfigError
from sluiceway.testing import BrokerProcess, BrokerThread
from tests.cli.support import get, pairs, run_cmd, table_rows
from tests.conftest import BrokerFactory
from tests.e2e.support import wait_until
from tests.security.webprobe import listening_ports, make_certificate, tls_client
from tests.server.wsclient import WsStomp

WS_ONLY = {"imq.stomp.tcp.port": "-1", "imq.stomp.ws.port": "0"}


@pytest.fixture
def ws_only(make_broker: BrokerFactory) -> BrokerThread:
    return make_broker(WS_ONLY)


def addresses(broker: BrokerThread) -> dict[str, tuple[str, int]]:
    services = broker.services
    assert services is not None
    return broker.call(services.addresses)


def test_nothing_but_what_the_ready_line_lists_listens(ws_only: BrokerThread) -> None:
    services = ws_only.services
    assert services is not None
    assert ws_only.port == 0
    assert ws_only.server is None
    assert services.stomp is None
    found = addresses(ws_only)
    assert set(found) == {"ws", "admin"}
    ready = ws_only.call(services.ready_line)
    assert ready == (
        f"STOMP over WebSocket on 127.0.0.1:{found['ws'][1]}, "
        f"admin on 127.0.0.1:{found['admin'][1]}"
    )
    assert listening_ports() == {found["ws"][1], found["admin"][1]}


async def test_a_websocket_only_broker_carries_messages_and_reports(
    ws_only: BrokerThread, caplog: pytest.LogCaptureFixture
) -> None:
    services = ws_only.services
    assert services is not None
    ws_port, admin_port = addresses(ws_only)["ws"][1], ws_only.admin_port
    async with aiohttp.ClientSession() as session:
        sender = await WsStomp.open(session, f"http://127.0.0.1:{ws_port}/stomp")
        receiver = await WsStomp.open(session, f"http://127.0.0.1:{ws_port}/ws")
        await receiver.subscribe("/queue/only-ws", ack="auto")
        await sender.request("SEND", {"destination": "/queue/only-ws", "persistent": "true"}, b"x")
        (message,) = await receiver.receive(1)
        assert message.body == b"x"
        # The admin API's listeners, connections, service metrics and Prometheus' page.
        base = f"http://127.0.0.1:{admin_port}"
        async with session.get(f"{base}/api/v1/broker") as answer:
            assert set((await answer.json())["services"]) == {"ws", "admin"}
        async with session.get(f"{base}/api/v1/connections") as answer:
            assert [c["service"] for c in await answer.json()] == ["ws", "ws"]
        async with session.get(f"{base}/api/v1/metrics/services") as answer:
            assert [s["name"] for s in await answer.json()] == ["ws"]
        async with session.get(f"{base}/metrics") as answer:
            assert 'service="ws"' in await answer.text()
        # The periodic work goes on without the plain listener (it flushed the journal there).
        ticks: list[int] = []
        ws_only.call(lambda: services.every_tick(lambda: ticks.append(1)))
        await sender.close()
        await receiver.close()
    wait_until(lambda: len(ticks) >= 2)
    assert "periodic broker work failed" not in caplog.text


def test_tls_only_broker(make_broker: BrokerFactory, tmp_path: Path) -> None:
    certificate = make_certificate(tmp_path)
    broker = make_broker(
        {"imq.stomp.tcp.port": "-1", "imq.stomp.tls.port": "0", **certificate.properties()}
    )
    port = addresses(broker)["stomp-tls"][1]
    client = tls_client(port, certificate.client_context())
    try:
        client.connect()
        client.subscribe("/queue/tls-only", ack="auto")
        client.request("SEND", {"destination": "/queue/tls-only"}, b"over tls")
        assert client.receive(1)[0].body == b"over tls"
    finally:
        client.close()


def test_no_listener_at_all_is_a_configuration_error() -> None:
    with pytest.raises(ConfigError) as refused:
        build_config({"imq.stomp.tcp.port": "-1"})
    assert refused.value.name == "imq.stomp.tcp.port"
    message = str(refused.value)
    for name in ("imq.stomp.tcp.port", "imq.stomp.tls.port", "imq.stomp.ws.port"):
        assert name in message
    # A WebSocket or TLS listener is enough.
    assert build_config(WS_ONLY).stomp_port == -1
    assert build_config({"imq.stomp.tcp.port": "-1", "imq.stomp.tls.port": "0"}).stomp_port == -1


async def test_services_without_the_plain_listener_start_and_stop() -> None:
    values = {**WS_ONLY, "imq.admin.http.port": "-1", "imq.persist.store": "memory"}
    services = Services(Broker(build_config(values)))
    assert services.stomp is None
    assert services.listeners == []
    await services.start()
    try:
        assert [listener.name for listener in services.listeners] == ["ws"]
        assert services.ready_line().startswith("STOMP over WebSocket on 127.0.0.1:")
    finally:
        await services.stop()


# -- the command line -------------------------------------------------------------------------


@pytest.fixture
def ws_only_process() -> Iterator[BrokerProcess]:
    with BrokerProcess("--port", "-1", "-D", "imq.stomp.ws.port=0") as broker:
        yield broker


def test_the_broker_command_with_the_plain_port_off(ws_only_process: BrokerProcess) -> None:
    broker = ws_only_process
    assert broker.port == 0
    assert broker.ready.startswith("STOMP over WebSocket on 127.0.0.1:")
    assert "STOMP on" not in broker.ready
    assert broker.admin_port != 0
    shown = pairs(run_cmd("query", "bkr", admin_port=broker.admin_port).out)
    assert shown["Services"].startswith("ws 127.0.0.1:")
    assert "stomp " not in shown["Services"]
    assert shown["imq.stomp.tcp.port"] == "-1"
    result = run_cmd("metrics", "svc", admin_port=broker.admin_port)
    assert result.status == 0, result.err
    assert [row[0] for row in table_rows(result.out)] == ["ws"]
    assert get(broker.admin_port, "/connections") == []
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.admin_port}/metrics", timeout=10) as r:
        assert r.status == 200
    code, log = broker.stop()
    assert code == 0
    assert "periodic broker work failed" not in log


def test_the_broker_command_refuses_to_start_without_a_listener(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sluiceway", "broker", "--port", "-1", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert "no STOMP listener is on" in result.stderr
    assert "imq.stomp.ws.port" in result.stderr
