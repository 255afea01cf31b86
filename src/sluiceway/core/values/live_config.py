"""The broker's configuration as it stands now, shared by every component of one broker.

`update bkr` replaces the configuration while the broker runs. Rather than each component keeping
the values it was built with, every component holds the same `LiveConfig` and reads `current`
when it needs a setting, so a change reaches all of them at once and none can be left behind.
"""

from __future__ import annotations

from sluiceway.config import BrokerConfig


class LiveConfig:
    """A holder of the current (frozen, validated) `BrokerConfig`; only the broker replaces it."""

    __slots__ = ("current",)

    def __init__(self, config: BrokerConfig) -> None:
        self.current = config
