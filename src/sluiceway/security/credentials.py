"""What the broker remembers between logins: credentials it verified a moment ago, and the
addresses whose logins keep failing. Both are bounded, both run on the event loop only, and
neither holds a password.

- `CredentialCache`: a user name and password that passed the check are accepted again without
  one for imq.authentication.cache.ttl seconds. The cache is keyed by HMAC-SHA256, under a random
  key made when the process starts, of the name and password presented: what it holds cannot be
  turned back into a password, nor matched against a guess by anyone without the key. At most
  MAX_CACHED entries (the oldest goes first). Every entry is forgotten when the users file
  changes (its stamp, users.Authenticator.refresh), so a deleted user or a changed password is
  never let in by the cache.
- `FailureDelays`: failed logins in a row per address (a host, whatever its port). The n-th
  failure in a row is answered after min(cap, base x 2^(n-1)) (imq.authentication.delay.base and
  .max); a success resets the address. At most MAX_ADDRESSES addresses are remembered (the one
  whose last failure is the oldest is forgotten first), and an address with no failure for
  FORGET_AFTER_S starts again from nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from sluiceway.security.users import Principal, Stamp

# About 200 bytes an entry: enough for every user of a large users file logging in again and
# again (connection pools, the web console polling with HTTP Basic).
MAX_CACHED: Final = 1024
# About 150 bytes an address; an attacker with more addresses than this is answered after the
# delay its most recent ones earned, the others start again.
MAX_ADDRESSES: Final = 4096
# A quarter of an hour without a failure: a client that mistyped its password yesterday does not
# wait today.
FORGET_AFTER_S: Final = 900.0
_LONGEST_SHIFT: Final = 30  # 2^30 x any base is past any cap: no huge integers


@dataclass(slots=True)
class _Cached:
    principal: Principal
    expires: float


class CredentialCache:
    """Credentials verified less than `ttl` seconds ago, keyed by a keyed hash of them."""

    def __init__(
        self,
        ttl: float,
        *,
        max_entries: int = MAX_CACHED,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._clock = clock
        self._key = secrets.token_bytes(32)  # this process's only: never stored or logged
        self._entries: OrderedDict[bytes, _Cached] = OrderedDict()
        self._stamp: Stamp | tuple[()] = ()  # the users file the entries were verified against

    def __len__(self) -> int:
        return len(self._entries)

    def _current(self, stamp: Stamp) -> None:
        """The users file is in state `stamp` now: forget everything verified against another."""
        if stamp != self._stamp:
            self._entries.clear()
            self._stamp = stamp

    def key(self, name: str, password: str) -> bytes:
        """What the cache knows credentials by: HMAC-SHA256 under this process's key."""
        # Each part is prefixed by its length, so no two (name, password) pairs give one input.
        parts = [part.encode("utf-8", "surrogatepass") for part in (name, password)]
        data = b"".join(len(part).to_bytes(4, "big") + part for part in parts)
        return hmac.digest(self._key, data, hashlib.sha256)

    def get(self, key: bytes, stamp: Stamp) -> Principal | None:
        """The principal the credentials of `key` were verified as, if that was less than the
        TTL ago and the users file (in state `stamp` now) has not changed since."""
        self._current(stamp)
        if not self._entries:
            return None
        entry = self._entries.get(key)
        if entry is None:
            return None
        if self._clock() >= entry.expires:
            del self._entries[key]
            return None
        return entry.principal

    def put(self, key: bytes, stamp: Stamp, principal: Principal) -> None:
        """Remember the credentials of `key`, which hold in the users file in state `stamp` (the
        state in force now: the caller checked them against it). Nothing is kept with a TTL of
        0."""
        self._current(stamp)
        if self.ttl <= 0 or self.max_entries <= 0:
            return
        self._entries[key] = _Cached(principal, self._clock() + self.ttl)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()


@dataclass(slots=True)
class _Failures:
    count: int
    last: float


class FailureDelays:
    """Failed logins in a row per address, and how long the next answer to it is held back."""

    def __init__(
        self,
        base: float,
        cap: float,
        *,
        max_addresses: int = MAX_ADDRESSES,
        forget_after: float = FORGET_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base = base
        self.cap = cap
        self.max_addresses = max_addresses
        self.forget_after = forget_after
        self._clock = clock
        self._addresses: OrderedDict[str, _Failures] = OrderedDict()  # oldest failure first

    def __len__(self) -> int:
        return len(self._addresses)

    def delay_for(self, count: int) -> float:
        """Seconds the answer after `count` failures in a row is held back."""
        if count <= 0 or self.base <= 0:
            return 0.0
        return min(self.cap, self.base * (1 << min(count - 1, _LONGEST_SHIFT)))

    def failures(self, address: str) -> int:
        """Failures in a row from `address` so far (0 once forgotten)."""
        entry = self._addresses.get(address)
        if entry is None:
            return 0
        if self._clock() - entry.last >= self.forget_after:
            del self._addresses[address]
            return 0
        return entry.count

    def failed(self, address: str) -> int:
        """One more failure from `address`: the count in a row, this one included."""
        count = self.failures(address) + 1
        self._addresses[address] = _Failures(count, self._clock())
        self._addresses.move_to_end(address)
        while len(self._addresses) > self.max_addresses:
            self._addresses.popitem(last=False)
        return count

    def succeeded(self, address: str) -> None:
        self._addresses.pop(address, None)
