"""Offsets (what Spark writes to its checkpoint) and input partitions (what read() is given).

An offset holds everything a replay needs to read the same messages again, because after a
crash Spark replays a batch from the offsets in its checkpoint alone, on a fresh reader. It is
keyed by destination: a source reads one or several destinations (a list, or a pattern
resolved at each trigger), and each has its own position.

- topic: `{"destinations": {"/topic/orders": {"start": 1200, "sequence": 2200}, ...}}`: the
  batch ending here read `[start, sequence)` of each topic; `sequence` is where its next batch
  starts.
- queue: `{"destinations": {"/queue/orders": {"lease": 4001, "leases": 1, "partitions": 2,
  "size": 500, "total": 1000}, ...}, "bytes": 0, "turn": 7}`: the batch ending here read, of
  each queue, leases `lease - leases + 1` to `lease` in each of `partitions` lease groups, each
  of at most `size` messages, and all of them together at most `total` messages; all the
  batch's leases together at most `bytes` bytes (0: no byte cap). The driver makes the leases,
  queue after queue in the order `turn` gives (sharing.rotated), each within what the ones
  before left of the batch's caps, before the tasks read them; a lease returns the same
  messages on every read, so the numbers and caps are enough. A queue without `total` (a
  broker that predates making leases for the driver) has each lease made by its first read,
  with at most `size` messages and `bytes` bytes.

Offsets written before sources read several destinations hold one destination, flat:
`{"destination": "/topic/orders", "start": 1200, "sequence": 2200}`, and for a queue
`{"destination": "/queue/orders", "lease": ..., "bytes": 0, "total": 1000}`. They are read as
offsets of that one destination, so a query goes on from an older checkpoint.

A batch is planned from its end offset alone. When Spark replays batch 0 after a restart it asks
the new reader for the initial offset again, and a start computed anew (`latest` has moved, the
lease numbers follow the clock) must not change what the batch reads.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from pyspark.sql.datasource import InputPartition

from sluiceway.spark.errors import SchemaMismatch


def _field(offset: Mapping[str, object], name: str) -> int:
    value = offset.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SchemaMismatch(f"offset {dict(offset)} has no valid {name!r}: not a sluiceway offset")
    return value


def _entries(offset: Mapping[str, object]) -> Iterator[tuple[str, Mapping[str, object]]]:
    """Each destination of an offset with its own fields: of `destinations`, or of an offset of
    one destination written before sources read several (`destination` and its fields)."""
    entries = offset.get("destinations")
    if isinstance(entries, Mapping):
        for destination, entry in entries.items():
            if not isinstance(entry, Mapping):
                raise SchemaMismatch(f"offset {dict(offset)} is not a sluiceway offset")
            yield str(destination), entry
    elif isinstance(offset.get("destination"), str):
        yield str(offset["destination"]), offset
    else:
        raise SchemaMismatch(
            f"offset {dict(offset)} names no destination: not a sluiceway offset (a checkpoint "
            "belongs to one source; use a new checkpoint location)"
        )


def _entry(offset: Mapping[str, object], destination: str) -> Mapping[str, object]:
    for name, entry in _entries(offset):
        if name == destination:
            return entry
    raise SchemaMismatch(
        f"the offset {dict(offset)} has no position for {destination!r}: the batch did not read "
        "it (a checkpoint belongs to its source's destinations)"
    )


@dataclass(frozen=True, slots=True)
class TopicOffset:
    """One topic's part of a batch."""

    destination: str
    start: int  # the first sequence number of the batch that ends here
    sequence: int  # the first sequence number not yet read

    @property
    def width(self) -> int:
        return max(0, self.sequence - self.start)

    def entry(self) -> dict[str, object]:
        return {"start": self.start, "sequence": self.sequence}

    @classmethod
    def of(cls, destination: str, entry: Mapping[str, object]) -> TopicOffset:
        return cls(destination, _field(entry, "start"), _field(entry, "sequence"))

    @classmethod
    def parse(cls, offset: Mapping[str, object], destination: str) -> TopicOffset:
        """`destination`'s part of `offset` (either form)."""
        return cls.of(destination, _entry(offset, destination))


@dataclass(frozen=True, slots=True)
class TopicBatch:
    """A topic source's offset: each topic's part, by destination."""

    entries: dict[str, TopicOffset] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {"destinations": {name: e.entry() for name, e in self.entries.items()}}

    @classmethod
    def parse(cls, offset: Mapping[str, object]) -> TopicBatch:
        return cls({name: TopicOffset.of(name, entry) for name, entry in _entries(offset)})


@dataclass(frozen=True, slots=True)
class QueueOffset:
    """One queue's part of a batch; `bytes` is the batch's (per lease when `total` is None)."""

    destination: str
    lease: int  # the last lease number used, in every lease group
    leases: int  # leases per lease group in the batch that ends here (0: none)
    partitions: int  # lease groups of that batch
    size: int  # most messages per lease
    bytes: int  # most bytes of the batch (per lease when `total` is None; 0: no cap)
    total: int | None = None  # most messages of the batch; None: leases made by their reads

    def entry(self) -> dict[str, object]:
        value: dict[str, object] = {
            "lease": self.lease,
            "leases": self.leases,
            "partitions": self.partitions,
            "size": self.size,
        }
        if self.total is not None:
            value["total"] = self.total
        return value

    @classmethod
    def of(cls, destination: str, entry: Mapping[str, object], size: int) -> QueueOffset:
        return cls(
            destination,
            _field(entry, "lease"),
            _field(entry, "leases"),
            _field(entry, "partitions"),
            _field(entry, "size"),
            size,
            _field(entry, "total") if "total" in entry else None,
        )

    @classmethod
    def parse(cls, offset: Mapping[str, object], destination: str) -> QueueOffset:
        """`destination`'s part of `offset` (either form)."""
        return cls.of(destination, _entry(offset, destination), _field(offset, "bytes"))

    def lease_numbers(self) -> range:
        """The lease numbers the batch ending here used, in each lease group."""
        return range(self.lease - self.leases + 1, self.lease + 1)


@dataclass(frozen=True, slots=True)
class QueueBatch:
    """A queue source's offset: each queue's part, the batch's byte cap (0: none) and the turn
    that orders its queues when the driver makes their leases."""

    entries: dict[str, QueueOffset] = field(default_factory=dict)
    bytes: int = 0
    turn: int = 0

    def to_json(self) -> dict[str, object]:
        entries = {name: e.entry() for name, e in self.entries.items()}
        return {"destinations": entries, "bytes": self.bytes, "turn": self.turn}

    @classmethod
    def parse(cls, offset: Mapping[str, object]) -> QueueBatch:
        size = _field(offset, "bytes")
        turn = _field(offset, "turn") if "turn" in offset else 0
        entries = {name: QueueOffset.of(name, entry, size) for name, entry in _entries(offset)}
        return cls(entries, size, turn)

    @property
    def made(self) -> bool:
        """The driver makes this batch's leases (else each is made by its first read)."""
        return any(entry.total is not None for entry in self.entries.values())

    def leased(self) -> list[QueueOffset]:
        """The parts that have leases in this batch, by destination name."""
        return [self.entries[name] for name in sorted(self.entries) if self.entries[name].leases]


def lease_group(group: str, partition: int) -> str:
    """Lease group of input partition `partition`: the group itself for the first, so a query
    with one partition names its leases `GROUP/N`, then `GROUP.1`, `GROUP.2`, ... Each input
    partition creates its leases in order in a group of its own, since the broker creates a
    lease only above every number its group used before, and parallel tasks have no order.
    Groups are per queue on the broker: every queue of a source has its own."""
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
