"""The retry policy of refused sends, shared by the asyncio producer and the pipeline client.

A plain value, safe to pickle: the Spark connector ships it to its executors.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluiceway.errors import BrokerError, ResourceFull


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Pause and retry a refused send, as Open MQ's tuning guide advises, until `deadline`."""

    pause: float = 0.5  # seconds before the first retry
    backoff: float = 2.0  # each pause is this much longer than the last...
    max_pause: float = 5.0  # ...up to this
    deadline: float = 30.0  # seconds after the first attempt when the send gives up
    retry_on: tuple[type[BrokerError], ...] = (ResourceFull,)
