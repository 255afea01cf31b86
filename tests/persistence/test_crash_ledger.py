"""The crash loop's ledger finds each kind of fault it is there to find (no broker involved)."""

from __future__ import annotations

from tests.persistence.crash_ledger import Ledger

Q = "/queue/q"
T = "/topic/t"


def sent(ledger: Ledger, *keys: str, destination: str = Q) -> None:
    for key in keys:
        ledger.sending_one(key, destination)
        ledger.sent(key)


def test_nothing_to_report_when_the_broker_holds_what_it_confirmed() -> None:
    ledger = Ledger()
    sent(ledger, "a", "b", "c")
    ledger.delivered("a", Q, redelivered=False)
    ledger.acking_one("a")
    ledger.acknowledged("a")
    ledger.delivered("b", Q, redelivered=False)
    ledger.after_restart({Q: ["b", "c"]})
    ledger.delivered("b", Q, redelivered=True)
    assert ledger.take_violations() == []
    assert (ledger.figures.duplicates, ledger.figures.flagged) == (1, 1)


def test_a_receipted_message_missing_is_lost() -> None:
    ledger = Ledger()
    sent(ledger, "a", "b")
    ledger.after_restart({Q: ["a"]})
    assert ledger.take_violations() == ["b lost (receipted)"]


def test_a_delivered_message_missing_is_lost_even_without_its_receipt() -> None:
    ledger = Ledger()
    ledger.sending_one("a", Q)
    ledger.delivered("a", Q, redelivered=False)
    ledger.after_restart({Q: []})
    assert ledger.take_violations() == ["a lost (delivered, never receipted)"]


def test_an_acknowledged_message_back_is_resurrected() -> None:
    ledger = Ledger()
    sent(ledger, "a")
    ledger.delivered("a", Q, redelivered=False)
    ledger.acking_one("a")
    ledger.acknowledged("a")
    ledger.after_restart({Q: ["a"]})
    assert ledger.take_violations() == ["a acknowledged (receipted), yet there again"]
    assert ledger.figures.resurrected == 1


def test_a_send_in_flight_settles_either_way_and_stays_settled() -> None:
    ledger = Ledger()
    ledger.sending_one("kept", Q)
    ledger.sending_one("dropped", Q)
    ledger.after_restart({Q: ["kept"]})
    assert ledger.take_violations() == []
    ledger.after_restart({Q: []})  # "kept" now counts as confirmed
    assert ledger.take_violations() == ["kept lost (found after an earlier restart)"]
    ledger.after_restart({Q: ["dropped"]})
    assert "dropped found missing after an earlier kill, now there" in ledger.take_violations()


def test_an_ack_in_flight_settles_either_way() -> None:
    ledger = Ledger()
    sent(ledger, "a", "b")
    for key in ("a", "b"):
        ledger.delivered(key, Q, redelivered=False)
        ledger.acking_one(key)
    ledger.after_restart({Q: ["b"]})  # a's ACK took effect, b's did not
    assert ledger.take_violations() == []
    ledger.delivered("a", Q, redelivered=True)
    assert ledger.take_violations() == ["a delivered again after its ACK was sent"]


def test_a_commit_in_flight_takes_effect_whole_or_not_at_all() -> None:
    ledger = Ledger()
    for key in ("a", "b", "c"):
        ledger.sending_in("t1", key, Q)
    ledger.committing("t1")
    ledger.after_restart({Q: ["a", "b"]})
    (violation,) = ledger.take_violations()
    assert violation.startswith("transaction t1 in flight at the kill published")

    whole = Ledger()
    for key in ("a", "b"):
        whole.sending_in("t1", key, T)
    whole.committing("t1")
    whole.delivered("a", T, redelivered=False)
    whole.acking_one("a")
    whole.acknowledged("a")
    whole.after_restart({T: ["b"]})  # a was consumed before the kill: all of it took effect
    assert whole.take_violations() == []
    assert whole.figures.commits_in_doubt["all"] == 1


def test_an_open_transaction_leaves_nothing() -> None:
    ledger = Ledger()
    ledger.sending_in("t1", "a", Q)
    ledger.delivered("a", Q, redelivered=False)
    assert ledger.take_violations() == ["a delivered before its transaction's COMMIT"]
    ledger.after_restart({Q: ["a"]})
    (violation,) = ledger.take_violations()
    assert violation.startswith("transaction t1 was never committed")


def test_a_commit_of_acknowledgements_in_flight_takes_effect_whole_or_not_at_all() -> None:
    ledger = Ledger()
    sent(ledger, "a", "b")
    for key in ("a", "b"):
        ledger.delivered(key, Q, redelivered=False)
        ledger.acking_in("t1", key)
    ledger.ack_committing("t1")
    ledger.after_restart({Q: ["b"]})
    (violation,) = ledger.take_violations()
    assert violation.startswith("acknowledging transaction t1 in flight at the kill")


def test_a_duplicate_must_be_flagged_redelivered() -> None:
    ledger = Ledger()
    sent(ledger, "a")
    ledger.delivered("a", Q, redelivered=False)
    ledger.delivered("a", Q, redelivered=False)
    assert ledger.take_violations() == ["a delivered again without redelivered:true"]


def test_what_is_there_twice_elsewhere_or_never_sent() -> None:
    ledger = Ledger()
    sent(ledger, "a")
    sent(ledger, "b", destination=T)
    ledger.after_restart({Q: ["a", "a", "b", "z"]})
    assert ledger.take_violations() == [
        "a is in /queue/q 2 times",
        "b is in /queue/q, sent to /topic/t",
        "z is in /queue/q, never sent",
    ]


def test_a_forgetting_store_may_forget_what_was_never_receipted_and_nothing_else() -> None:
    ledger = Ledger(forgetting=1.0)
    sent(ledger, "kept")
    ledger.sending_one("unreceipted", Q)
    ledger.delivered("unreceipted", Q, redelivered=False)
    ledger.delivered("kept", Q, redelivered=False)
    ledger.killed()
    ledger.after_restart({Q: []})
    assert ledger.take_violations() == ["kept lost (receipted)"]
    assert ledger.figures.forgotten_sends == 1
    ledger.after_restart({Q: ["unreceipted"]})  # forgotten is void: it must never appear
    assert "unreceipted found missing after an earlier kill, now there" in (
        ledger.take_violations()
    )


def test_a_forgetting_store_may_drop_the_flag_only_for_deliveries_just_before_a_kill() -> None:
    ledger = Ledger(forgetting=1.0)
    sent(ledger, "recent", "old")
    ledger.delivered("old", Q, redelivered=False)
    ledger.this_life["old"] -= 5.0  # delivered long before the kill
    ledger.delivered("recent", Q, redelivered=False)
    ledger.killed()
    ledger.after_restart({Q: ["recent", "old"]})
    ledger.delivered("recent", Q, redelivered=False)
    ledger.delivered("old", Q, redelivered=False)
    assert ledger.take_violations() == ["old delivered again without redelivered:true"]
    assert ledger.figures.forgotten == 1


def test_a_forgetting_store_may_forget_a_delivery_again_and_one_read_during_the_kill() -> None:
    ledger = Ledger(forgetting=1.0)
    sent(ledger, "twice", "dying", "kept")
    ledger.delivered("twice", Q, redelivered=False)
    ledger.delivered("kept", Q, redelivered=False)
    ledger.this_life["kept"] -= 5.0
    ledger.killed()
    ledger.delivered("dying", Q, redelivered=False)  # a MESSAGE read while the kill goes on
    ledger.after_restart({Q: ["twice", "dying", "kept"]})
    ledger.delivered("twice", Q, redelivered=False)  # forgotten once
    assert ledger.take_violations() == []
    ledger.killed()  # ... and again: its first delivery is long past, its last is not
    ledger.after_restart({Q: ["twice", "dying", "kept"]})
    for key in ("twice", "dying", "kept"):
        ledger.delivered(key, Q, redelivered=False)
    assert ledger.take_violations() == ["kept delivered again without redelivered:true"]
    assert ledger.figures.forgotten == 3
    ledger.delivered("twice", Q, redelivered=False)  # the same life: the broker knows
    assert ledger.take_violations() == ["twice delivered again without redelivered:true"]


def test_a_store_that_forgets_nothing_flags_every_delivery_read_during_the_kill() -> None:
    ledger = Ledger()
    sent(ledger, "dying")
    ledger.killed()
    ledger.delivered("dying", Q, redelivered=False)
    ledger.after_restart({Q: ["dying"]})
    ledger.delivered("dying", Q, redelivered=False)
    assert ledger.take_violations() == ["dying delivered again without redelivered:true"]


def test_a_forgetting_store_may_forget_a_commit_in_flight_whole_after_delivering_it() -> None:
    ledger = Ledger(forgetting=1.0)
    for key in ("a", "b"):
        ledger.sending_in("t1", key, Q)
    ledger.committing("t1")
    ledger.delivered("a", Q, redelivered=False)  # published in memory, not yet stored
    ledger.killed()
    ledger.after_restart({Q: []})
    assert ledger.take_violations() == []
    assert ledger.figures.commits_in_doubt["none"] == 1
    ledger.after_restart({Q: ["a"]})
    assert "a found missing after an earlier kill, now there" in ledger.take_violations()


def test_a_forgetting_store_still_publishes_a_commit_whole_or_not_at_all() -> None:
    ledger = Ledger(forgetting=1.0)
    for key in ("a", "b"):
        ledger.sending_in("t1", key, Q)
    ledger.committing("t1")
    ledger.killed()
    ledger.after_restart({Q: ["b"]})
    (violation,) = ledger.take_violations()
    assert violation == "transaction t1 in flight at the kill published ['b'] but not ['a']"
