"""The definition of a durable subscription, as a store keeps it across restarts."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DurableRecord:
    """A durable subscription's definition: what its topic needs to rebuild it after a restart
    (its id, its owner and name, its selector, and the first sequence number it reads)."""

    sub_id: int
    topic: str
    client_id: str
    name: str
    selector: str
    start_seq: int
