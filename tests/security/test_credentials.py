"""The cache of verified credentials and the delays after failed logins, on a fake clock."""

from __future__ import annotations

import pytest

from sluiceway.security.credentials import CredentialCache, FailureDelays
from sluiceway.security.users import Principal

ALICE = Principal("alice", frozenset({"writers"}))
STAMP = (1, 100, 5, 5)
CHANGED = (2, 100, 5, 5)  # the file replaced by one of the same size and times


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


# -- the cache ------------------------------------------------------------------------------


def test_credentials_verified_are_remembered_for_the_ttl(clock: Clock) -> None:
    cache = CredentialCache(30, clock=clock)
    key = cache.key("alice", "pw")
    assert cache.get(key, STAMP) is None
    cache.put(key, STAMP, ALICE)
    clock.now += 29.9
    assert cache.get(key, STAMP) == ALICE
    clock.now += 0.1
    assert cache.get(key, STAMP) is None
    assert len(cache) == 0  # the expired entry is gone, not just ignored


def test_another_password_or_name_is_another_key(clock: Clock) -> None:
    cache = CredentialCache(30, clock=clock)
    cache.put(cache.key("alice", "pw"), STAMP, ALICE)
    assert cache.get(cache.key("alice", "pw2"), STAMP) is None
    assert cache.get(cache.key("alicepw", ""), STAMP) is None  # no ambiguity at the boundary
    assert cache.get(cache.key("alic", "epw"), STAMP) is None


def test_a_changed_users_file_empties_the_cache(clock: Clock) -> None:
    cache = CredentialCache(30, clock=clock)
    key = cache.key("alice", "pw")
    cache.put(key, STAMP, ALICE)
    assert cache.get(key, CHANGED) is None
    assert len(cache) == 0
    assert cache.get(key, STAMP) is None  # and going back does not bring the entry back


def test_the_cache_is_bounded_the_oldest_goes(clock: Clock) -> None:
    cache = CredentialCache(30, max_entries=3, clock=clock)
    keys = [cache.key(f"user{i}", "pw") for i in range(5)]
    for key in keys:
        cache.put(key, STAMP, ALICE)
    assert len(cache) == 3
    assert [cache.get(key, STAMP) is not None for key in keys] == [False, False, True, True, True]


def test_a_ttl_of_zero_keeps_nothing(clock: Clock) -> None:
    cache = CredentialCache(0, clock=clock)
    key = cache.key("alice", "pw")
    cache.put(key, STAMP, ALICE)
    assert cache.get(key, STAMP) is None
    assert len(cache) == 0


def test_keys_are_keyed_hashes_not_passwords() -> None:
    one, other = CredentialCache(30), CredentialCache(30)
    key = one.key("alice", "secret-pw-Zk3")
    assert len(key) == 32
    assert b"secret-pw-Zk3" not in key
    assert key == one.key("alice", "secret-pw-Zk3")
    assert key != other.key("alice", "secret-pw-Zk3")  # each holder has its own random key


# -- the delays -----------------------------------------------------------------------------


def test_the_delay_doubles_from_the_base_to_the_cap(clock: Clock) -> None:
    delays = FailureDelays(0.1, 1.0, clock=clock)
    counts = [delays.failed("10.0.0.1") for _ in range(6)]
    assert counts == [1, 2, 3, 4, 5, 6]
    assert [delays.delay_for(n) for n in counts] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert delays.delay_for(0) == 0
    assert delays.delay_for(10**6) == 1.0  # no overflow however many


def test_addresses_are_counted_apart_and_a_success_resets(clock: Clock) -> None:
    delays = FailureDelays(0.1, 1.0, clock=clock)
    delays.failed("10.0.0.1")
    delays.failed("10.0.0.1")
    delays.failed("10.0.0.2")
    assert (delays.failures("10.0.0.1"), delays.failures("10.0.0.2")) == (2, 1)
    delays.succeeded("10.0.0.1")
    assert (delays.failures("10.0.0.1"), delays.failures("10.0.0.2")) == (0, 1)
    assert delays.failed("10.0.0.1") == 1


def test_the_table_is_bounded_the_longest_quiet_address_goes(clock: Clock) -> None:
    delays = FailureDelays(0.1, 1.0, max_addresses=2, clock=clock)
    delays.failed("a")
    delays.failed("b")
    delays.failed("a")  # a failed last: b is now the oldest
    delays.failed("c")
    assert len(delays) == 2
    assert (delays.failures("a"), delays.failures("b"), delays.failures("c")) == (2, 0, 1)


def test_an_address_quiet_long_enough_starts_again(clock: Clock) -> None:
    delays = FailureDelays(0.1, 1.0, forget_after=900, clock=clock)
    for _ in range(4):
        delays.failed("a")
    clock.now += 899
    assert delays.failures("a") == 4
    clock.now += 1
    assert delays.failures("a") == 0
    assert delays.failed("a") == 1


def test_a_zero_base_means_no_delay(clock: Clock) -> None:
    delays = FailureDelays(0, 5.0, clock=clock)
    assert delays.delay_for(delays.failed("a")) == 0
