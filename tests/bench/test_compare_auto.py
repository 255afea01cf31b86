"""benchmarks/compare.py's adaptive-window scenarios: their command lines, the figures and targets
their rows show, and `--merge` over results saved before those figures existed (fake
measurements, no broker)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.bench.test_compare import compare, measured

__all__ = ["compare"]  # the module's fixture, used here too

FAIRNESS = ("--delays", "5,1,1,1", "--messages", "8000")
FAIR = "imq.autocreate.queue.dispatchPolicy=fair"


def scenario(compare: ModuleType, key: str) -> Any:
    return next(s for s in compare.SCENARIOS if s.key == key)


def test_the_adaptive_scenarios_run_sluiceway_alone_with_prefetch_auto(
    compare: ModuleType,
) -> None:
    auto = scenario(compare, "fairness-auto")
    assert auto.bench == ("fairness", *FAIRNESS, "--prefetch", "auto")
    assert (auto.brokers, auto.peers_from, auto.properties) == (("sluiceway",), "fairness", ())
    assert scenario(compare, "fairness-auto-fair").properties == (FAIR,)
    queue = scenario(compare, "queue-auto")
    assert queue.bench == (
        "queue", "--messages", "100000", "--ack", "client-individual", "--prefetch", "auto",
    )  # fmt: skip
    assert (queue.brokers, queue.peers_from) == (("sluiceway",), "queue")
    for key in ("fairness", "fairness-fair", "fairness-1", "fairness-auto"):
        keys = [f.key for f in scenario(compare, key).figures]
        assert "max_held" in keys
        assert "max_idle_while_held" in keys


def test_each_target_stands_beside_the_figure_it_is_about(compare: ModuleType) -> None:
    auto = scenario(compare, "fairness-auto")
    runs = measured(compare, "fairness-auto", {
        "sluiceway": {
            "finish_seconds": [3.0], "max_idle_seconds": [0.2], "max_idle_while_held": [0.05],
            "max_held": [12.0], "received_per_second": [2666.0],
        },
    })  # fmt: skip
    rows = dict(zip([f.key for f in auto.figures], compare.summarise(auto, runs), strict=True))
    assert rows["finish_seconds"].endswith("| finish <= fairness-fair (fair, prefetch 1000) |")
    assert rows["max_idle_while_held"].endswith("| <= 0.3 s |")
    assert rows["max_held"].endswith("| >= 5x fewer than fairness (prefetch 1000) |")
    assert rows["max_idle_seconds"].endswith("|  |")
    assert "| 12 |" in rows["max_held"]  # a count of messages: no decimals
    queue = scenario(compare, "queue-auto")
    (row,) = compare.summarise(queue, measured(compare, "queue-auto", {
        "sluiceway": {"received_per_second": [50_000.0]},
    }))  # fmt: skip
    assert row.endswith("| >= 0.95x queue (prefetch 1000) |")


def test_figures_of_a_bench_result_and_the_ones_it_lacks(compare: ModuleType) -> None:
    result: dict[str, Any] = {"max_held": 999, "max_idle_while_others_held": None, "consumers": []}
    assert compare.figure_value(result, "max_held") == 999.0
    assert compare.figure_value(result, "max_idle_while_held") is None
    assert compare.figure_value({"max_idle_while_others_held": 0.25}, "max_idle_while_held") == (
        0.25
    )


def test_merge_keeps_older_rows_and_says_which_figures_they_did_not_measure(
    compare: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    # Saved before the held figures existed: fairness-1 kept, queue measured again.
    old = measured(compare, "fairness-1", {
        name: {"finish_seconds": [3.5], "max_idle_seconds": [0.7], "received_per_second": [2.3e3]}
        for name in ("sluiceway", "rabbitmq", "activemq")
    }) + measured(compare, "queue", {"sluiceway": {"received_per_second": [1.0]}})  # fmt: skip
    results = tmp_path / "compare.json"
    saved = {"runs": 1, "scale": 1.0, "measurements": [m.__dict__ for m in old]}
    results.write_text(json.dumps(saved))
    asked: list[str] = []

    def fake_run_all(chosen: list[Any], brokers: list[str], runs: int, scale: float) -> Any:
        asked.extend(s.key for s in chosen)
        return measured(compare, "queue", {"sluiceway": {"received_per_second": [50_000.0]}})

    monkeypatch.setattr(compare, "run_all", fake_run_all)
    names = "fairness,fairness-fair,fairness-auto,fairness-auto-fair,queue,queue-auto"
    argv = ["compare.py", "--merge", "--scenarios", names, "--runs", "1", "--no-readme"]
    monkeypatch.setattr(sys, "argv", [*argv, "--results", str(results)])
    compare.main()
    assert asked == ["queue", "queue-auto", "fairness", "fairness-fair", "fairness-auto",
                     "fairness-auto-fair"]  # fmt: skip
    text = capsys.readouterr().out
    kept = json.loads(results.read_text())["measurements"]
    assert [(m["scenario"], m["broker"]) for m in kept][:3] == [
        ("fairness-1", "sluiceway"), ("fairness-1", "rabbitmq"), ("fairness-1", "activemq"),
    ]  # fmt: skip
    assert len(kept) == 4  # the old queue run was replaced by the new one
    held = next(
        line for line in text.splitlines() if "prefetch 1, default dispatch: most held" in line
    )
    assert "| not measured | not measured | not measured | n/a |" in held
    assert "| 50,000 |" in text


def test_an_unknown_scenario_is_refused_by_name(
    compare: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["compare.py", "--scenarios", "queue,fairnes", "--no-readme"])
    with pytest.raises(SystemExit, match="no scenario fairnes; the scenarios are queue, "):
        compare.main()


def test_a_figure_of_nothing_gets_no_ratio(compare: ModuleType) -> None:
    one = scenario(compare, "fairness-1")
    runs = measured(compare, "fairness-1", {
        name: {"max_idle_while_held": [0.0]} for name in ("sluiceway", "rabbitmq", "activemq")
    })  # fmt: skip
    row = next(r for r in compare.summarise(one, runs) if "while another held" in r)
    assert "| 0.00 | 0.00 | 0.00 | n/a |" in row
