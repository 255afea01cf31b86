"""What a broker must hold after a restart, worked out from what its clients were told.

The ledger follows a history from the clients' side. Every frame that may change what the broker
keeps is an `Op`: handled (the broker took it whole), confirmed (its RECEIPT came), or refused
(an ERROR). Every place a message may be kept is a `Slot`: a message in a queue, or a topic
message kept for one durable subscription. A slot exists once all the ops that make it took
effect (its SEND, or its transaction's COMMIT, and for a durable's copy the SUBSCRIBE that
created the durable) and until any op that takes it took effect (an ACK, a COMMIT that
acknowledged it, an auto-acknowledged delivery, the removal of its durable subscription).

Whether an op took effect after a restart depends on how the broker stopped:

- `CLEAN` (stopped) and `PROCESS` (killed between two operations): every handled op did.
- `PROCESS` in the middle of an operation: that operation may or may not have.
- `POWER` (power cut): under the `always` and `group` sync policies every confirmed op did and
  the others may or may not have; under `os`, any op may or may not have.

A refused op never did. From those, each slot must exist (`YES`), must not (`NO`) or may
(`MAYBE`); a message that may expire is `MAYBE` whatever else (it may have been swept to the dead
message queue). `check` compares that with what the restarted broker holds, and then the ledger
starts again from what it found.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field


class Stop(enum.Enum):
    CLEAN = "clean"
    PROCESS = "process"
    POWER = "power"


class Tri(enum.Enum):
    NO = 0
    MAYBE = 1
    YES = 2


def all_of(values: Iterable[Tri]) -> Tri:
    return min(values, key=lambda value: value.value, default=Tri.YES)


def any_of(values: Iterable[Tri]) -> Tri:
    return max(values, key=lambda value: value.value, default=Tri.NO)


@dataclass(eq=False)
class Op:
    """A frame that may change what the broker keeps."""

    what: str
    handled: bool = False
    confirmed: bool = False
    refused: bool = False
    # A SEND the broker may hold (waiting for the disk): a later frame's RECEIPT does not answer
    # for it, only its own (or its refusal) does.
    holdable: bool = False

    def effect(self, stop: Stop, policy: str) -> Tri:
        if self.refused:
            return Tri.NO
        if stop is Stop.POWER:
            return Tri.YES if self.confirmed and policy != "os" else Tri.MAYBE
        return Tri.YES if self.handled else Tri.MAYBE


KEPT = Op("kept since the last restart", handled=True, confirmed=True)


@dataclass(eq=False)
class Message:
    body: bytes
    destination: str
    persistent: bool
    priority: int
    expiring: bool


@dataclass(eq=False)
class Slot:
    """One place a message may be kept: its queue, or one durable subscription."""

    message: Message
    where: str  # a queue's destination, or a durable subscription's key
    made_by: list[Op]  # all of them must take effect
    taken_by: list[Op] = field(default_factory=list)  # any one of them removes it
    delivered: bool = False  # some client received it (so it comes back redelivered)
    born: int = 0  # the number of restarts before it was made

    def expected(self, stop: Stop, policy: str) -> Tri:
        if not self.message.persistent:
            return Tri.NO  # nothing non-persistent outlives the process
        made = all_of(op.effect(stop, policy) for op in self.made_by)
        taken = any_of(op.effect(stop, policy) for op in self.taken_by)
        if made is Tri.NO or taken is Tri.YES:
            return Tri.NO
        if made is Tri.YES and taken is Tri.NO and not self.message.expiring:
            return Tri.YES
        return Tri.MAYBE


@dataclass(frozen=True)
class Seen:
    """A message a restarted broker holds, as a client sees it."""

    body: bytes
    redelivered: bool
    priority: int
    sequence: int


@dataclass
class Ledger:
    policy: str
    slots: dict[tuple[str, bytes], Slot] = field(default_factory=dict)  # by (where, body)
    messages: dict[bytes, Message] = field(default_factory=dict)
    # Every message ever kept in each place: under `os`, a power cut may bring back one whose
    # removal had not reached the disk, however long ago (its segment never fsynced since).
    history: dict[str, set[bytes]] = field(default_factory=dict)
    # Transactions whose COMMIT was sent: their sends and acknowledgements, which must take
    # effect together or not at all.
    commits: list[tuple[Op, list[Slot], list[Slot]]] = field(default_factory=list)

    def add(self, slot: Slot) -> Slot:
        key = (slot.where, slot.message.body)
        assert key not in self.slots, key
        self.slots[key] = slot
        self.history.setdefault(slot.where, set()).add(slot.message.body)
        return slot

    def slot(self, where: str, body: bytes) -> Slot:
        return self.slots[(where, body)]

    def places(self) -> set[str]:
        return {slot.where for slot in self.slots.values()}

    def check(
        self,
        stop: Stop,
        found: dict[str, list[Seen]],
        dead: list[Seen],
        why: str,
    ) -> list[str]:
        """What is wrong with what the broker holds (`found`: per place, in delivery order;
        `dead`: the dead message queue) after a stop; empty when nothing is. Then the ledger
        takes what was found as the new truth."""
        problems: list[str] = []
        for where, seen in found.items():
            problems += self._check_place(stop, where, seen)
        problems += self._check_dead(dead, found)
        problems += self._check_commits(stop, found)
        self._rebase(stop, found)
        return [f"{why}: {problem}" for problem in problems]

    def _check_place(self, stop: Stop, where: str, seen: list[Seen]) -> list[str]:
        problems = []
        bodies = [s.body for s in seen]
        if len(bodies) != len(set(bodies)):
            twice = sorted({b for b in bodies if bodies.count(b) > 1})
            problems.append(f"{where} holds {twice[:5]} more than once")
        order = sorted(seen, key=lambda s: (-s.priority, s.sequence))
        if where.startswith("/queue/") and order != seen:
            problems.append(f"{where} is not in priority, then sequence order")
        present = set(bodies)
        for seen_one in seen:
            slot = self.slots.get((where, seen_one.body))
            if slot is None:
                if not self._revived(stop, where, seen_one.body):
                    problems.append(f"{where} holds {seen_one.body!r}, which was never kept there")
                continue
            expected = slot.expected(stop, self.policy)
            if expected is Tri.NO:
                problems.append(f"{where} holds {seen_one.body!r}, which must be gone")
            elif slot.delivered and not seen_one.redelivered and stop is not Stop.POWER:
                problems.append(f"{where} holds {seen_one.body!r} delivered, not redelivered")
        for (place, body), slot in self.slots.items():
            missing = place == where and body not in present
            if missing and slot.expected(stop, self.policy) is Tri.YES:
                problems.append(f"{where} lost {body!r}")
        return problems

    def _revived(self, stop: Stop, where: str, body: bytes) -> bool:
        """A message removed before, back after a power cut under `os` (allowed there)."""
        return (
            stop is Stop.POWER
            and self.policy == "os"
            and body in self.history.get(where, set())
            and self.messages[body].persistent
        )

    def _check_dead(self, dead: list[Seen], found: dict[str, list[Seen]]) -> list[str]:
        problems = []
        held = {s.body for seen in found.values() for s in seen}
        for seen in dead:
            message = self.messages.get(seen.body)
            if message is None or not message.expiring:
                problems.append(f"the dead message queue holds {seen.body!r}")
            elif seen.body in held and message.destination.startswith("/queue/"):
                problems.append(f"{seen.body!r} is both in its queue and dead")
        return problems

    def _check_commits(self, stop: Stop, found: dict[str, list[Seen]]) -> list[str]:
        """A COMMIT whose outcome is unknown took effect whole or not at all."""
        problems = []
        held = {(where, s.body) for where, seen in found.items() for s in seen}
        for commit, sends, acks in self.commits:
            if commit.effect(stop, self.policy) is not Tri.MAYBE:
                continue
            outcomes = set()
            for slot in sends:
                if self._only_by(slot, commit, stop):
                    outcomes.add((slot.where, slot.message.body) in held)
            for slot in acks:
                if self._only_by(slot, commit, stop, taken=True):
                    outcomes.add((slot.where, slot.message.body) not in held)
            if len(outcomes) > 1:
                problems.append(f"{commit.what} took effect in part")
        return problems

    def _only_by(self, slot: Slot, commit: Op, stop: Stop, *, taken: bool = False) -> bool:
        """Whether the slot's presence depends on `commit` alone (so it shows the outcome)."""
        if not slot.message.persistent or slot.message.expiring:
            return False
        others_made = [op for op in slot.made_by if op is not commit]
        others_taken = [op for op in slot.taken_by if op is not commit]
        if all_of(op.effect(stop, self.policy) for op in others_made) is not Tri.YES:
            return False
        return any_of(op.effect(stop, self.policy) for op in others_taken) is Tri.NO or not (
            taken or others_taken
        )

    def _rebase(self, stop: Stop, found: dict[str, list[Seen]]) -> None:
        """After a restart: what the broker holds is what it holds, for sure (and after a power
        cut, it may not know of a delivery it made)."""
        kept: dict[tuple[str, bytes], Slot] = {}
        for where, seen in found.items():
            for seen_one in seen:
                old = self.slots.get((where, seen_one.body))
                if old is None:
                    if self._revived(stop, where, seen_one.body):
                        # Its removal was lost, and its delivery may have been lost with it:
                        # the broker knows of it only if it says so.
                        message = self.messages[seen_one.body]
                        delivered = seen_one.redelivered
                        kept[(where, seen_one.body)] = Slot(
                            message, where, [KEPT], delivered=delivered
                        )
                    continue
                delivered = seen_one.redelivered or (old.delivered and stop is not Stop.POWER)
                kept[(where, seen_one.body)] = Slot(old.message, where, [KEPT], delivered=delivered)
        self.slots = kept
        self.commits = []
