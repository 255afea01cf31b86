"""benchmarks/compare.py's arithmetic: medians, ratios to the best peer in the same run, and the
table it writes into benchmarks/README.md. (Running the peers needs their OS packages; the
comparison itself is run by hand: `./dev bench compare`.)"""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.cli.support import free_port

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "compare.py"


@pytest.fixture(scope="module")
def compare() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("compare", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["compare"] = module  # dataclasses look their module up while being made
    spec.loader.exec_module(module)
    yield module
    del sys.modules["compare"]


def measured(
    compare: ModuleType, scenario: str, figures: dict[str, dict[str, list[float]]]
) -> list[Any]:
    """Measurements of `scenario`: per broker, each figure's value in run 1, 2, ..."""
    found = []
    for broker, by_key in figures.items():
        count = len(next(iter(by_key.values())))
        for run in range(1, count + 1):
            values = {key: runs[run - 1] for key, runs in by_key.items()}
            found.append(compare.Measurement(run, scenario, broker, values))
    return found


def test_ratios_are_to_the_best_peer_of_the_same_run(compare: ModuleType) -> None:
    key = "received_per_second"
    runs = measured(compare, "queue", {
        "sluiceway": {key: [300.0, 200.0, 400.0]},
        "rabbitmq": {key: [100.0, 200.0, 100.0]},
        "activemq": {key: [150.0, 50.0, 100.0]},
    })  # fmt: skip
    (row,) = compare.summarise(compare.SCENARIOS[0], runs)
    # Per run: 300/150, 200/200, 400/100 -> median 2.00; the median figure is 300.
    # RabbitMQ: 100/150, 200/200, 100/100 -> 1.00; ActiveMQ: 1, 50/200, 1 -> 1.00.
    # In square brackets, the lowest and highest of the runs; no relay in this scenario.
    assert "| 300 (2.00x) [200-400] | 100 (1.00x) [100-200] | 100 (1.00x) [50-150] | n/a |" in row
    assert row.endswith("| 2x best peer |")


def test_lower_is_better_figures_read_as_best_peer_over_figure(compare: ModuleType) -> None:
    latency = next(s for s in compare.SCENARIOS if s.key == "latency")
    runs = measured(compare, "latency", {
        "sluiceway": {"latency_p50": [0.5], "latency_p99": [0.8]},
        "rabbitmq": {"latency_p50": [1.0], "latency_p99": [1.6]},
        "activemq": {"latency_p50": [2.0], "latency_p99": [3.2]},
    })  # fmt: skip
    p50, p99 = compare.summarise(latency, runs)
    assert "| 0.50 (2.00x) | 1.00 (1.00x) | 2.00 (0.50x) | n/a |" in p50
    assert "| 0.80 (2.00x) |" in p99


def test_the_relay_is_a_column_of_its_own_held_to_the_best_peer(compare: ModuleType) -> None:
    scenario = next(s for s in compare.SCENARIOS if s.key == "large-64kib")
    key = "megabytes_per_second"
    runs = measured(compare, scenario.key, {
        "sluiceway": {key: [700.0], "received_per_second": [11_000.0]},
        "rabbitmq": {key: [350.0], "received_per_second": [5_500.0]},
        "activemq": {key: [300.0], "received_per_second": [4_800.0]},
        "relay": {key: [900.0], "received_per_second": [14_000.0]},
    })  # fmt: skip
    megabytes, _ = compare.summarise(scenario, runs)
    # The relay is no peer: Sluiceway's ratio is to RabbitMQ's 350, and the relay's too.
    assert "| 700 (2.00x) | 350 (1.00x) | 300 (0.86x) | 900 (2.57x) | 2x best peer |" in megabytes
    assert "relay.py" in compare.BROKERS["relay"].command(Path("unused"), ())[1]


def test_failed_runs_are_left_out_and_listed(compare: ModuleType) -> None:
    key = "received_per_second"
    runs = measured(compare, "queue", {
        "sluiceway": {key: [300.0, 1.0]},
        "rabbitmq": {key: [100.0, 100.0]},
        "activemq": {key: [100.0, 100.0]},
    })  # fmt: skip
    runs[1].error = "3 missing, 0 duplicated"
    text = compare.table(runs, 2)
    assert "| 300 (3.00x) | 100 (1.00x) [100-100] |" in text
    assert "- run 2, queue, sluiceway: 3 missing, 0 duplicated" in text


def test_the_table_replaces_only_what_is_between_the_markers(
    compare: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{compare.BEGIN}\nold table\n{compare.END}\nafter\n")
    monkeypatch.setattr(compare, "README", readme)
    compare.write_readme("new table\n")
    assert readme.read_text() == f"before\n{compare.BEGIN}\nnew table\n{compare.END}\nafter\n"


def test_a_taken_port_stops_the_run_instead_of_measuring_whoever_holds_it(
    compare: ModuleType,
) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        broker = compare.Broker("sluiceway", squatter.getsockname()[1], ("", ""))
        taken = pytest.raises(RuntimeError, match=f"already taken by process {os.getpid()}")
        with taken, compare.running(broker, ()):
            pytest.fail("the run went on")


def test_the_pid_measured_is_the_started_brokers(compare: ModuleType) -> None:
    broker = compare.Broker("sluiceway", free_port(), ("", ""))
    with compare.running(broker, ()) as pid:
        assert pid != 0
        assert pid != os.getpid()
        with socket.create_connection(("127.0.0.1", broker.port), timeout=5):
            pass
    assert compare.listening_pid(broker.port) == 0  # stopped with the run


def test_results_elsewhere_leave_compare_json_and_the_readme_alone(
    compare: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    key = "received_per_second"
    runs = measured(compare, "queue", {
        "sluiceway": {key: [300.0]}, "rabbitmq": {key: [100.0]}, "activemq": {key: [150.0]},
    })  # fmt: skip
    written: list[str] = []
    monkeypatch.setattr(compare, "write_readme", written.append)
    monkeypatch.setattr(compare, "RESULTS", tmp_path / "default.json")
    elsewhere = tmp_path / "confirm" / "figures.json"
    compare.publish(runs, 1, 1.0, elsewhere, readme=False)
    assert "| 300 (2.00x) |" in capsys.readouterr().out
    assert written == []
    assert not (tmp_path / "default.json").exists()
    monkeypatch.setattr(sys, "argv", ["compare.py", "--from-results", "--results", str(elsewhere)])
    compare.main()  # reads the figures back from where they went, and writes the table
    assert len(written) == 1
    assert "| 300 (2.00x) |" in written[0]
