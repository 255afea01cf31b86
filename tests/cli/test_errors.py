"""How `sluiceway cmd` fails: one line on stderr starting `sluiceway cmd:`, and the exit status
(1 refused by the broker, 2 usage error, 3 cannot reach the broker)."""

from __future__ import annotations

import pytest

from sluiceway.testing import BrokerProcess
from tests.cli.support import api, free_port, get, run_cmd


@pytest.mark.parametrize(
    "args",
    [
        ("query", "dst", "-t", "q", "-n", "nowhere"),
        ("update", "dst", "-t", "q", "-n", "nowhere", "-o", "maxNumMsgs=1"),
        ("destroy", "dst", "-t", "q", "-n", "nowhere", "-f"),
        ("pause", "dst", "-t", "q", "-n", "nowhere"),
        ("resume", "dst", "-t", "q", "-n", "nowhere"),
        ("purge", "dst", "-t", "q", "-n", "nowhere", "-f"),
        ("compact", "dst", "-t", "q", "-n", "nowhere"),
        ("metrics", "dst", "-t", "q", "-n", "nowhere"),
    ],
)
def test_unknown_destination(broker: BrokerProcess, args: tuple[str, ...]) -> None:
    result = run_cmd(*args, admin_port=broker.admin_port)
    assert result.status == 1
    assert result.out == ""
    assert result.error_line == (
        "sluiceway cmd: no such destination: destination /queue/nowhere does not exist"
    )


def test_bad_destination_property_value_creates_nothing(broker: BrokerProcess) -> None:
    port = broker.admin_port
    result = run_cmd(
        "create", "dst", "-t", "q", "-n", "bad", "-o", "maxNumMsgs=lots", admin_port=port
    )
    assert result.status == 1
    assert "maxNumMsgs" in result.error_line
    assert "'lots'" in result.error_line
    assert api(port, "GET", "/destinations/queue/bad")[0] == 404


def test_bad_broker_property_value_changes_nothing(broker: BrokerProcess) -> None:
    port = broker.admin_port
    result = run_cmd("update", "bkr", "-o", "imq.system.max_count=many", admin_port=port)
    assert result.status == 1
    assert "imq.system.max_count" in result.error_line
    assert get(port, "/broker")["properties"]["imq.system.max_count"] == "-1"
    unknown = run_cmd("update", "bkr", "-o", "imq.no.such.thing=1", admin_port=port)
    assert unknown.status == 1
    assert "imq.no.such.thing" in unknown.error_line


def test_exists_and_reserved_names_are_refused(broker: BrokerProcess) -> None:
    port = broker.admin_port
    assert run_cmd("create", "dst", "-t", "q", "-n", "twice", admin_port=port).status == 0
    again = run_cmd("create", "dst", "-t", "q", "-n", "twice", admin_port=port)
    assert again.status == 1
    assert "already exists" in again.error_line
    reserved = run_cmd("create", "dst", "-t", "q", "-n", "mq.mine", admin_port=port)
    assert reserved.status == 1
    assert "reserved" in reserved.error_line


def test_broker_down() -> None:
    port = free_port()
    result = run_cmd("list", "dst", admin_port=port)
    assert result.status == 3
    assert f"127.0.0.1:{port}" in result.error_line
    assert "connection refused" in result.error_line
    assert "may not be running" in result.error_line


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("query", "dst", "-t", "q"), "query dst needs -n"),
        (("create", "dst", "-n", "x"), "create dst needs -t"),
        (("update", "bkr"), "update bkr needs -o"),
        (("update", "bkr", "-o", "imq.system.max_count"), "expected NAME=VALUE"),
        (("list", "cxn", "-t", "q"), "list cxn takes no -t"),
        (("pause", "dst", "-n", "x"), "give -t and -n for one destination, or neither"),
        (("destroy", "dur", "-n", "x"), "destroy dur needs -c"),
        (("list", "dst", "-b", "localhost:http"), "the port must be a number"),
        (("list", "dst", "-u", "admin"), "no password for admin"),
        (("list", "dst", "-passfile", "/nonexistent"), "-passfile needs -u USER"),
    ],
)
def test_usage_errors(args: tuple[str, ...], expected: str) -> None:
    result = run_cmd(*args)  # nothing is listening: a usage error is found before connecting
    assert result.status == 2
    assert expected in result.error_line


def test_argparse_usage_errors_exit_2() -> None:
    for args in (("list", "svc"), ("frobnicate", "dst"), ("list", "dst", "-t", "x")):
        result = run_cmd(*args)
        assert result.status == 2
        assert "usage:" in result.err
