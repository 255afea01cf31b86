"""The web console in a real browser: Debian's Chromium, headless, driven by Selenium.

The page is checked against the broker's own state, read on its event loop (`broker.call`):
counts, states, limits, flow control (a consumer whose window is used up, a producer held by a
FLOW_CONTROL queue) and the memory level; its buttons are clicked and their effect checked in
the core. The browser and its driver are the OS packages `chromium` and `chromium-driver`, which
`./dev test` installs when missing; they are given by path, so Selenium Manager never looks for
(or downloads) anything. Every wait is a bounded WebDriverWait; the page polls every 2 s.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.select import Select
from selenium.webdriver.support.wait import WebDriverWait

from sluiceway.admin import model
from sluiceway.client.pipeline import OutgoingMessage, PipelineConnection, PipelineSettings
from sluiceway.core.broker import Broker
from sluiceway.core.model.destination import Destination
from sluiceway.core.model.holding import HeldProducer
from sluiceway.core.values.memory import MemoryLevel
from sluiceway.naming import parse_destination
from sluiceway.security.users import UserFile
from sluiceway.testing import BrokerThread
from tests.admin.adminhttp import AdminHttp
from tests.conftest import BrokerFactory
from tests.e2e.rawclient import RawClient
from tests.e2e.support import wait_until

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
WAIT = 15.0  # seconds for anything the page shows: it polls every 2 s

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
        reason=f"{CHROMIUM} or {CHROMEDRIVER} is missing: `./dev test` installs the OS packages "
        "chromium and chromium-driver (apt-get) before it runs the suite",
    ),
]

ORDERS = "/queue/orders"
FLOW = "/queue/fc"
RATES = "/queue/rates"
DRAINED = "/queue/drained"
ADAPTIVE = "/queue/adaptive"


@pytest.fixture
def browser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[WebDriver]:
    # Belt and braces: with the driver's path given Selenium skips its manager anyway.
    monkeypatch.setenv("SE_OFFLINE", "true")
    options = Options()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1500,1200",
        f"--user-data-dir={tmp_path / 'chromium'}",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(WAIT)
    driver.set_script_timeout(WAIT)
    try:
        yield driver
    finally:
        driver.quit()


# -- reading the page and the broker --------------------------------------------------------------


def wait_for(driver: WebDriver, what: str, read: Callable[[], object], expected: object) -> None:
    """Wait until `read()` returns `expected`; fail saying what was shown last."""
    seen: list[object] = []

    def check(_: WebDriver) -> bool:
        try:
            value = read()
        except (NoSuchElementException, StaleElementReferenceException) as exc:
            seen.append(f"not on the page yet ({type(exc).__name__})")
            return False
        seen.append(value)
        return value == expected

    try:
        WebDriverWait(driver, WAIT, poll_frequency=0.1).until(check)
    except Exception:
        last = seen[-1] if seen else "nothing"
        raise AssertionError(f"{what}: expected {expected!r}, the page shows {last!r}") from None


def attribute(element: WebElement, name: str) -> str:
    return element.get_attribute(name) or ""


def wait_shown(driver: WebDriver, path: str, field: str, expected: str) -> None:
    """Wait until the `field` cell of destination `path` stands for `expected`."""
    wait_for(driver, f"{path} {field}", lambda: shown(driver, path, field), expected)


def wait_attribute(driver: WebDriver, element_id: str, name: str, expected: str) -> None:
    """Wait until the element `element_id` has attribute `name` set to `expected`."""

    def read() -> str:
        return attribute(driver.find_element(By.ID, element_id), name)

    wait_for(driver, f"#{element_id} {name}", read, expected)


def cell(driver: WebDriver, path: str, field: str) -> WebElement:
    return driver.find_element(
        By.CSS_SELECTOR, f'tr[data-destination="{path}"] [data-field="{field}"]'
    )


def shown(driver: WebDriver, path: str, field: str) -> str:
    """The raw value behind what a destination's cell shows (its data-value)."""
    return cell(driver, path, field).get_attribute("data-value") or ""


def text(driver: WebDriver, path: str, field: str) -> str:
    return cell(driver, path, field).text


def row_state(driver: WebDriver, path: str) -> str:
    row = driver.find_element(By.CSS_SELECTOR, f'tr[data-destination="{path}"]')
    return row.get_attribute("data-state") or ""


def button(driver: WebDriver, path: str, action: str) -> WebElement:
    return driver.find_element(
        By.CSS_SELECTOR, f'tr[data-destination="{path}"] button[data-action="{action}"]'
    )


def core(broker: BrokerThread) -> Broker:
    assert broker.broker is not None
    return broker.broker


def destination(broker: BrokerThread, path: str) -> Destination:
    return core(broker).destination(parse_destination(path))


def summary(broker: BrokerThread, path: str) -> model.DestinationSummary:
    return broker.call(lambda: model.destination_summary(core(broker), destination(broker, path)))


def held(broker: BrokerThread) -> list[HeldProducer]:
    return broker.call(core(broker).producers.held)


def canvas_pixels(driver: WebDriver, element_id: str) -> int:
    """How many pixels of a canvas something was drawn on."""
    script = """
        const canvas = document.getElementById(arguments[0]);
        const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
        let drawn = 0;
        for (let i = 3; i < data.length; i += 4) if (data[i] !== 0) drawn += 1;
        return drawn;
    """
    return int(driver.execute_script(script, element_id))


# -- the console against the broker's state -------------------------------------------------------


@pytest.fixture
def busy_broker(make_broker: BrokerFactory) -> Iterator[tuple[BrokerThread, list[RawClient]]]:
    """A broker with traffic: /queue/orders holds 5 messages, 2 of them delivered to a consumer
    whose window (consumer-flow-limit 2) is used up; /queue/fc (FLOW_CONTROL, maxNumMsgs 2)
    holds a third SEND of its producer."""
    broker = make_broker(
        {
            "imq.destination.queue.fc.maxNumMsgs": "2",
            "imq.destination.queue.fc.limitBehavior": "FLOW_CONTROL",
            # JMS IQ Manager throttling holds SENDs too; only the limit should here.
            "imq.throttling.server.threshold": "0",
        }
    )
    clients = [RawClient(broker.port) for _ in range(3)]
    producer, consumer, flow_producer = clients
    for client in clients:
        client.connect()
    for i in range(5):
        producer.send("SEND", {"destination": ORDERS}, b"order %d" % i)
    producer.sync()
    consumer.subscribe(ORDERS, consumer_flow_limit="2")
    consumer.receive(2)  # and never acknowledged: its window is used up
    for i in range(3):
        flow_producer.send("SEND", {"destination": FLOW}, b"%d" % i)
    flow_producer.sync()  # the third SEND is held; receipts of other frames overtake it
    wait_until(lambda: [h.held_sends for h in held(broker)] == [1])
    try:
        yield broker, clients
    finally:
        for client in clients:
            client.close()


def open_console(browser: WebDriver, broker: BrokerThread, fragment: str = "") -> None:
    """Load the page and wait for its first complete poll."""
    browser.get(f"http://127.0.0.1:{broker.admin_port}/{fragment}")
    assert browser.title == "Sluiceway console"
    wait_attribute(browser, "status", "data-state", "ok")


def test_console_shows_the_brokers_state(
    busy_broker: tuple[BrokerThread, list[RawClient]], browser: WebDriver
) -> None:
    broker, _ = busy_broker
    open_console(browser, broker)

    # Counts and state of each destination, as the core has them.
    for path in (ORDERS, FLOW):
        expected = summary(broker, path)
        for field in ("msgs", "pending", "unacked", "producers", "consumers", "held_sends"):
            wait_shown(browser, path, field, str(getattr(expected, field)))
        assert row_state(browser, path) == expected.state == "RUNNING"
        assert text(browser, path, "state") == "RUNNING"
    assert (text(browser, ORDERS, "msgs"), text(browser, ORDERS, "unacked")) == ("5", "2")

    # Limits, from each destination's properties.
    wait_shown(browser, FLOW, "maxNumMsgs", "2")
    assert shown(browser, FLOW, "limitBehavior") == "FLOW_CONTROL"
    assert text(browser, FLOW, "maxTotalMsgBytes") == "unlimited"
    settings = broker.call(lambda: destination(broker, ORDERS).settings)
    wait_shown(browser, ORDERS, "maxNumMsgs", str(settings.max_num_msgs))
    assert shown(browser, ORDERS, "limitBehavior") == settings.limit_behavior.value

    # Flow control: the consumer whose window is used up; the held producer, and why.
    wait_shown(browser, ORDERS, "paused_consumers", "1")
    assert text(browser, ORDERS, "longest_pause").startswith("longest ")
    assert float(shown(browser, ORDERS, "longest_pause")) >= 0
    assert shown(browser, FLOW, "paused_consumers") == "0"
    (holding,) = held(broker)
    assert holding.destination == FLOW
    wait_shown(browser, FLOW, "held_producers", "1")
    assert text(browser, FLOW, "held_reason") == holding.reason == "destination full"
    assert "maxNumMsgs" in attribute(cell(browser, FLOW, "held_reason"), "title")
    assert shown(browser, ORDERS, "held_producers") == "0"
    held_sends = browser.find_element(
        By.CSS_SELECTOR, f'tr[data-connection="{holding.connection}"] [data-field="held_sends"]'
    )
    assert held_sends.text == "1"

    # The overview: memory level and use, messages held, connections, held producers.
    level = broker.call(lambda: MemoryLevel(core(broker).ledger.level).name)
    wait_attribute(browser, "memory-level", "data-level", level)
    assert browser.find_element(By.ID, "memory-level").text == level
    budget = broker.call(lambda: core(broker).ledger.policy.budget)
    assert attribute(browser.find_element(By.ID, "memory-use"), "data-budget") == str(budget)
    total = broker.call(lambda: core(broker).context.system.count)
    overview = {
        "broker-msgs": str(total),
        "broker-connections": "3",
        "broker-held-producers": "1",
        "broker-throttled-count": "0",
    }
    for element_id, value in overview.items():
        wait_attribute(browser, element_id, "data-value", value)

    # A queue drained by a lease group has no consumer, but one pipeline reader, listed with
    # its lag in the queue's detail.
    with PipelineConnection(PipelineSettings(port=broker.port, timeout=WAIT)) as pipeline:
        pipeline.send_many(OutgoingMessage(DRAINED, b"%d" % i) for i in range(4))
        assert len(list(pipeline.read_lease(DRAINED, "spark/1", max_messages=1))) == 1
    wait_shown(browser, DRAINED, "pipeline_readers", "1")
    assert shown(browser, DRAINED, "consumers") == "0"
    assert "drained by 1 pipeline reader" in attribute(cell(browser, DRAINED, "consumers"), "title")
    cell(browser, DRAINED, "path").find_element(By.CSS_SELECTOR, "button").click()
    reader = '#detail-readers tr[data-group="spark"][data-kind="lease-group"]'

    def reader_field(field: str) -> str:
        found = browser.find_element(By.CSS_SELECTOR, f'{reader} [data-field="{field}"]')
        return found.get_attribute("data-value") or ""

    wait_for(browser, "the lease group's lag", lambda: reader_field("lag_messages"), "4")
    assert (reader_field("open_leases"), reader_field("leased_messages")) == ("1", "1")
    assert reader_field("position") == ""  # a lease group has none: shown as "-"
    assert float(reader_field("lag_seconds")) >= 0
    assert browser.find_element(By.ID, "detail-readers-empty").is_displayed() is False
    assert browser.find_element(By.ID, "detail-consumers-empty").is_displayed() is True

    # Every consumer's window as it is now: the broker sizes an adaptive one (auto).
    adaptive = RawClient(broker.port)
    try:
        adaptive.connect()
        adaptive.subscribe(ADAPTIVE, "tuned", consumer_flow_limit="auto")
        wait_shown(browser, ADAPTIVE, "consumers", "1")
        cell(browser, ADAPTIVE, "path").find_element(By.CSS_SELECTOR, "button").click()
        row = '#detail-consumers tr[data-subscription="tuned"]'

        def consumer_field(field: str) -> WebElement:
            return browser.find_element(By.CSS_SELECTOR, f'{row} [data-field="{field}"]')

        wait_for(
            browser,
            "the adaptive consumer's window",
            lambda: consumer_field("window").text,
            "16 (auto, max 1,000)",
        )
        assert consumer_field("window").get_attribute("data-auto") == "true"
        assert consumer_field("pace").text == "-"  # nothing consumed: not measured yet
    finally:
        adaptive.close()


def test_pause_resume_and_purge_act_on_the_broker(
    busy_broker: tuple[BrokerThread, list[RawClient]], browser: WebDriver
) -> None:
    broker, _ = busy_broker
    open_console(browser, broker)
    orders = destination(broker, ORDERS)

    def paused() -> tuple[bool, bool]:
        return broker.call(lambda: (orders.paused_producers, orders.paused_consumers))

    # Pause the producers of /queue/orders, then resume them.
    target = cell(browser, ORDERS, "actions").find_element(By.CSS_SELECTOR, "select")
    Select(target).select_by_value("PRODUCERS")
    button(browser, ORDERS, "pause").click()
    wait_for(browser, "state after Pause", lambda: row_state(browser, ORDERS), "PRODUCERS_PAUSED")
    assert paused() == (True, False)
    assert text(browser, ORDERS, "state") == "PRODUCERS_PAUSED"
    button(browser, ORDERS, "resume").click()
    wait_for(browser, "state after Resume", lambda: row_state(browser, ORDERS), "RUNNING")
    assert paused() == (False, False)

    # The dead message queue cannot be paused: the page does not offer it.
    assert not button(browser, "/queue/mq.sys.dmq", "pause").is_enabled()

    # Purge asks first: a dismissed confirmation purges nothing, an accepted one purges.
    wait_shown(browser, ORDERS, "pending", "3")
    for accept in (False, True):
        button(browser, ORDERS, "purge").click()
        alert = WebDriverWait(browser, WAIT).until(expected_conditions.alert_is_present())
        assert ORDERS in alert.text
        if accept:
            alert.accept()
        else:
            alert.dismiss()
    # "3": had the dismissed confirmation purged, the accepted one would have found 0.
    wait_for(
        browser,
        "purge result",
        lambda: browser.find_element(By.ID, "message-text").text,
        f"Purged 3 messages from {ORDERS}.",
    )
    after = summary(broker, ORDERS)
    assert after.pending == 0
    assert after.msgs == after.unacked == 2  # delivered and unacknowledged: not purged
    wait_shown(browser, ORDERS, "pending", "0")
    wait_shown(browser, ORDERS, "msgs", "2")


def test_rate_charts_draw_the_traffic(
    busy_broker: tuple[BrokerThread, list[RawClient]], browser: WebDriver
) -> None:
    broker, (producer, _, _) = busy_broker
    open_console(browser, broker)

    def points(element_id: str) -> int:
        return int(attribute(browser.find_element(By.ID, element_id), "data-points") or 0)

    def peak_in(element_id: str) -> float:
        return float(attribute(browser.find_element(By.ID, element_id), "data-peak-in") or 0)

    # A point per poll, drawn, in each chart: the broker's and the selected destination's.
    WebDriverWait(browser, WAIT).until(lambda _: points("chart-broker") >= 2)
    assert canvas_pixels(browser, "chart-broker") > 0
    producer.request("SEND", {"destination": RATES}, b"first")
    wait_shown(browser, RATES, "msgs", "1")
    assert points("chart-destination") == 0
    cell(browser, RATES, "path").find_element(By.CSS_SELECTOR, "button").click()
    selected = f'tr[data-destination="{RATES}"][data-selected="true"]'
    WebDriverWait(browser, WAIT).until(lambda _: browser.find_elements(By.CSS_SELECTOR, selected))
    wait_for(browser, "detail", lambda: browser.find_element(By.ID, "detail-path").text, RATES)
    WebDriverWait(browser, WAIT).until(lambda _: points("chart-destination") >= 2)
    assert canvas_pixels(browser, "chart-destination") > 0
    assert browser.current_url.endswith(f"#{RATES}")

    # Messages sent show as a rate above zero in both (the broker measures rates over its
    # last few seconds, so the next polls see them).
    for i in range(20):
        producer.send("SEND", {"destination": RATES}, b"rate %d" % i)
    producer.sync()
    WebDriverWait(browser, WAIT).until(lambda _: peak_in("chart-broker") > 0)
    WebDriverWait(browser, WAIT).until(lambda _: peak_in("chart-destination") > 0)

    # History is bounded: the chart keeps at most its HISTORY points.
    history = browser.execute_script(
        "const c = document.getElementById('chart-broker'); return Number(c.dataset.points);"
    )
    assert 2 <= int(history) <= 150


def test_console_files_are_served_with_their_types_and_nothing_else(
    make_broker: BrokerFactory,
) -> None:
    broker = make_broker()
    http = AdminHttp(broker.admin_port)
    status, page, headers = http.raw("GET", "/")
    assert (status, headers["Content-Type"]) == (200, "text/html; charset=utf-8")
    assert b'src="console/app.js"' in page
    assert "frame-ancestors 'none'" in headers["Content-Security-Policy"]
    for name, kind in (("app.js", "text/javascript"), ("style.css", "text/css")):
        status, _, headers = http.raw("GET", f"/console/{name}")
        assert (status, headers["Content-Type"]) == (200, f"{kind}; charset=utf-8")
    status, body, _ = http.raw("GET", "/console/passwd")
    assert status == 404
    assert b"no such console file" in body


# -- with authentication on -----------------------------------------------------------------------


@pytest.fixture
def secured_broker(make_broker: BrokerFactory, tmp_path: Path) -> BrokerThread:
    users = tmp_path / "passwd"
    UserFile(users).add("admin", "s3cret", ("admin",))
    UserFile(users).add("alice", "wonder", ("user",))
    return make_broker(
        {
            "imq.authentication.enabled": "true",
            "imq.user_repository.file.filename": os.fspath(users),
        }
    )


def test_console_needs_an_administrators_credentials(
    secured_broker: BrokerThread, browser: WebDriver
) -> None:
    port = secured_broker.admin_port
    assert AdminHttp(port).raw("GET", "/")[0] == 401
    assert AdminHttp(port).raw("GET", "/console/app.js")[0] == 401
    assert AdminHttp(port, "alice", "wonder").raw("GET", "/")[0] == 403
    assert AdminHttp(port, "admin", "wrong").raw("GET", "/")[0] == 401

    # Without credentials the browser gets the 401 challenge and no console.
    browser.get(f"http://127.0.0.1:{port}/")
    assert browser.find_elements(By.ID, "destinations-table") == []

    # An administrator's credentials in a header: the page and every API call carry them.
    token = base64.b64encode(b"admin:s3cret").decode()
    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd(
        "Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Basic {token}"}}
    )
    browser.get(f"http://127.0.0.1:{port}/")
    status = browser.find_element(By.ID, "status")
    wait_for(browser, "status", lambda: status.get_attribute("data-state"), "ok")
    dmq = "/queue/mq.sys.dmq"
    wait_for(browser, "DMQ row", lambda: shown(browser, dmq, "msgs"), "0")
    browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {}})

    # Credentials in the address, as a person types them (the browser keeps them for the API).
    browser.get(f"http://admin:s3cret@127.0.0.1:{port}/")
    status = browser.find_element(By.ID, "status")
    wait_for(
        browser,
        "status with credentials in the URL",
        lambda: status.get_attribute("data-state"),
        "ok",
    )
    wait_for(browser, "DMQ maxNumMsgs", lambda: shown(browser, dmq, "maxNumMsgs"), "1000")
