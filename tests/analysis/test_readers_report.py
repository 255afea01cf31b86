"""Pipeline readers in the report, from hand-made results (no Spark): their section, their place
in summary.json, and the note of a destination that only they drained."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final

from sluiceway.analysis import report
from sluiceway.analysis.options import Options
from sluiceway.analysis.results import (
    Collected,
    ConsumerStats,
    DestinationStats,
    ReaderStats,
    Timeline,
)
from sluiceway.analysis.rules import RuleSettings, recommend, recommend_all
from sluiceway.analysis.summary import Analysis
from tests.analysis.test_rules import destination

T0: Final = 1_774_346_400_000
LEASED: Final = "/queue/<etl>"  # names are the user's: escaped in the page
QUIET: Final = "/queue/quiet"


def stats(name: str, max_readers: int) -> DestinationStats:
    return destination(destination=name, max_consumers=0, max_readers=max_readers)


def reader(group: str, lag: int) -> ReaderStats:
    return ReaderStats(
        destination=LEASED,
        kind="lease-group",
        group=group,
        present_s=30.0,
        lag_messages=lag,
        peak_lag_messages=lag + 20,
        lag_seconds=2.5,
        peak_lag_seconds=9.25,
        open_leases=1,
        last_seen_ms=T0 + 30_000,
    )


def analysis(readers: list[ReaderStats]) -> Analysis:
    collected = Collected(
        timeline=Timeline(T0, T0 + 30_000, 31, 1.0, 1),
        destinations=[stats(LEASED, len(readers)), stats(QUIET, 0)],
        destinations_left_off=0,
        series=[],
        consumers=[],
        consumers_left_off=0,
        distributions=[],
        episodes=[],
        episodes_left_off=0,
        shuffle_partitions=2,
        readers=readers,
        readers_left_off=0,
    )
    options = Options(history="/data/metrics", out="report")
    return Analysis(
        options=options,
        files=1,
        generated_ms=T0 + 60_000,
        collected=collected,
        recommendations=recommend_all(collected, 2.0, options.pool_size),
    )


def test_the_report_lists_the_readers_and_says_what_drained_a_destination(tmp_path: Path) -> None:
    page_path, summary_path = report.write(analysis([reader("etl", 7)]), tmp_path)
    page = page_path.read_text()
    assert "<h2>Pipeline readers</h2>" in page
    assert LEASED not in page
    row = (
        "<tr><td>/queue/&lt;etl&gt;</td><td>lease-group</td><td>etl</td>"
        '<td class="n">7</td><td class="n">27</td><td class="n">2.5</td><td class="n">9.2</td>'
        '<td class="n">1</td><td class="n">30</td><td>2026-03-24T10:00:30.000Z</td></tr>'
    )
    assert row in page
    summary = json.loads(summary_path.read_text())
    assert summary["readers"] == [
        {
            "destination": LEASED,
            "kind": "lease-group",
            "group": "etl",
            "present_s": 30.0,
            "lag_messages": 7,
            "peak_lag_messages": 27,
            "lag_seconds": 2.5,
            "peak_lag_seconds": 9.25,
            "open_leases": 1,
            "last_seen": "2026-03-24T10:00:30.000Z",
        }
    ]
    leased, quiet = summary["recommendations"]
    assert leased["note"].startswith("no STOMP consumers in the range analysed; drained by 1 ")
    assert "(lease-group etl)" in leased["note"]
    assert quiet["note"].startswith("no consumers in the range analysed")
    assert [d["max_pipeline_readers"] for d in summary["destinations"]] == [1, 0]


def test_without_readers_the_section_says_none(tmp_path: Path) -> None:
    page_path, _ = report.write(analysis([]), tmp_path)
    assert "None: no cursor group or lease group was seen." in page_path.read_text()


def test_a_note_names_a_few_readers_and_counts_the_others() -> None:
    readers = [reader(f"g{n}", n) for n in range(5)]
    with_consumer = ConsumerStats(
        destination=LEASED,
        connection=1,
        subscription="s",
        run=T0,
        ack="client",
        backup=False,
        window_limit=100,
        window_threshold=50,
        delivered=10,
        share=None,
        present_s=30.0,
        paused_s=0.0,
        pause_episodes=0,
        longest_pause_s=0.0,
        starved_s=0.0,
        max_outstanding=3,
    )
    advice = recommend(
        stats(LEASED, 5), [with_consumer], None, RuleSettings(), 1.0, readers=readers
    )
    assert advice.findings == ()
    assert "5 pipeline reader(s) (lease-group g0, lease-group g1, lease-group g2 and 2 more)" in (
        advice.note
    )
    assert advice.note.startswith("no rule fired (1 consumer(s), 5 pipeline reader(s)")
    # History written before readers were recorded names none, and counts what it can.
    older = recommend(stats(LEASED, 2), [], None, RuleSettings(), 1.0)
    assert "drained by 2 pipeline reader(s), which" in older.note
