"""The web console's Cluster panel in a real browser (Debian's Chromium, as tests/admin's
console tests): the members and their states, as the monitor reads them from the database."""

from __future__ import annotations

from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By

from sluiceway.cluster.membership import Membership
from sluiceway.persist.database import Database
from sluiceway.testing import BrokerThread
from tests.admin.test_console import browser, pytestmark, wait_attribute, wait_for
from tests.cluster.members import expire, member_config, member_properties

__all__ = ["browser", "pytestmark"]  # the browser fixture, and the console tests' skip and timeout

# A lease of 5 s: the broker runs in the test's process, beside the browser's driver.
RELAXED = {
    "imq.cluster.heartbeat.interval": "1",
    "imq.cluster.heartbeat.threshold": "5",
    "imq.cluster.monitor.interval": "0.5",
}


def member_state(driver: WebDriver, broker_id: str) -> str:
    row = driver.find_element(By.CSS_SELECTOR, f'#cluster-body tr[data-broker="{broker_id}"]')
    return row.get_attribute("data-state") or ""


def test_the_cluster_panel_lists_the_members_and_their_states(
    browser: WebDriver, pg_url: str
) -> None:
    with BrokerThread(member_properties(pg_url, "a", **RELAXED)) as broker:
        other = Membership(Database(pg_url), member_config(pg_url, "b"))
        other.join("127.0.0.1:1", "")  # a member that never beats again
        browser.get(f"http://127.0.0.1:{broker.admin_port}/")
        wait_attribute(browser, "status", "data-state", "ok")
        wait_for(browser, "a's state", lambda: member_state(browser, "a"), "OPERATING")
        assert browser.find_element(By.ID, "cluster").is_displayed()
        assert browser.find_element(By.ID, "cluster-id").text == "cluster c1"
        address = browser.find_element(
            By.CSS_SELECTOR, '#cluster-body tr[data-broker="a"] [data-field="address"]'
        )
        assert address.text == f"127.0.0.1:{broker.port}"
        expire(pg_url, "b")
        # Declared failed, then its (empty) store taken over by a.
        wait_for(browser, "b's state", lambda: member_state(browser, "b"), "TAKEOVER_COMPLETE")
        events = browser.find_element(By.ID, "cluster-events").text
        assert "b declared-failed: by a" in events
        assert "b takeover-complete: by a" in events


def test_the_cluster_panel_is_hidden_outside_a_cluster(browser: WebDriver) -> None:
    with BrokerThread() as broker:
        browser.get(f"http://127.0.0.1:{broker.admin_port}/")
        wait_attribute(browser, "status", "data-state", "ok")
        assert not browser.find_element(By.ID, "cluster").is_displayed()
