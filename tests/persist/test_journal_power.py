"""What each sync policy keeps of the journal after a power cut, on the simulated disk.

Records are appended, flushed, synced (GROUP rounds run when the test says) and segments rotated
in random order; then the machine stops, either between two operations or in the middle of one
(a write, an fsync, the creation of a segment), and loses power: every file keeps what was
fsynced plus an arbitrary prefix of the rest. Recovery must start by itself every time and give
back the records in LSN order without a gap, a prefix of what was appended, that holds:

- under `always`, every record whose flush returned;
- under `group`, every record up to the journal's synced LSN when the power went;
- under `os`, whatever the operating system had written (possibly nothing after a power cut,
  and every flushed record after a process crash).
"""

from __future__ import annotations

import random
from pathlib import Path

from hypothesis import event, given, settings
from hypothesis import strategies as st

from sluiceway.persist.journal import Journal, SyncPolicy
from sluiceway.persist.simulated import SimulatedCrash, SimulatedDisk

DIRECTORY = Path("/data/journal")
SEGMENT_SIZE = 200  # bytes: a few records per segment

# (step, size): "append" appends `size` records, each 0 to 80 bytes.
STEPS = st.lists(
    st.tuples(
        st.sampled_from(["append", "append", "append", "flush", "sync", "rotate"]),
        st.integers(1, 8),
    ),
    min_size=5,
    max_size=60,
)


def open_journal(disk: SimulatedDisk, policy: SyncPolicy) -> tuple[Journal, list[bytes]]:
    journal = Journal(
        DIRECTORY, segment_size=SEGMENT_SIZE, sync=policy, files=disk, sync_thread=False
    )
    records = [record.payload for record in journal.recover()]
    return journal, records


def payload(lsn: int, size: int) -> bytes:
    return (b"%d:" % lsn).ljust(size, b".")


@settings(max_examples=1000, deadline=None)
@given(
    policy=st.sampled_from(SyncPolicy),
    steps=STEPS,
    stop_at=st.none() | st.integers(1, 12),
    power=st.booleans(),
    seed=st.integers(0, 2**32),
)
def test_recovery_after_a_crash_keeps_what_the_policy_promises(
    policy: SyncPolicy, steps: list[tuple[str, int]], stop_at: int | None, power: bool, seed: int
) -> None:
    rng = random.Random(seed)
    disk = SimulatedDisk()
    journal, recovered = open_journal(disk, policy)
    assert recovered == []
    appended: list[bytes] = []  # by LSN - 1
    promised = 0  # the highest LSN the policy promises to keep through this crash
    if stop_at is not None:
        disk.arm(stop_at, rng)
    try:
        for step, size in steps:
            if step == "append":
                for _ in range(size):
                    appended.append(payload(journal.next_lsn, rng.randint(0, 80)))
                    journal.append(1, appended[-1])
            elif step == "flush":
                journal.flush()
            elif step == "sync":
                journal.sync_round()
            else:
                journal.rotate()
            if policy is SyncPolicy.ALWAYS or (not power and policy is SyncPolicy.OS):
                promised = journal.written_lsn
            elif policy is SyncPolicy.GROUP:
                promised = journal.synced_lsn if power else journal.written_lsn
    except SimulatedCrash:
        event("stopped in the middle")
    event(f"records appended: {min(len(appended) // 10 * 10, 30)}+")
    disk.crash(rng, power=power)
    journal, recovered = open_journal(disk, policy)
    assert recovered == appended[: len(recovered)], "not a prefix of what was appended"
    assert len(recovered) >= promised, f"{policy.value} lost records up to LSN {promised}"
    assert not journal.report.skipped
    # And the journal goes on from there; closed, it keeps everything (but under `os`, where
    # only the operating system writes it, it survives a process crash only).
    journal.append(1, b"after")
    journal.close()
    disk.crash(rng, power=policy is not SyncPolicy.OS)
    _, again = open_journal(disk, policy)
    assert again == [*recovered, b"after"]


def test_a_full_segment_left_to_the_page_cache_is_fsynced_before_the_next_one_starts() -> None:
    """Under `os` a clean stop leaves the last segment to the page cache. When the next start
    begins a segment after it (it is full), it fsyncs it first: otherwise a power cut could cut
    it short with a later segment after it, which recovery must take for damage."""
    for seed in range(40):
        rng = random.Random(seed)
        disk = SimulatedDisk()
        journal, _ = open_journal(disk, SyncPolicy.OS)
        appended: list[bytes] = []
        while not journal.should_rotate:
            appended.append(payload(journal.next_lsn, 60))
            journal.append(1, appended[-1])
        journal.flush()
        journal.close()
        journal, recovered = open_journal(disk, SyncPolicy.OS)
        assert recovered == appended
        journal.append(1, payload(journal.next_lsn, 60))
        journal.flush()
        disk.crash(rng, power=True)
        _, recovered = open_journal(disk, SyncPolicy.OS)
        assert recovered[: len(appended)] == appended, f"seed {seed}"
