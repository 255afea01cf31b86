"""benchmarks/compare.py marks the figures measured while a load process was saturated, for
every broker, and says which runs in a footnote (fake bench results, no broker)."""

from __future__ import annotations

from types import ModuleType

from tests.bench.test_compare import compare, measured

__all__ = ["compare"]  # the module's fixture, used here too

KEY = "received_per_second"


def process(name: str, share: float) -> dict[str, object]:
    """One entry of the `processes` list of `sluiceway bench --json`."""
    return {"process": name, "pid": 1, "cpu_seconds": share, "seconds": 1.0, "share": share}


def test_the_processes_above_80_percent_are_taken_from_a_bench_result(
    compare: ModuleType,
) -> None:
    result = {"processes": [process("producer 0", 0.83), process("consumer 0", 0.8)]}
    assert compare.busy_processes(result) == ["producer 0 83%"]
    assert compare.busy_processes({}) == []  # a result written before the figures existed


def test_a_figure_measured_by_a_saturated_generator_is_marked_for_any_broker(
    compare: ModuleType,
) -> None:
    runs = measured(compare, "queue", {
        "sluiceway": {KEY: [300.0, 200.0]},
        "rabbitmq": {KEY: [100.0, 100.0]},
        "activemq": {KEY: [100.0, 100.0]},
    })  # fmt: skip
    by = {(m.broker, m.run): m for m in runs}
    by["rabbitmq", 2].saturated = ["consumer 0 93%"]
    (row,) = compare.summarise(compare.SCENARIOS[0], runs)
    assert "| 250 (2.50x) [200-300] | 100* (1.00x) [100-100] | 100 (1.00x) [100-100] |" in row
    text = compare.table(runs, 2)
    assert "Figures marked * were measured while a process of the load generator used more " in (
        text
    )
    assert "- run 2, queue, rabbitmq: consumer 0 93%" in text
    by["rabbitmq", 2].saturated = []
    assert "*" not in compare.table(runs, 2)


def test_saturation_is_kept_in_the_saved_results(compare: ModuleType) -> None:
    (m,) = measured(compare, "queue", {"sluiceway": {KEY: [1.0]}})
    m.saturated = ["producer 0 90%"]
    assert compare.Measurement(**m.__dict__).saturated == ["producer 0 90%"]
