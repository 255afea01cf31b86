"""Fixtures: the broker core's (a fake clock, brokers, a swap area), for the tests that keep a
broker in a journal."""

from __future__ import annotations

from tests.core.conftest import broker, clock, make_broker, swap, swap_dir

__all__ = ["broker", "clock", "make_broker", "swap", "swap_dir"]
