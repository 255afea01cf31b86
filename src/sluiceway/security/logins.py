"""Password checks off the event loop: a bounded pool of threads, a bounded queue, a short cache,
and a growing delay for addresses whose logins keep failing.

Every login (a STOMP CONNECT, an admin request's HTTP Basic credentials) goes through `Logins`,
on the broker's event loop:

1. The users file is looked at (a stat; read again if it changed, which empties the cache).
2. Credentials verified less than imq.authentication.cache.ttl seconds ago are accepted without
   a check (security.credentials).
3. Otherwise the check, scrypt against the user's hash (about 40 ms of CPU and 16 MiB; an unknown
   user is checked against a dummy hash, so it costs the same), runs in one of
   imq.authentication.workers threads. hashlib.scrypt releases the GIL while it computes (one
   thread of scrypt beside a thread running Python: 1.34 s of process CPU per second of wall
   time on two shared cores, against 0.96 for two threads of Python), so the event loop goes on
   moving messages meanwhile. At most imq.authentication.queue.max checks wait for a thread;
   past that the login is refused at once (BUSY: 503, try again later).
4. The answer is held back when the client's address failed to log in just before: the n-th
   failure in a row is answered after min(imq.authentication.delay.max,
   imq.authentication.delay.base x 2^(n-1)). A success from that address resets it, but is held
   back too (by the delay its failures so far earned): otherwise a guesser could wait for a
   quick CONNECTED and treat silence as a refusal. Holding an answer is one timer on the loop,
   no thread and no task; the caller's connection reads nothing meanwhile.

A caller that goes away (its connection closed) cancels its `PendingLogin`: a waiting check is
dropped from the queue, a held answer's timer cancelled; a check already running finishes in
its thread (and still counts for its address: closing early does not dodge the delay), and its
result is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Final

from sluiceway.config import BrokerConfig
from sluiceway.errors import ConfigError
from sluiceway.security.credentials import CredentialCache, FailureDelays
from sluiceway.security.users import Authenticator, Principal, Stamp, User, check, users_path

log = logging.getLogger(__name__)

THREAD_NAME: Final = "sluiceway-login"


class Refusal(enum.Enum):
    WRONG = "wrong user name or password"  # an unknown user too: the same answer
    BUSY = "too many logins in progress"
    UNREADABLE = "cannot check credentials"  # the users file cannot be read


@dataclass(frozen=True, slots=True)
class LoginResult:
    """How a login ended: a principal, or a refusal; and for how long its answer was held."""

    principal: Principal | None
    refusal: Refusal | None = None
    delay: float = 0.0  # seconds the answer was held back
    failures: int = 0  # failed logins in a row from the address, this one included
    problem: str = ""  # UNREADABLE: why (names the file and the line; never a secret)


Done = Callable[[LoginResult], None]


class Stage(enum.Enum):
    WAITING = "waiting for a thread"
    RUNNING = "being checked"
    HELD = "answer held back"
    OVER = "answered or cancelled"


class PendingLogin:
    """A login whose answer comes later, through `done`. It holds no password: that went to the
    thread that checks it."""

    __slots__ = (
        "_done",
        "_logins",
        "_password",
        "_timer",
        "address",
        "key",
        "name",
        "stage",
        "stamp",
        "user",
    )

    def __init__(
        self, logins: Logins, done: Done, *, name: str, password: str, address: str, key: bytes
    ) -> None:
        self._logins = logins
        self._done: Done | None = done
        self._password: str | None = password  # until the check starts
        self._timer: asyncio.TimerHandle | None = None
        self.name = name
        self.address = address
        self.key = key
        self.stage = Stage.WAITING
        self.stamp: Stamp = None
        self.user: User | None = None

    def __repr__(self) -> str:
        return f"<PendingLogin {self.name!r} from {self.address}: {self.stage.value}>"

    def cancel(self) -> None:
        """The caller went away: nothing of this login is kept for it."""
        self._logins.cancel(self)


@dataclass(frozen=True, slots=True)
class LoginCounts:
    """What the logins hold right now, for operators and tests."""

    waiting: int  # checks waiting for a thread
    running: int  # checks in a thread (cancelled ones included, until they finish)
    held: int  # answers held back
    cached: int  # verified credentials remembered
    addresses: int  # addresses with failures on record


class Logins:
    """The pool, the queue, the cache and the delays of one broker; used on its event loop."""

    def __init__(
        self,
        config: BrokerConfig,
        *,
        authenticator: Authenticator | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = users_path(config)
        self.workers = config.auth_workers
        self.queue_max = config.auth_queue_max
        self._authenticator = authenticator  # read at the first login
        self._cache = CredentialCache(config.auth_cache_ttl_s, clock=clock)
        self._delays = FailureDelays(
            config.auth_delay_base_ms / 1000, config.auth_delay_max_ms / 1000, clock=clock
        )
        self._waiting: deque[PendingLogin] = deque()
        self._running = 0
        self._held = 0
        self._executor: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def counts(self) -> LoginCounts:
        return LoginCounts(
            len(self._waiting), self._running, self._held, len(self._cache), len(self._delays)
        )

    # -- starting ----------------------------------------------------------------------------

    def start(
        self, name: str, password: str | None, address: str, done: Done
    ) -> LoginResult | PendingLogin:
        """Check `name` and `password`, presented from `address` (a host): the result now (a
        cached success, an overload, an unreadable users file), or a PendingLogin whose result
        comes through `done`, on the event loop, unless it is cancelled first."""
        password = password or ""
        try:
            authenticator = self._users()
            stamp = authenticator.refresh()
        except ConfigError as exc:
            return LoginResult(None, Refusal.UNREADABLE, problem=str(exc))
        key = self._cache.key(name, password)
        cached = self._cache.get(key, stamp)
        if cached is not None:
            held = self._delays.delay_for(self._delays.failures(address))
            self._delays.succeeded(address)
            result = LoginResult(cached, delay=held)
            if not held:
                return result
            pending = PendingLogin(self, done, name=name, password="", address=address, key=key)
            self._hold(pending, result)
            return pending
        if self._closed or (self._running >= self.workers and len(self._waiting) >= self.queue_max):
            return LoginResult(None, Refusal.BUSY)
        pending = PendingLogin(self, done, name=name, password=password, address=address, key=key)
        pending.stamp, pending.user = stamp, authenticator.find(name)
        self._waiting.append(pending)
        self._dispatch()
        return pending

    async def check(self, name: str, password: str | None, address: str) -> LoginResult:
        """`start`, awaited (for aiohttp handlers). Cancelling the awaiting task cancels the
        login."""
        future: asyncio.Future[LoginResult] = asyncio.get_running_loop().create_future()

        def done(result: LoginResult) -> None:
            if not future.done():
                future.set_result(result)

        started = self.start(name, password, address, done)
        if isinstance(started, LoginResult):
            return started
        try:
            return await future
        except asyncio.CancelledError:
            started.cancel()
            raise

    def _users(self) -> Authenticator:
        if self._authenticator is None:
            self._authenticator = Authenticator(self.path)  # raises ConfigError if malformed
            if self._authenticator.empty:
                log.warning(
                    "authentication is on but the users file %s has no users: every connection "
                    "is refused; add users with `sluiceway cmd user add`",
                    self.path,
                )
        return self._authenticator

    # -- the pool ----------------------------------------------------------------------------

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._loop = asyncio.get_running_loop()
            self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix=THREAD_NAME)
            # The dummy hash an unknown user is checked against is made once, at its first use:
            # made now, the first unknown user costs what a wrong password costs.
            self._executor.submit(check, None, "")
        return self._executor

    def _dispatch(self) -> None:
        """Start waiting checks while a thread is free."""
        while self._waiting and self._running < self.workers:
            pending = self._waiting.popleft()
            password, pending._password = pending._password or "", None
            pending.stage = Stage.RUNNING
            self._running += 1
            future = self._pool().submit(check, pending.user, password)
            future.add_done_callback(partial(self._from_thread, pending))

    def _from_thread(self, pending: PendingLogin, future: Future[Principal | None]) -> None:
        """In the worker thread, once the check is done: back to the event loop."""
        loop = self._loop
        assert loop is not None
        # RuntimeError: the loop is closed (the broker stopped): nobody waits any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._checked, pending, future)

    def _checked(self, pending: PendingLogin, future: Future[Principal | None]) -> None:
        """On the event loop: a check finished (its caller may have gone: it still counts)."""
        self._running -= 1
        self._dispatch()
        try:
            principal = future.result()
        except Exception:
            log.exception("a password check failed in its thread")
            result = LoginResult(
                None, Refusal.UNREADABLE, problem="the password check failed (see the log)"
            )
        else:
            result = self._outcome(pending, principal)
        if pending.stage is Stage.RUNNING:
            self._answer(pending, result)

    def _outcome(self, pending: PendingLogin, principal: Principal | None) -> LoginResult:
        """What a finished check means now: the users file may have changed meanwhile."""
        if principal is not None:
            try:
                confirmed = self._confirm(pending)
            except ConfigError as exc:
                return LoginResult(None, Refusal.UNREADABLE, problem=str(exc))
            if confirmed is not None:
                held = self._delays.delay_for(self._delays.failures(pending.address))
                self._delays.succeeded(pending.address)
                return LoginResult(confirmed, delay=held)
        count = self._delays.failed(pending.address)
        return LoginResult(None, Refusal.WRONG, self._delays.delay_for(count), count)

    def _confirm(self, pending: PendingLogin) -> Principal | None:
        """The principal a successful check stands for in the users file as it is now, None if
        the user was deleted or their password changed while it ran; remembered in the cache."""
        authenticator = self._users()
        stamp = authenticator.refresh()
        user = authenticator.find(pending.name)
        checked = pending.user
        if user is None or checked is None or user.password_hash != checked.password_hash:
            return None
        principal = Principal(user.name, frozenset(user.groups))  # its groups as they are now
        self._cache.put(pending.key, stamp, principal)
        return principal

    # -- answering -----------------------------------------------------------------------------

    def _answer(self, pending: PendingLogin, result: LoginResult) -> None:
        if result.delay > 0:
            self._hold(pending, result)
        else:
            self._finish(pending, result)

    def _hold(self, pending: PendingLogin, result: LoginResult) -> None:
        """Answer after `result.delay`: one timer, nothing else held."""
        loop = self._loop or asyncio.get_running_loop()
        pending.stage = Stage.HELD
        self._held += 1
        pending._timer = loop.call_later(result.delay, self._finish, pending, result)

    def _finish(self, pending: PendingLogin, result: LoginResult) -> None:
        done = pending._done
        self._end(pending)
        if done is not None:
            done(result)

    def _end(self, pending: PendingLogin) -> None:
        if pending.stage is Stage.HELD:
            self._held -= 1
        pending.stage = Stage.OVER
        pending._done = None
        pending._password = None
        pending._timer = None

    def cancel(self, pending: PendingLogin) -> None:
        """`pending`'s caller went away (PendingLogin.cancel)."""
        if pending.stage is Stage.WAITING:
            self._waiting.remove(pending)
        elif pending.stage is Stage.HELD and pending._timer is not None:
            pending._timer.cancel()
        if pending.stage is not Stage.RUNNING:
            self._end(pending)
            return
        # A running check cannot be stopped: its result is dropped when it comes (_checked).
        pending.stage = Stage.OVER
        pending._done = None

    def close(self) -> None:
        """The broker stops: no further check starts; checks already running finish in their
        threads, whose results nobody waits for."""
        self._closed = True
        for pending in list(self._waiting):
            self.cancel(pending)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
