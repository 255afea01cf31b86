"""`sluiceway cmd list bkr`, GET /api/v1/cluster and the cluster's /metrics, on real broker
processes sharing a real PostgreSQL (and on a broker of its own, outside any cluster)."""

from __future__ import annotations

import urllib.request

import pytest

from sluiceway.testing import BrokerThread
from tests.cli.support import get, run_cmd, table_rows, wait_until
from tests.cluster.members import start_member
from tests.conftest import BrokerFactory

TITLES = (
    "Broker ID",
    "Address",
    "State",
    "Msgs",
    "Takeover Broker ID",
    "Time since last status timestamp (seconds)",
)


def listed(admin_port: int) -> dict[str, list[str]]:
    """`list bkr`'s rows by broker id."""
    result = run_cmd("list", "bkr", admin_port=admin_port)
    assert result.status == 0, result.err
    return {row[0]: row for row in table_rows(result.out)}


def test_a_broker_outside_a_cluster_lists_itself_operating(make_broker: BrokerFactory) -> None:
    broker: BrokerThread = make_broker()
    result = run_cmd("list", "bkr", admin_port=broker.admin_port)
    assert result.status == 0, result.err
    assert result.out.startswith("This broker is not a member of a cluster")
    for title in TITLES:
        assert title in result.out
    assert table_rows(result.out) == [["-", f"127.0.0.1:{broker.port}", "OPERATING", "0", "-", "-"]]
    view = run_cmd("list", "bkr", "--json", admin_port=broker.admin_port).json()
    assert view["ha"] is False
    assert [member["this_broker"] for member in view["members"]] == [True]


@pytest.mark.timeout(120)
def test_members_list_each_other_and_a_member_that_died_as_failed(pg_url: str) -> None:
    with start_member(pg_url, "a") as a, start_member(pg_url, "b") as b:
        wait_until(lambda: len(listed(a.admin_port)) == 2, timeout=20, what="both listed")
        rows = listed(a.admin_port)
        assert rows["a"][1:4] == [f"127.0.0.1:{a.port}", "OPERATING", "0"]
        assert rows["b"][1:4] == [f"127.0.0.1:{b.port}", "OPERATING", "0"]
        assert rows["b"][4] == "-"
        assert float(rows["b"][5]) < 20  # heartbeats keep it young
        assert listed(b.admin_port).keys() == {"a", "b"}
        view = get(a.admin_port, "/cluster")
        assert (view["ha"], view["cluster_id"], view["broker_id"]) == (True, "c1", "a")
        assert {(e["broker_id"], e["kind"]) for e in view["events"]} >= {
            ("a", "joined"),
            ("b", "joined"),
        }
        metrics = scrape(a.admin_port)
        assert 'sluiceway_cluster_member_up{broker_id="b",state="OPERATING"} 1.0' in metrics
        assert 'sluiceway_cluster_heartbeat_age_seconds{broker_id="a"}' in metrics
        assert "sluiceway_cluster_takeovers_total 0.0" in metrics

        b.kill()
        # Declared failed, then taken over by a (its store is a's now).
        wait_until(
            lambda: listed(a.admin_port)["b"][2] == "TAKEOVER_COMPLETE",
            timeout=30,
            what="b declared failed and taken over",
        )
        row = listed(a.admin_port)["b"]
        assert row[4] == "a"  # Takeover Broker ID
        assert float(row[5]) >= 2.5  # the failure time: lease 2 s + 0.5
        metrics = scrape(a.admin_port)
        assert 'sluiceway_cluster_member_up{broker_id="b",state="TAKEOVER_COMPLETE"} 0.0' in metrics
        assert "sluiceway_cluster_takeovers_total 1.0" in metrics
        events = {(e["broker_id"], e["kind"]) for e in get(a.admin_port, "/cluster")["events"]}
        assert {
            ("b", "declared-failed"),
            ("b", "takeover-started"),
            ("b", "takeover-complete"),
        } <= events
        a.stop()


def scrape(admin_port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics", timeout=10) as answer:
        return str(answer.read().decode())
