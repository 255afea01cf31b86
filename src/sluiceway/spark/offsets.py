"""Offsets (what Spark writes to its checkpoint) and input partitions (what read() is given).

An offset holds everything a replay needs to read the same messages again, because after a
crash Spark replays a batch from the offsets in its checkpoint alone, on a fresh reader:

- topic: `{"destination": "/topic/orders", "start": 1200, "sequence": 2200}`: the batch ending
  here read `[start, sequence)`; `sequence` is where the next one starts.
- queue: `{"destination": "/queue/orders", "lease": 4001, "leases": 1, "partitions": 2,
  "size": 500, "bytes": 0, "total": 1000}`: the batch ending here read leases
  `lease - leases + 1` to `lease` in each of `partitions` lease groups, each of at most `size`
  messages, and all of them together at most `total` messages and `bytes` bytes (0: no byte
  cap). The driver makes the leases, in order, each within what the ones before left of the
  batch's caps, before the tasks read them; a lease returns the same messages on every read, so
  the numbers and caps are enough. An offset without `total` (written before the driver made
  the leases) has each lease made by its first read, with at most `size` messages and `bytes`
  bytes.

A batch is planned from its end offset alone. When Spark replays batch 0 after a restart it asks
the new reader for the initial offset again, and a start computed anew (`latest` has moved, the
lease numbers follow the clock) must not change what the batch reads.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

from sluiceway.spark.errors import SchemaMismatch


def _field(offset: Mapping[str, object], name: str) -> int:
    value = offset.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SchemaMismatch(f"offset {dict(offset)} has no valid {name!r}: not a sluiceway offset")
    return value


def _check_destination(offset: Mapping[str, object], destination: str) -> None:
    found = offset.get("destination")
    if found != destination:
        raise SchemaMismatch(
            f"the checkpoint's offset is for {found!r}, but the query reads {destination!r}: "
            "a checkpoint belongs to one destination; use a new checkpoint location"
        )


@dataclass(frozen=True, slots=True)
class TopicOffset:
    destination: str
    start: int  # the first sequence number of the batch that ends here
    sequence: int  # the first sequence number not yet read

    def to_json(self) -> dict[str, object]:
        return {"destination": self.destination, "start": self.start, "sequence": self.sequence}

    @classmethod
    def parse(cls, offset: Mapping[str, object], destination: str) -> TopicOffset:
        _check_destination(offset, destination)
        return cls(destination, _field(offset, "start"), _field(offset, "sequence"))


@dataclass(frozen=True, slots=True)
class QueueOffset:
    destination: str
    lease: int  # the last lease number used, in every lease group
    leases: int  # leases per lease group in the batch that ends here (0: none)
    partitions: int  # lease groups of that batch
    size: int  # most messages per lease
    bytes: int  # most bytes of the batch (per lease when `total` is None; 0: no cap)
    total: int | None = None  # most messages of the batch; None: leases made by their reads

    def to_json(self) -> dict[str, object]:
        value: dict[str, object] = {
            "destination": self.destination,
            "lease": self.lease,
            "leases": self.leases,
            "partitions": self.partitions,
            "size": self.size,
            "bytes": self.bytes,
        }
        if self.total is not None:
            value["total"] = self.total
        return value

    @classmethod
    def parse(cls, offset: Mapping[str, object], destination: str) -> QueueOffset:
        _check_destination(offset, destination)
        return cls(
            destination,
            _field(offset, "lease"),
            _field(offset, "leases"),
            _field(offset, "partitions"),
            _field(offset, "size"),
            _field(offset, "bytes"),
            _field(offset, "total") if "total" in offset else None,
        )

    def lease_numbers(self) -> range:
        """The lease numbers the batch ending here used, in each lease group."""
        return range(self.lease - self.leases + 1, self.lease + 1)


def lease_group(group: str, partition: int) -> str:
    """Lease group of input partition `partition`: the group itself for the first, so a query
    with one partition names its leases `GROUP/N`, then `GROUP.1`, `GROUP.2`, ... Each input
    partition creates its leases in order in a group of its own, since the broker creates a
    lease only above every number its group used before, and parallel tasks have no order."""
    return group if partition == 0 else f"{group}.{partition}"


def lease_names(group: str, offset: QueueOffset) -> Iterator[str]:
    for partition in range(offset.partitions):
        for number in offset.lease_numbers():
            yield f"{lease_group(group, partition)}/{number}"


@dataclass(frozen=True)
class RangePartition(InputPartition):
    """Read `[start, end)` of a destination by sequence number."""

    destination: str
    start: int
    end: int


@dataclass(frozen=True)
class LeasePartition(InputPartition):
    """Read leases `first` to `last` of lease group `group`: made by the driver (`made`), or
    created by this read when new, with at most `size` messages and `bytes` bytes."""

    destination: str
    group: str
    first: int
    last: int
    size: int
    bytes: int
    made: bool = False


def split_range(destination: str, start: int, end: int, parts: int) -> list[RangePartition]:
    """`[start, end)` cut into at most `parts` contiguous ranges of near-equal width."""
    width = end - start
    if width <= 0:
        return []
    parts = max(1, min(parts, width))
    bounds = [start + width * i // parts for i in range(parts + 1)]
    return [RangePartition(destination, bounds[i], bounds[i + 1]) for i in range(parts)]
