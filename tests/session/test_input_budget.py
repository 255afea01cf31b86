"""The input budget's arithmetic: the charge per connection and for the broker, what a transport
holds before CONNECT, and the errors that name the limit. (Over sockets: tests/server.)"""

from __future__ import annotations

from sluiceway.config import build_config
from sluiceway.core.values.memory import LevelPolicy, MemoryLedger
from sluiceway.errors import FrameLimitExceeded
from sluiceway.session.input_budget import InputBudget, frame_limit_error

KIB = 1024


def budget_of(ledger: MemoryLedger, **properties: str) -> InputBudget:
    return InputBudget(ledger, build_config(properties))


def test_a_connection_is_charged_its_growth_and_refused_past_its_limit() -> None:
    ledger = MemoryLedger()
    budget = budget_of(ledger, **{"imq.stomp.input.max_bytes": "1000"})
    assert budget.charge(600) is None
    assert ledger.input == ledger.total == 600
    assert budget.charge(200) is None  # a frame was completed: the charge shrinks
    assert ledger.input == 200
    error = budget.charge(1001)
    assert error is not None
    assert (error.status, error.limit, error.limit_value) == (
        423,
        "imq.stomp.input.max_bytes",
        "1000",
    )
    assert "holds 1001 bytes" in str(error)
    budget.release()
    assert ledger.input == 0


def test_the_connection_that_takes_the_broker_past_its_total_is_refused() -> None:
    ledger = MemoryLedger()
    ledger.policy = LevelPolicy(input_max=1000)
    unlimited = {"imq.stomp.input.max_bytes": "0"}
    first, second = budget_of(ledger, **unlimited), budget_of(ledger, **unlimited)
    assert first.charge(700) is None
    error = second.charge(400)
    assert error is not None
    assert (error.status, error.limit) == (414, "imq.stomp.input.total.max_bytes")
    assert "all connections together hold 1100 bytes" in str(error)
    assert first.charge(650) is None  # shrinking never refuses, even past the total


def test_what_the_transport_holds_counts_and_is_bounded_before_connect() -> None:
    ledger = MemoryLedger()
    budget = budget_of(ledger)  # 8 KiB before CONNECT, 16 MiB after
    budget.below = 8 * KIB + 1024  # a WebSocket message being assembled, and its framing
    assert budget.check(100, connected=False) is None
    assert ledger.input == 8 * KIB + 1124
    budget.below = 8 * KIB + 1025
    error = budget.check(100, connected=False)
    assert error is not None
    assert (error.status, error.limit, error.limit_value) == (
        423,
        "imq.stomp.connect.max_frame_size",
        "8192",
    )
    assert "a message of at least 9217 bytes arrived before a CONNECT was accepted" in str(error)
    assert budget.check(100, connected=True) is None  # after CONNECT: the budget's 16 MiB


def test_an_ending_connection_may_send_once_more_what_it_may_hold() -> None:
    ledger = MemoryLedger()
    budget = budget_of(ledger, **{"imq.stomp.input.max_bytes": "1000"})
    budget.below = 900
    assert budget.check(0, connected=True) is None
    budget.end(connected=True)
    assert ledger.input == 0  # given back at once
    budget.below = 1900
    assert not budget.past_allowance
    budget.below = 1901
    assert budget.past_allowance


def test_a_frame_too_large_before_connect_says_why() -> None:
    error = frame_limit_error(
        FrameLimitExceeded(
            "frame of 9000 bytes ...", limit="imq.stomp.connect.max_frame_size", value=8192
        )
    )
    assert error.status == 423
    assert error.summary == "frame too large before CONNECT (imq.stomp.connect.max_frame_size)"
    assert "send CONNECT first, or raise imq.stomp.connect.max_frame_size" in str(error)
    plain = frame_limit_error(
        FrameLimitExceeded("header line ...", limit="imq.stomp.max_header_length", value=8192)
    )
    assert (plain.status, plain.summary, plain.limit) == (
        400,
        "frame limit exceeded",
        "imq.stomp.max_header_length",
    )
