"""`--prefetch auto`: how the option is read and checked, what the SUBSCRIBE carries, and the
figures a report draws from what the consumers held and when they idled (fake results, no
broker; test_auto_scenarios.py runs it against one)."""

from __future__ import annotations

import argparse

import pytest

from sluiceway.bench import command
from sluiceway.bench.accounting import Spells
from sluiceway.bench.report import build_report, render_table
from sluiceway.bench.runner import Outcome, Scenario, Settings
from sluiceway.bench.workers import (
    AUTO_PREFETCH_CAP,
    PREFETCH_AUTO,
    ConsumerResult,
    ConsumerSpec,
    ProducerResult,
    Target,
    subscribe_headers,
)

pytestmark = pytest.mark.timeout(30)
MS = 1_000_000


def parse(*args: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", *args])


def test_auto_is_read_in_any_case_and_numbers_as_before() -> None:
    assert command.settings_from(parse("queue", "--prefetch", "auto")).prefetch == PREFETCH_AUTO
    assert command.settings_from(parse("queue", "--prefetch", "AUTO")).prefetch == PREFETCH_AUTO
    assert command.settings_from(parse("queue", "--prefetch", "250")).prefetch == 250
    assert command.settings_from(parse("queue")).prefetch == 0


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--prefetch", "lots"], "--prefetch 'lots': give a number of messages"),
        (["--prefetch", "-3"], "--prefetch cannot be negative"),
        (
            ["--ack", "client", "--prefetch", "auto", "--ack-every", str(AUTO_PREFETCH_CAP + 1)],
            f"is more than auto's cap of {AUTO_PREFETCH_CAP}",
        ),
    ],
)
def test_a_prefetch_that_cannot_work_is_refused(args: list[str], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        command.settings_from(parse("queue", *args))


def test_an_ack_every_within_autos_cap_is_taken() -> None:
    found = parse("queue", "--ack", "client", "--prefetch", "auto", "--ack-every", "1000")
    settings = command.settings_from(found)
    assert (settings.prefetch, settings.ack_every) == (PREFETCH_AUTO, 1000)


def spec(prefetch: int) -> ConsumerSpec:
    return ConsumerSpec(Target("127.0.0.1", 1), 0, "/queue/q", (1,), "client", prefetch, 0.0, 0)


def test_auto_is_asked_under_sluiceways_header_alone() -> None:
    headers = subscribe_headers(spec(PREFETCH_AUTO))
    assert headers["consumer-flow-limit"] == "auto"
    # ActiveMQ's and RabbitMQ's headers take numbers: with auto they keep their defaults.
    assert "activemq.prefetchSize" not in headers
    assert "prefetch-count" not in headers
    numbered = subscribe_headers(spec(300))
    assert [numbered[h] for h in ("activemq.prefetchSize", "prefetch-count")] == ["300", "300"]
    assert numbered["consumer-flow-limit"] == "300"
    assert "consumer-flow-limit" not in subscribe_headers(spec(0))


def spells(*pairs: tuple[int, int]) -> Spells:
    found = Spells()
    for start, end in pairs:
        found.add(start * MS, end * MS)
    return found


def fairness_outcome() -> Outcome:
    """Two consumers: the slow one (0) holds unstarted messages from 100 to 900 ms while the
    fast one (1) idles from 500 ms to the end; the run spans 0 to 1,000 ms."""
    settings = Settings(
        Scenario.FAIRNESS, Target("127.0.0.1", 1), "/queue/q", 4, consumers=2,
        ack="client-individual", prefetch=PREFETCH_AUTO, delays_ms=(5.0, 1.0),
    )  # fmt: skip
    found = Outcome(settings, start_ns=1, end_ns=1000 * MS)
    found.producers.append(ProducerResult(0, sent=4))
    found.consumers += [
        ConsumerResult(
            0, received=2, bitmaps=[b"\x03"], held_peak=7, window_auto=True,
            idle_spells=spells((0, 50)), waiting_spells=spells((100, 900)),
        ),
        ConsumerResult(
            1, received=2, bitmaps=[b"\x0c"], held_peak=3, window_auto=True,
            idle_spells=spells((0, 20), (500, 1200)), waiting_spells=Spells(),
        ),
    ]  # fmt: skip
    return found


def test_the_report_gives_what_each_consumer_held_and_idled_while_others_held() -> None:
    report = build_report(fairness_outcome())
    slow, fast = report.consumers
    assert (slow.held_peak, fast.held_peak, report.max_held) == (7, 3, 7)
    # The fast one idled 500..1000 (the run's end), the slow one held from 100 to 900.
    assert fast.idle_while_others_held == 0.4
    assert slow.idle_while_others_held == 0.0
    assert report.max_idle_while_others_held == 0.4
    assert slow.window_auto
    table = render_table(report)
    assert "held at most 7 messages unacknowledged" in table
    assert "(0.40 s while another held unstarted ones), held 3, 1 ms each, adaptive window" in (
        table
    )
    assert '"max_idle_while_others_held": 0.4' in report.to_json()


def test_without_spells_the_figure_is_left_out_rather_than_zero() -> None:
    found = fairness_outcome()
    for consumer in found.consumers:
        consumer.idle_spells = consumer.waiting_spells = None
    report = build_report(found)
    assert report.max_idle_while_others_held is None
    assert all(c.idle_while_others_held is None for c in report.consumers)
    assert "while another held" not in render_table(report)
