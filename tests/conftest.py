"""Fixtures shared by the test packages: real brokers on real sockets (port 0)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from sluiceway.testing import BrokerThread
from sluiceway.testing.postgres import PostgresMissing, PostgresServer, find_bin, postgres_server
from tests.processes import ProcessWatch

BrokerFactory = Callable[..., BrokerThread]

# Property tests are bounded by their example counts and the suite's timeouts, never by the time
# one example takes: Hypothesis's default 200 ms deadline fails them on a loaded machine, and so
# does its too_slow health check (data generation timed against the clock). A test that sets
# suppress_health_check itself replaces this list: tests/test_suite_rules.py checks it keeps
# too_slow.
settings.register_profile("sluiceway", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("sluiceway")

PROCESSES = ProcessWatch()
LEFT_RUNNING = pytest.StashKey[list[str]]()  # what the watch killed at the end, to report
LEFT_RUNNING_KEY = "sluiceway-left-running"  # the same, sent by a worker of pytest-xdist


def runs_tests(config: pytest.Config) -> bool:
    """Whether this process runs tests: not the one that hands them out to workers
    (pytest-xdist, `-n`), which only starts them, each watching its own processes."""
    is_worker = hasattr(config, "workerinput")
    return is_worker or not getattr(config.option, "numprocesses", None)


def pytest_sessionstart(session: pytest.Session) -> None:
    if runs_tests(session.config):
        PROCESSES.start()


def pytest_runtest_logfinish(nodeid: str) -> None:
    PROCESSES.note(nodeid)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A process the run started and left running is killed, and fails the run."""
    config = session.config
    if runs_tests(config):
        config.stash[LEFT_RUNNING] = PROCESSES.finish()
        workeroutput = getattr(config, "workeroutput", None)
        if workeroutput is not None:  # told to the process that started this worker
            workeroutput[LEFT_RUNNING_KEY] = config.stash[LEFT_RUNNING]
    if config.stash.get(LEFT_RUNNING, []):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On several workers, the long files first (those with a test marked slow, and Spark's):
    a file goes whole to one worker, so a long one handed out last would keep one worker
    busy while the others have nothing left to do."""
    if runs_tests(config) and not hasattr(config, "workerinput"):
        return  # one process: the files in their own order

    def long(item: pytest.Item) -> bool:
        return item.get_closest_marker("slow") is not None or item.path.parent.name == "spark"

    long_files = {item.path for item in items if long(item)}
    items.sort(key=lambda item: item.path not in long_files)  # stable: the rest keep their order


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """A worker ended (pytest-xdist): what its net killed fails the whole run."""
    left = getattr(node, "workeroutput", {}).get(LEFT_RUNNING_KEY, [])
    node.config.stash.setdefault(LEFT_RUNNING, []).extend(left)


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    left = config.stash.get(LEFT_RUNNING, [])
    if left:
        terminalreporter.section("processes left running (now killed)", red=True)
        for line in left:
            terminalreporter.line(line, red=True)


@pytest.fixture
def make_broker() -> Iterator[BrokerFactory]:
    """Start brokers with the given properties (Open MQ names); all are stopped after the test."""
    started: list[BrokerThread] = []

    def make(properties: Mapping[str, str] | None = None) -> BrokerThread:
        broker = BrokerThread(properties)
        broker.start()
        started.append(broker)
        return broker

    yield make
    for broker in started:
        broker.stop()


@pytest.fixture
def broker(make_broker: BrokerFactory) -> BrokerThread:
    return make_broker()


_DATABASES = itertools.count(1)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the run, started by the first test that needs it."""
    try:
        find_bin()
    except PostgresMissing as missing:
        pytest.skip(str(missing))
    with postgres_server() as server:
        yield server


@pytest.fixture
def pg_url(postgres: PostgresServer) -> str:
    """The URL of a new, empty database of its own for the test."""
    return postgres.create_database(f"test_{next(_DATABASES)}")
