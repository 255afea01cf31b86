"""The password checks' pool, queue, cache and delays (security.logins), on a real event loop
with real threads and a real users file; the layers above (sessions, the admin endpoint) are
tested over sockets in test_password_checks.py."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Protocol

import pytest

from sluiceway.config import build_config
from sluiceway.security.logins import LoginCounts, LoginResult, Logins, PendingLogin, Refusal
from sluiceway.security.users import UserFile
from tests.e2e.support import eventually
from tests.security.conftest import PASSWORDS, USERS

ALICE = USERS["alice"][0]
HOST = "10.1.2.3"
IDLE = LoginCounts(waiting=0, running=0, held=0, cached=0, addresses=0)


@pytest.fixture
def users(tmp_path: Path, users_template: bytes) -> Path:
    path = tmp_path / "passwd"
    path.write_bytes(users_template)
    return path


class MakeLogins(Protocol):
    """`make_logins(**properties)`: Logins over the users of USERS (closed after the test)."""

    def __call__(self, **properties: str) -> Logins: ...


@pytest.fixture
async def make_logins(users: Path) -> AsyncIterator[MakeLogins]:
    made: list[Logins] = []

    def make(**properties: str) -> Logins:
        values = {"imq.user_repository.file.filename": str(users), **properties}
        logins = Logins(build_config({"imq.authentication.enabled": "true", **values}))
        made.append(logins)
        return logins

    yield make
    for logins in made:
        logins.close()


class Answers:
    """Collects what `done` is called with."""

    def __init__(self) -> None:
        self.results: list[LoginResult] = []

    def __call__(self, result: LoginResult) -> None:
        self.results.append(result)

    async def first(self) -> LoginResult:
        await eventually(lambda: bool(self.results))
        return self.results[0]


async def login(logins: Logins, name: str, password: str, address: str = HOST) -> LoginResult:
    return await logins.check(name, password, address)


async def test_a_check_runs_in_a_thread_while_the_loop_goes_on(make_logins: MakeLogins) -> None:
    logins = make_logins()
    order: list[str] = []

    def answered(result: LoginResult) -> None:
        order.append(f"answer: {result.principal.user if result.principal else None}")

    started = logins.start("alice", ALICE, HOST, answered)
    assert isinstance(started, PendingLogin)
    asyncio.get_running_loop().call_soon(order.append, "other work")
    await eventually(lambda: len(order) == 2)
    assert order == ["other work", "answer: alice"]


async def test_an_unknown_user_is_checked_like_a_wrong_password(make_logins: MakeLogins) -> None:
    logins = make_logins(**{"imq.authentication.delay.base": "0"})
    for name, password in (("alice", "wrong"), ("nobody", "wrong"), ("alice", "")):
        answers = Answers()
        pending = logins.start(name, password, HOST, answers)
        assert isinstance(pending, PendingLogin)  # a check in a thread, never a quick "no"
        result = await answers.first()
        assert (result.principal, result.refusal) == (None, Refusal.WRONG)


async def test_the_queue_is_bounded_past_it_logins_are_busy(make_logins: MakeLogins) -> None:
    logins = make_logins(**{"imq.authentication.workers": "1", "imq.authentication.queue.max": "2"})
    answers = Answers()
    started = [logins.start("alice", f"guess{i}", HOST, answers) for i in range(4)]
    assert [type(s).__name__ for s in started] == [
        "PendingLogin",
        "PendingLogin",
        "PendingLogin",
        "LoginResult",
    ]
    assert started[3] == LoginResult(None, Refusal.BUSY)
    assert (logins.counts().running, logins.counts().waiting) == (1, 2)
    for pending in started[:3]:
        assert isinstance(pending, PendingLogin)
        pending.cancel()
    await eventually(lambda: logins.counts().running == 0)
    assert answers.results == []


async def test_cancelled_logins_leave_nothing_and_a_running_one_still_counts(
    make_logins: MakeLogins,
) -> None:
    logins = make_logins(**{"imq.authentication.workers": "1"})
    answers = Answers()
    running = logins.start("alice", "wrong", HOST, answers)
    waiting = logins.start("alice", ALICE, "10.9.9.9", answers)
    assert isinstance(running, PendingLogin)
    assert isinstance(waiting, PendingLogin)
    waiting.cancel()
    assert logins.counts().waiting == 0
    running.cancel()
    await eventually(lambda: logins.counts().running == 0)
    # Nobody was answered; the wrong password counted for its address all the same (closing
    # the connection early does not dodge the delay), and the waiting check never ran.
    assert answers.results == []
    assert logins.counts() == LoginCounts(0, 0, 0, 0, addresses=1)


async def test_failures_are_answered_after_a_growing_delay(make_logins: MakeLogins) -> None:
    logins = make_logins(
        **{"imq.authentication.delay.base": "50", "imq.authentication.delay.max": "150"}
    )
    loop = asyncio.get_running_loop()
    seen = []
    for _ in range(4):
        asked = loop.time()
        result = await login(logins, "alice", "wrong")
        seen.append((result.failures, result.delay, loop.time() - asked >= result.delay))
    assert seen == [(1, 0.05, True), (2, 0.1, True), (3, 0.15, True), (4, 0.15, True)]
    other = await login(logins, "alice", "wrong", "10.7.7.7")  # another address: its own count
    assert (other.failures, other.delay) == (1, 0.05)


async def test_a_success_is_held_as_long_and_resets_the_address(make_logins: MakeLogins) -> None:
    """A guesser must not learn from a quick CONNECTED what the held refusals hide."""
    logins = make_logins(**{"imq.authentication.delay.base": "50"})
    loop = asyncio.get_running_loop()
    await login(logins, "alice", "wrong")
    await login(logins, "alice", "wrong")
    asked = loop.time()
    result = await login(logins, "alice", ALICE)
    assert result.principal is not None
    assert (result.delay, loop.time() - asked >= 0.1) == (0.1, True)
    assert (await login(logins, "alice", "wrong")).failures == 1


async def test_a_held_answer_is_one_timer_that_cancel_removes(make_logins: MakeLogins) -> None:
    logins = make_logins(**{"imq.authentication.delay.base": "60000"})
    answers = Answers()
    pending = logins.start("alice", "wrong", HOST, answers)
    assert isinstance(pending, PendingLogin)
    await eventually(lambda: logins.counts().held == 1)
    pending.cancel()
    assert logins.counts() == LoginCounts(0, 0, 0, 0, addresses=1)
    assert answers.results == []


async def test_verified_credentials_are_cached(make_logins: MakeLogins) -> None:
    logins = make_logins()
    assert (await login(logins, "alice", ALICE)).principal is not None
    answers = Answers()
    again = logins.start("alice", ALICE, HOST, answers)
    assert isinstance(again, LoginResult)  # at once: no check
    assert again.principal is not None
    assert logins.counts().cached == 1
    wrong = logins.start("alice", "wrong", HOST, answers)  # a wrong password is never cached
    assert isinstance(wrong, PendingLogin)
    wrong.cancel()


async def test_no_cache_with_a_ttl_of_zero(make_logins: MakeLogins) -> None:
    logins = make_logins(**{"imq.authentication.cache.ttl": "0"})
    await login(logins, "alice", ALICE)
    again = logins.start("alice", ALICE, HOST, Answers())
    assert isinstance(again, PendingLogin)
    again.cancel()


async def test_the_cache_does_not_outlive_a_change_to_the_users_file(
    make_logins: MakeLogins, users: Path
) -> None:
    logins = make_logins(**{"imq.authentication.delay.base": "0"})
    assert (await login(logins, "alice", ALICE)).principal is not None
    assert (await login(logins, "bob", USERS["bob"][0])).principal is not None
    UserFile(users).add("alice", "alice-new-pw-R4", ("writers",))
    assert (await login(logins, "alice", ALICE)).refusal is Refusal.WRONG
    assert (await login(logins, "alice", "alice-new-pw-R4")).principal is not None
    UserFile(users).delete("bob")
    assert (await login(logins, "bob", USERS["bob"][0])).refusal is Refusal.WRONG


async def test_a_password_changed_during_its_check_does_not_let_the_old_one_in(
    make_logins: MakeLogins, users: Path
) -> None:
    logins = make_logins(
        **{"imq.authentication.workers": "1", "imq.authentication.delay.base": "0"}
    )
    answers = Answers()
    first = logins.start("carol", "wrong", HOST, answers)  # takes the one thread
    second = logins.start("alice", ALICE, HOST, answers)  # waits, against alice's hash now
    assert isinstance(first, PendingLogin)
    assert isinstance(second, PendingLogin)
    assert second.stage.value == "waiting for a thread"
    UserFile(users).add("alice", "alice-new-pw-R4", ("writers",))
    await eventually(lambda: len(answers.results) == 2)
    assert [r.refusal for r in answers.results] == [Refusal.WRONG, Refusal.WRONG]
    assert logins.counts().cached == 0


async def test_an_unreadable_users_file_is_said_at_once(
    make_logins: MakeLogins, users: Path
) -> None:
    logins = make_logins()
    assert (await login(logins, "alice", ALICE)).principal is not None
    with users.open("a") as out:
        out.write("this line means nothing\n")
    result = logins.start("alice", ALICE, HOST, Answers())
    assert isinstance(result, LoginResult)
    assert result.refusal is Refusal.UNREADABLE
    assert str(users) in result.problem
    assert "line" in result.problem


async def test_after_close_no_check_starts(make_logins: MakeLogins) -> None:
    logins = make_logins(**{"imq.authentication.workers": "1"})
    answers = Answers()
    logins.start("alice", "wrong", HOST, answers)
    logins.start("alice", "wrong", HOST, answers)
    logins.close()
    assert logins.counts().waiting == 0
    assert logins.start("alice", ALICE, HOST, answers) == LoginResult(None, Refusal.BUSY)


async def test_nothing_logged_holds_a_password(
    make_logins: MakeLogins, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="sluiceway")
    logins = make_logins(**{"imq.authentication.delay.base": "1"})
    await login(logins, "alice", "typo-Lm29")
    await login(logins, "nobody", "typo-Lm29")
    await login(logins, "alice", ALICE)
    pending = logins.start("alice", "typo-Lm29", HOST, Answers())
    assert "typo-Lm29" not in repr(pending)
    assert isinstance(pending, PendingLogin)
    pending.cancel()
    everything = caplog.text + repr(logins.counts())
    for secret in (*PASSWORDS, "typo-Lm29"):
        assert secret not in everything
