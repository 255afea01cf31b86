"""The access watcher alone: real files, fake connections, one look per `tick()` call."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sluiceway.config import build_config
from sluiceway.errors import BrokerError
from sluiceway.security.access import AccessControl, Gate
from sluiceway.security.users import Principal, UserFile
from sluiceway.security.watch import AccessWatcher
from tests.security.access_support import USERS, replace_file, write_users

RULES = """\
connection.NORMAL.allow.user=*
connection.ADMIN.allow.group=admin
"""


@dataclass
class FakeHolder:
    """A connected session, as the watcher sees one."""

    principal: Principal | None
    peer: str = "127.0.0.1:5000"
    closing: bool = False
    errors: list[BrokerError] = field(default_factory=list)

    def revoke(self, error: BrokerError) -> None:
        self.errors.append(error)
        self.closing = True


@dataclass
class World:
    users: Path
    rules: Path
    holders: list[FakeHolder]
    watcher: AccessWatcher

    def connect(self, user: str) -> FakeHolder:
        holder = FakeHolder(Principal(user, frozenset(USERS[user][1])))
        self.holders.append(holder)
        return holder

    def looks(self, count: int) -> None:
        for _ in range(count):
            self.watcher.tick()


@pytest.fixture
def world(tmp_path: Path) -> World:
    users = write_users(tmp_path / "passwd", USERS)
    rules = tmp_path / "accesscontrol.properties"
    rules.write_text(RULES)
    config = build_config(
        {
            "imq.authentication.enabled": "true",
            "imq.user_repository.file.filename": str(users),
            "imq.accesscontrol.file.filename": str(rules),
        }
    )
    gate = Gate(config)
    gate.access = AccessControl(rules, interval=0)  # every tick looks at the rules file
    holders: list[FakeHolder] = []
    return World(users, rules, holders, AccessWatcher(gate, lambda: holders))


def test_nothing_changes_nothing(world: World) -> None:
    alice = world.connect("alice")
    world.looks(5)
    assert alice.errors == []
    assert alice.principal == Principal("alice", frozenset({"writers"}))


def test_a_deleted_user_is_closed_once_the_file_has_settled(world: World) -> None:
    alice, bob = world.connect("alice"), world.connect("bob")
    UserFile(world.users).delete("alice")
    world.looks(1)
    assert alice.errors == []  # seen once: it may still be being written
    world.looks(1)
    assert [(e.status, e.summary) for e in alice.errors] == [(401, "user alice no longer exists")]
    assert "deleted it from the broker's users file" in str(alice.errors[0])
    assert bob.errors == []
    world.looks(3)
    assert len(alice.errors) == 1  # acted on once


def test_a_file_caught_half_written_closes_nothing(world: World) -> None:
    alice = world.connect("alice")
    complete = world.users.read_bytes()
    with world.users.open("r+b") as handle:  # an editor that truncates, then writes
        handle.truncate(0)
        world.looks(1)
        handle.write(complete)
    os.utime(world.users, ns=(1, 1))  # (same size as before: the new time tells it changed)
    world.looks(3)
    assert alice.errors == []


def test_changed_groups_reach_the_connection(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    carol = world.connect("carol")
    UserFile(world.users).add("carol", USERS["carol"][0], ("readers",))
    world.looks(2)
    assert carol.errors == []
    assert carol.principal == Principal("carol", frozenset({"readers"}))
    assert "user carol is now in the groups readers (was readers,writers)" in caplog.text


def test_a_new_password_closes_nothing(world: World) -> None:
    alice = world.connect("alice")
    UserFile(world.users).add("alice", "a-new-password", ("writers",))
    world.looks(2)
    assert alice.errors == []


def test_a_revoked_connect_right_closes(world: World) -> None:
    alice, bob = world.connect("alice"), world.connect("bob")
    replace_file(world.rules, RULES + "connection.NORMAL.deny.user=alice\n")
    world.looks(2)
    assert [(e.status, e.summary) for e in alice.errors] == [(403, "user alice may not connect")]
    assert bob.errors == []


def test_an_invalid_rules_file_closes_nothing(world: World) -> None:
    alice = world.connect("alice")
    replace_file(world.rules, RULES + "connection.NORMAL.deny.usr=alice\n")
    world.looks(3)
    assert alice.errors == []


def test_an_unreadable_users_file_leaves_connections_open(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    alice = world.connect("alice")
    replace_file(world.users, "alice has no colons\n")
    world.looks(3)
    assert alice.errors == []
    assert "open connections are left as they are until it is fixed" in caplog.text
    assert "line 1: expected name:scrypt$...:groups" in caplog.text


def test_a_deleted_users_file_deletes_every_user(world: World) -> None:
    alice, bob = world.connect("alice"), world.connect("bob")
    world.users.unlink()
    world.looks(2)
    assert [e.status for e in (*alice.errors, *bob.errors)] == [401, 401]


def test_connections_closing_or_without_a_user_are_left_alone(world: World) -> None:
    anonymous = FakeHolder(None)
    closing = world.connect("alice")
    closing.closing = True
    world.holders.append(anonymous)
    UserFile(world.users).delete("alice")
    world.looks(2)
    assert anonymous.errors == closing.errors == []
