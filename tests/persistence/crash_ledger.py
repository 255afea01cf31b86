"""What the clients of the crash loop know, and the checks made against it.

Every message's body starts with a key unique to the run. Producers and consumers record here
what the broker confirmed to them (a RECEIPT) and what they had asked for without an answer when
the broker was killed. Deliveries are checked as they arrive (`delivered`):

- a message is delivered only from the destination it was sent to, never before its
  transaction's COMMIT was sent, and never after it was found not to exist;
- a message delivered again must carry redelivered:true and must not have been acknowledged
  (an ACK, or the COMMIT of the transaction that acknowledged it, confirmed by a RECEIPT).

After each restart `after_restart` compares what the broker holds with what the clients know:

- nothing is there twice, in another destination, or that was never sent;
- every message whose SEND or COMMIT was receipted, and every message a consumer received, is
  there or was acknowledged (else it is lost);
- nothing acknowledged is there again, nor anything found missing before (resurrected);
- a COMMIT in flight at the kill took effect for all of its messages or for none of them, and
  so did a COMMIT of acknowledgements; an open transaction left nothing behind;

and then settles what was in flight, so that it is held to the same rules from then on.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass
class Pending:
    """The messages of an open transaction, and whether its COMMIT was sent."""

    keys: list[str] = field(default_factory=list)
    committing: bool = False


@dataclass
class Figures:
    """Counts for the run's summary, in messages unless said otherwise."""

    sent: int = 0  # SENDs made, in transactions or not
    receipted: int = 0  # their SEND's or COMMIT's RECEIPT arrived
    kept_in_doubt: int = 0  # in flight at a kill (no RECEIPT) and there after the restart
    dropped_in_doubt: int = 0  # in flight at a kill and not there: they must never appear
    open_at_kill: int = 0  # sent in a transaction whose COMMIT was not sent before the kill
    aborted: int = 0  # sent in a transaction that was aborted
    acknowledged: int = 0  # their ACK's or COMMIT's RECEIPT arrived
    acks_in_doubt_applied: int = 0  # ACKs in flight at a kill that had taken effect
    acks_in_doubt_undone: int = 0  # ... and that had not (the message came back)
    deliveries: int = 0  # MESSAGE frames received by consumers
    delivered_from: Counter[str] = field(default_factory=Counter)  # deliveries by destination
    duplicates: int = 0  # deliveries of a message delivered before
    flagged: int = 0  # duplicates that carried redelivered:true
    # Duplicates without the flag, of messages first delivered just before a kill of a broker
    # whose kill forgets the last deliveries (Ledger's `forgetting`): their DELIVERED records
    # were not yet committed.
    forgotten: int = 0
    # ... and messages such a kill forgot altogether: delivered just before it, their SEND (or
    # COMMIT) not yet receipted, so their ADD not yet committed either: never promised.
    forgotten_sends: int = 0
    commits: int = 0  # COMMITs of sending transactions confirmed by a RECEIPT
    commits_in_doubt: Counter[str] = field(default_factory=Counter)  # "all", "none" at a kill
    ack_commits: int = 0  # COMMITs of acknowledging transactions confirmed by a RECEIPT
    ack_commits_in_doubt: Counter[str] = field(default_factory=Counter)
    lost: int = 0
    resurrected: int = 0


class Ledger:
    """Shared by the clients' threads; every method takes the lock."""

    def __init__(self, *, forgetting: float = 0.0) -> None:
        """`forgetting`: seconds before a kill within which a delivery may be forgotten by the
        store, as a power cut forgets it on a disk (0: none may be): on the jdbc store a
        DELIVERED record is durable at its group commit, not when the MESSAGE is written. A
        store that forgets also forgets a message delivered before its SEND was receipted,
        however long before the kill: it was never promised."""
        self.forgetting = forgetting
        self.first_delivered: dict[str, float] = {}  # key -> monotonic time of its first delivery
        # key -> when it was first delivered in the broker's current life (until the restart
        # after the kill ends it: a MESSAGE read while the kill is on its way is of that life).
        self.this_life: dict[str, float] = {}
        # Delivered in an earlier life long enough before its kill for the store to have kept
        # the delivery: flagged redelivered from then on.
        self.recorded: set[str] = set()
        self.receipted: set[str] = set()  # keys whose SEND's or COMMIT's RECEIPT arrived
        self.last_kill = float("-inf")
        self.lock = threading.Lock()
        self.room = threading.Condition(self.lock)  # notified when an acknowledgement is confirmed
        self.destination: dict[str, str] = {}  # key -> where it was sent
        self.confirmed: set[str] = set()  # known to exist (receipted, delivered, found)
        self.void: set[str] = set()  # known never to have existed: must never appear
        self.sending: set[str] = set()  # SEND made, RECEIPT not yet seen
        self.transactions: dict[str, Pending] = {}  # open sending transactions
        self.transaction_of: dict[str, str] = {}  # key -> its open sending transaction
        self.seen: set[str] = set()  # delivered to a consumer at least once
        self.acked: set[str] = set()
        self.acking: set[str] = set()  # ACK made, RECEIPT not yet seen
        self.ack_transactions: dict[str, Pending] = {}  # open acknowledging transactions
        self.waiting: Counter[str] = Counter()  # per destination: there and not acknowledged
        self.violations: list[str] = []
        self.figures = Figures()

    # -- producers ---------------------------------------------------------------------------

    def sending_one(self, key: str, destination: str) -> None:
        with self.lock:
            self._new(key, destination)
            self.sending.add(key)

    def sent(self, key: str) -> None:
        """The SEND's RECEIPT arrived."""
        with self.lock:
            self.sending.discard(key)
            self._exists(key)
            self.receipted.add(key)
            self.figures.receipted += 1

    def sending_in(self, transaction: str, key: str, destination: str) -> None:
        with self.lock:
            self._new(key, destination)
            self.transactions.setdefault(transaction, Pending()).keys.append(key)
            self.transaction_of[key] = transaction

    def committing(self, transaction: str) -> None:
        with self.lock:
            self.transactions.setdefault(transaction, Pending()).committing = True

    def committed(self, transaction: str) -> None:
        """The COMMIT's RECEIPT arrived: all its messages exist."""
        with self.lock:
            pending = self.transactions.pop(transaction, Pending())
            for key in pending.keys:
                del self.transaction_of[key]
                self._exists(key)
                self.receipted.add(key)
            self.figures.receipted += len(pending.keys)
            self.figures.commits += 1

    def aborted(self, transaction: str) -> None:
        """The ABORT's RECEIPT arrived: none of its messages exists."""
        with self.lock:
            pending = self.transactions.pop(transaction, Pending())
            for key in pending.keys:
                del self.transaction_of[key]
            self.void.update(pending.keys)
            self.figures.aborted += len(pending.keys)

    def _new(self, key: str, destination: str) -> None:
        assert key not in self.destination, f"key {key} used twice"
        self.destination[key] = destination
        self.figures.sent += 1

    def _exists(self, key: str) -> None:
        if key not in self.confirmed:
            self.confirmed.add(key)
            if key not in self.acked:
                self.waiting[self.destination[key]] += 1

    # -- consumers ---------------------------------------------------------------------------

    def delivered(self, key: str, destination: str, redelivered: bool) -> None:
        with self.lock:
            self.figures.deliveries += 1
            self.figures.delivered_from[destination] += 1
            self._check_delivery(key, destination)
            if key in self.seen:
                self.figures.duplicates += 1
                if redelivered:
                    self.figures.flagged += 1
                elif key in self.recorded or key in self.this_life:
                    self.violations.append(f"{key} delivered again without redelivered:true")
                else:
                    self.figures.forgotten += 1
            else:
                self.first_delivered[key] = time.monotonic()
            self.this_life.setdefault(key, time.monotonic())
            self.seen.add(key)
            # It exists, whether or not its RECEIPT came (and if its transaction was committing,
            # so do the others of the transaction: checked after a restart).
            if key in self.destination:
                self._exists(key)

    def killed(self) -> None:
        """The broker is being killed now."""
        with self.lock:
            self.last_kill = time.monotonic()

    def _why_known(self, key: str) -> str:
        """How the ledger knew `key` existed: for a lost message's report."""
        if key in self.receipted:
            return "receipted"
        first = self.first_delivered.get(key)
        if first is None:
            return "found after an earlier restart"
        if first > self.last_kill:
            return "delivered, never receipted"
        return f"delivered {self.last_kill - first:.3f} s before the kill, never receipted"

    def _settle_deliveries(self) -> None:
        """The broker's life ended with the last kill: which of its deliveries the store kept.
        Every one, for a store that forgets nothing; else one made `forgetting` seconds or more
        before the kill was, and one made later (or while the kill was on its way) may have
        been forgotten, and so may every earlier one of the
        same message, each forgotten at the kill that followed it."""
        for key, when in self.this_life.items():
            if not self.forgetting or self.last_kill - when >= self.forgetting:
                self.recorded.add(key)
        self.this_life.clear()

    def _check_delivery(self, key: str, destination: str) -> None:
        if key not in self.destination:
            self.violations.append(f"{key} delivered from {destination} was never sent")
        elif self.destination[key] != destination:
            self.violations.append(
                f"{key} sent to {self.destination[key]}, delivered from {destination}"
            )
        elif key in self.acked or key in self.acking:
            self.figures.resurrected += 1
            self.violations.append(f"{key} delivered again after its ACK was sent")
        elif key in self.void:
            self.figures.resurrected += 1
            self.violations.append(f"{key} delivered, though found never to have been sent")
        elif key in self.transaction_of:
            pending = self.transactions[self.transaction_of[key]]
            if not pending.committing:
                self.violations.append(f"{key} delivered before its transaction's COMMIT")

    def acking_one(self, key: str) -> None:
        with self.lock:
            self.acking.add(key)

    def acknowledged(self, key: str) -> None:
        """The ACK's RECEIPT arrived."""
        with self.lock:
            self.acking.discard(key)
            self._consumed([key])

    def acking_in(self, transaction: str, key: str) -> None:
        with self.lock:
            self.ack_transactions.setdefault(transaction, Pending()).keys.append(key)

    def ack_committing(self, transaction: str) -> None:
        with self.lock:
            self.ack_transactions.setdefault(transaction, Pending()).committing = True

    def ack_committed(self, transaction: str) -> None:
        with self.lock:
            self._consumed(self.ack_transactions.pop(transaction, Pending()).keys)
            self.figures.ack_commits += 1

    def ack_aborted(self, transaction: str) -> None:
        """The ABORT's RECEIPT arrived: its messages go back to their destination."""
        with self.lock:
            self.ack_transactions.pop(transaction, None)

    def _consumed(self, keys: Iterable[str]) -> None:
        for key in keys:
            if key not in self.acked:
                self.acked.add(key)
                self.figures.acknowledged += 1
                if key in self.confirmed:
                    self.waiting[self.destination[key]] -= 1
        self.room.notify_all()

    def wait_for_room(self, destination: str, limit: int, timeout: float) -> bool:
        """Wait (up to `timeout` s) until fewer than `limit` messages wait in `destination`."""
        with self.room:
            return self.room.wait_for(lambda: self.waiting[destination] < limit, timeout)

    # -- after a restart ---------------------------------------------------------------------

    def take_violations(self) -> list[str]:
        """The violations found since the last call."""
        with self.lock:
            violations, self.violations = self.violations, []
            return violations

    def after_restart(self, present: Mapping[str, Sequence[str]]) -> None:
        """Check what the broker holds (destination -> the keys there) and settle what was in
        flight at the kill; violations are kept for `take_violations`."""
        with self.lock:
            found = self._found(present)
            there = set(found)
            for key in sorted(there & self.acked):
                self.figures.resurrected += 1
                self.violations.append(f"{key} acknowledged (receipted), yet there again")
            for key in sorted(there & self.void):
                self.figures.resurrected += 1
                self.violations.append(f"{key} found missing after an earlier kill, now there")
            self._settle_acks(there)
            self._settle_deliveries()
            lost = (self.confirmed | self.seen) - self.acked - there
            forgotten = {key for key in lost if key not in self.receipted and self.forgetting}
            lost -= forgotten
            self.figures.forgotten_sends += len(forgotten)
            self.void |= forgotten  # never promised, and gone: must never appear again
            self.confirmed -= forgotten
            self.figures.lost += len(lost)
            self.violations.extend(f"{key} lost ({self._why_known(key)})" for key in sorted(lost))
            self._settle_sends(there, forgotten)
            self.waiting = Counter(found.values())

    def _found(self, present: Mapping[str, Sequence[str]]) -> dict[str, str]:
        found: dict[str, str] = {}
        for destination, keys in present.items():
            for key, count in Counter(keys).items():
                if count > 1:
                    self.violations.append(f"{key} is in {destination} {count} times")
                if key not in self.destination:
                    self.violations.append(f"{key} is in {destination}, never sent")
                elif self.destination[key] != destination:
                    self.violations.append(
                        f"{key} is in {destination}, sent to {self.destination[key]}"
                    )
                found[key] = destination
        return found

    def _settle_acks(self, there: set[str]) -> None:
        """An ACK in flight took effect unless its message is there; a COMMIT of ACKs in
        flight took effect for all of its messages or none."""
        applied = self.acking - there
        self.figures.acks_in_doubt_applied += len(applied)
        self.figures.acks_in_doubt_undone += len(self.acking & there)
        self._consumed(applied)
        self.acking.clear()
        for name, pending in self.ack_transactions.items():
            if not pending.committing:
                continue  # never committed: its messages are there (else they are lost)
            keys = set(pending.keys)
            if keys <= there:
                self.figures.ack_commits_in_doubt["none"] += 1
            elif not keys & there:
                self.figures.ack_commits_in_doubt["all"] += 1
                self._consumed(keys)
            else:
                self.violations.append(
                    f"acknowledging transaction {name} in flight at the kill took effect for "
                    f"{sorted(keys - there)[:5]} only, not for {sorted(keys & there)[:5]}"
                )
                self._consumed(keys - there)  # reported here, not again as lost
        self.ack_transactions.clear()

    def _settle_sends(self, there: set[str], forgotten: set[str]) -> None:
        """A SEND in flight took effect if its message is there or was delivered (and not
        `forgotten` since: a store that forgets may deliver what the kill then undoes); a
        COMMIT in flight for all of its messages or none; an open transaction for none."""
        kept = there | (self.seen - forgotten)
        for key in self.sending:
            if key in kept:
                self.figures.kept_in_doubt += 1
                self._exists(key)
            else:
                self.figures.dropped_in_doubt += 1
                self.void.add(key)
        self.sending.clear()
        for name, pending in self.transactions.items():
            keys = set(pending.keys)
            exist = keys & kept
            if exist and not pending.committing:
                self.violations.append(
                    f"transaction {name} was never committed, yet {sorted(exist)[:5]} exist"
                )
            if exist and pending.committing:
                self.figures.commits_in_doubt["all"] += 1
                self.figures.kept_in_doubt += len(keys)
                missing = keys - there - self.acked
                if missing:
                    self.violations.append(
                        f"transaction {name} in flight at the kill published "
                        f"{sorted(exist)[:5]} but not {sorted(missing)[:5]}"
                    )
                for key in keys:
                    self._exists(key)
                continue
            if pending.committing:
                self.figures.commits_in_doubt["none"] += 1
                self.figures.dropped_in_doubt += len(keys)
            else:
                self.figures.open_at_kill += len(keys)
            self.void.update(keys)
        self.transactions.clear()
        self.transaction_of.clear()

    # -- at the end --------------------------------------------------------------------------

    def unaccounted(self) -> list[str]:
        """Keys neither acknowledged nor known never to have existed (after the last drain)."""
        with self.lock:
            return sorted(set(self.destination) - self.acked - self.void)
