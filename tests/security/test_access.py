"""The access rules without a broker: parsing, precedence, the default rules, reloading."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluiceway.errors import ConfigError, Forbidden, Status
from sluiceway.javaprops import parse_properties
from sluiceway.naming import DestinationKind
from sluiceway.security.access import (
    DEFAULT_RULES,
    AccessControl,
    AccessDenied,
    Operation,
    Rules,
    Service,
    apply_rules,
    parse_rules,
)
from sluiceway.security.users import Principal

Q, T = DestinationKind.QUEUE, DestinationKind.TOPIC
PRODUCE, CONSUME, BROWSE, CREATE, CONNECT = (
    Operation.PRODUCE,
    Operation.CONSUME,
    Operation.BROWSE,
    Operation.CREATE,
    Operation.CONNECT,
)


def rules_of(text: str) -> Rules:
    return parse_rules(parse_properties(text, "acl"), "acl")


def who(user: str, *groups: str) -> Principal:
    return Principal(user, frozenset(groups))


def allowed(text: str, principal: Principal, operation: Operation, kind: str, name: str) -> bool:
    return apply_rules(rules_of(text), principal, operation, kind, name).allowed


# -- precedence -------------------------------------------------------------------------------


def case(
    text: str,
    principal: Principal,
    request: tuple[Operation, str, str],
    expected: bool,
    *,
    id: str | None = None,
) -> object:
    """One row: the rules, who asks, what they ask (operation, resource, name), the answer."""
    return pytest.param(text, principal, request, expected, id=id)


# (rules, principal, operation, resource, name, allowed): Open MQ's "Application of
# Authorization Rules", and deny winning where allow and deny meet at the same step.
PRECEDENCE = [
    case("", who("bob"), (PRODUCE, "queue", "q1"), False, id="no-rule-denies"),
    case(
        "queue.*.produce.allow.user=*", who("bob"), (PRODUCE, "queue", "q1"), True, id="all-users"
    ),
    case("queue.*.produce.allow.user=*", who("bob"), (CONSUME, "queue", "q1"), False, id="per-op"),
    case(
        "queue.*.produce.allow.user=*", who("bob"), (PRODUCE, "topic", "q1"), False, id="per-kind"
    ),
    # A rule naming the destination overrides the * destination, either way.
    case(
        "queue.*.produce.allow.user=*\nqueue.tq1.produce.deny.user=bob",
        who("bob"),
        (PRODUCE, "queue", "tq1"),
        False,
        id="specific-deny-over-generic-allow",
    ),
    case(
        "queue.*.produce.allow.user=*\nqueue.tq1.produce.deny.user=bob",
        who("bob"),
        (PRODUCE, "queue", "tq2"),
        True,
        id="specific-deny-other-destination",
    ),
    case(
        "queue.*.produce.deny.user=bob\nqueue.tq1.produce.allow.user=*",
        who("bob"),
        (PRODUCE, "queue", "tq1"),
        True,
        id="specific-allow-over-generic-deny",
    ),
    # The named destination's rules say nothing about bob: the * destination decides.
    case(
        "queue.*.produce.allow.user=*\nqueue.tq1.produce.allow.user=alice",
        who("bob"),
        (PRODUCE, "queue", "tq1"),
        True,
        id="silent-specific-falls-back",
    ),
    # A named user overrides user=*, either way.
    case(
        "queue.tq1.produce.allow.user=*\nqueue.tq1.produce.deny.user=bob",
        who("bob"),
        (PRODUCE, "queue", "tq1"),
        False,
        id="named-user-deny-over-all",
    ),
    case(
        "queue.tq1.produce.allow.user=*\nqueue.tq1.produce.deny.user=bob",
        who("alice"),
        (PRODUCE, "queue", "tq1"),
        True,
        id="others-still-allowed",
    ),
    case(
        "queue.tq1.produce.deny.user=*\nqueue.tq1.produce.allow.user=bob",
        who("bob"),
        (PRODUCE, "queue", "tq1"),
        True,
        id="named-user-allow-over-all-deny",
    ),
    # user=* overrides group=*.
    case(
        "queue.tq1.produce.allow.user=*\nqueue.tq1.produce.deny.group=*",
        who("bob", "staff"),
        (PRODUCE, "queue", "tq1"),
        True,
        id="all-users-over-all-groups",
    ),
    # A named user overrides the user's group, either way.
    case(
        "queue.tq1.produce.allow.group=staff\nqueue.tq1.produce.deny.user=bob",
        who("bob", "staff"),
        (PRODUCE, "queue", "tq1"),
        False,
        id="user-deny-over-group-allow",
    ),
    case(
        "queue.tq1.produce.allow.group=staff\nqueue.tq1.produce.deny.user=bob",
        who("carol", "staff"),
        (PRODUCE, "queue", "tq1"),
        True,
        id="group-allow-for-others",
    ),
    case(
        "queue.tq1.produce.deny.group=staff\nqueue.tq1.produce.allow.user=bob",
        who("bob", "staff"),
        (PRODUCE, "queue", "tq1"),
        True,
        id="user-allow-over-group-deny",
    ),
    # A named group overrides user=*.
    case(
        "queue.tq1.produce.allow.user=*\nqueue.tq1.produce.deny.group=interns",
        who("ivan", "interns"),
        (PRODUCE, "queue", "tq1"),
        False,
        id="group-deny-over-all-users",
    ),
    # group=* means the users who are in some group.
    case(
        "queue.q.produce.allow.group=*", who("bob"), (PRODUCE, "queue", "q"), False, id="no-group"
    ),
    case(
        "queue.q.produce.allow.group=*",
        who("bob", "x"),
        (PRODUCE, "queue", "q"),
        True,
        id="any-group",
    ),
    # Allow and deny at the same step: deny wins (Open MQ would let the * rule decide).
    case(
        "queue.*.browse.allow.user=*\nqueue.q1.browse.allow.user=bob\nqueue.q1.browse.deny.user=bob",
        who("bob"),
        (BROWSE, "queue", "q1"),
        False,
        id="same-user-allowed-and-denied",
    ),
    case(
        "queue.q.consume.allow.group=a\nqueue.q.consume.deny.group=b",
        who("bob", "a", "b"),
        (CONSUME, "queue", "q"),
        False,
        id="one-group-allowed-another-denied",
    ),
    # Auto-creation: one rule for every queue (topic).
    case(
        "queue.create.allow.user=alice", who("alice"), (CREATE, "queue", "new"), True, id="create"
    ),
    case(
        "queue.create.allow.user=alice", who("bob"), (CREATE, "queue", "new"), False, id="no-create"
    ),
    case(
        "queue.create.allow.user=*", who("bob"), (CREATE, "topic", "new"), False, id="create-kind"
    ),
    # Connection services.
    case("connection.NORMAL.allow.user=*", who("bob"), (CONNECT, "connection", "NORMAL"), True),
    case("connection.NORMAL.allow.user=*", who("bob"), (CONNECT, "connection", "ADMIN"), False),
    case(
        "connection.*.allow.group=admin",
        who("root", "admin"),
        (CONNECT, "connection", "ADMIN"),
        True,
    ),
    # Dotted names, the dead message queue among them, are names like any other.
    case(
        "queue.mq.sys.dmq.consume.allow.user=bob",
        who("bob"),
        (CONSUME, "queue", "mq.sys.dmq"),
        True,
        id="dmq",
    ),
    case(
        "queue.mq.sys.dmq.consume.allow.user=bob",
        who("bob"),
        (CONSUME, "queue", "mq.sys"),
        False,
        id="dotted-prefix-is-not-a-pattern",
    ),
    case(
        "topic.a.b.browse.allow.user=bob", who("bob"), (BROWSE, "topic", "a.b"), True, id="t-browse"
    ),
    # A queue may be called "create".
    case(
        "queue.create.produce.allow.user=bob",
        who("bob"),
        (PRODUCE, "queue", "create"),
        True,
        id="queue-called-create",
    ),
]


@pytest.mark.parametrize(("text", "principal", "request_", "expected"), PRECEDENCE)
def test_precedence(
    text: str, principal: Principal, request_: tuple[Operation, str, str], expected: bool
) -> None:
    assert allowed(text, principal, *request_) is expected


def test_decision_names_the_deciding_rule_and_line() -> None:
    text = "# rules\nqueue.*.produce.allow.user=*\nqueue.orders.produce.deny.user=bob,mallory\n"
    decision = apply_rules(rules_of(text), who("bob"), PRODUCE, "queue", "orders")
    assert not decision.allowed
    assert (decision.rule, decision.principal, decision.line) == (
        "queue.orders.produce.deny.user",
        "bob",
        3,
    )
    nothing = apply_rules(rules_of(text), who("bob"), CONSUME, "queue", "orders")
    assert (nothing.allowed, nothing.rule) == (False, None)


# -- parse errors -----------------------------------------------------------------------------

PARSE_ERRORS = [
    pytest.param("queues.orders.produce.allow.user=bob", "unknown key", id="resource"),
    pytest.param("queue.allow.user=bob", "unknown key", id="too-short"),
    pytest.param("topic.produce.allow.user=bob", "unknown key", id="no-destination"),
    pytest.param("queue.orders.publish.allow.user=bob", "OPERATION produce", id="operation"),
    pytest.param("queue.orders.produce.permit.user=bob", ".allow.user", id="access"),
    pytest.param("queue.orders.produce.allow.users=bob", ".deny.group", id="principal-type"),
    pytest.param(
        "queue.orders.create.allow.user=bob", "queue.create.allow.user", id="create-per-queue"
    ),
    pytest.param("connection.FAST.allow.user=*", "NORMAL (clients), ADMIN", id="service"),
    pytest.param("connection.NORMAL.produce.allow.user=*", "NORMAL (clients)", id="conn-op"),
    pytest.param("queue.or*ders.produce.allow.user=bob", "patterns are not supported", id="glob"),
    pytest.param("queue.orders.produce.allow.user=", "names no users", id="empty"),
    pytest.param("queue.orders.produce.allow.group= , ", "names no groups", id="only-commas"),
    pytest.param("queue.orders.produce.allow.user=bob smith", "user name 'bob smith'", id="name"),
    pytest.param("queue.orders.produce.allow.user=bob\\nsmith", "user name", id="name-escape"),
    pytest.param("version=2", "version must be JMQFileAccessControlModel/100", id="version"),
    pytest.param(
        "queue.orders.produce.allow.user=bob\nqueue.orders.produce.allow.user=carol",
        "already set on line 3",
        id="repeated-key",
    ),
]


@pytest.mark.parametrize(("text", "fragment"), PARSE_ERRORS)
def test_parse_errors_name_the_file_the_line_and_what_is_accepted(text: str, fragment: str) -> None:
    # Two lines first, so the error must name the right line (a comment and a valid rule).
    lines = ["# access rules", "queue.*.consume.allow.user=*", *text.split("\n")]
    with pytest.raises(ConfigError) as caught:
        parse_rules(parse_properties("\n".join(lines), "/etc/acl"), "/etc/acl")
    message = str(caught.value)
    assert caught.value.name == "imq.accesscontrol.file.filename"
    assert message.startswith(f"/etc/acl, line {len(lines)}: "), message
    assert fragment in message


def test_open_mq_default_file_is_accepted() -> None:
    """Open MQ's own accesscontrol.properties, as it ships (comments trimmed)."""
    text = """\
version=JMQFileAccessControlModel/100
connection.NORMAL.allow.user=*
connection.ADMIN.allow.group=admin
queue.*.produce.allow.user=*
queue.*.consume.allow.user=*
queue.*.browse.allow.user=*
topic.*.produce.allow.user=*
topic.*.consume.allow.user=*
queue.create.allow.user=*
topic.create.allow.user=*
"""
    rules = rules_of(text)
    assert apply_rules(rules, who("bob"), CONSUME, "topic", "t").allowed
    assert not apply_rules(rules, who("bob"), BROWSE, "topic", "t").allowed  # not in Open MQ's


# -- the file in force: defaults, reloading, invalid files --------------------------------------


class Ticks:
    """A monotonic clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_without_a_file_every_user_may_use_every_destination_and_admins_administer(
    tmp_path: Path,
) -> None:
    access = AccessControl(tmp_path / "missing.properties")
    bob = who("bob")
    for operation in (PRODUCE, CONSUME, BROWSE, CREATE):
        for kind in (Q, T):
            assert access.decide(bob, operation, kind, "anything").allowed
    assert access.decide(bob, CONNECT, None, Service.NORMAL.value).allowed
    assert not access.decide(bob, CONNECT, None, Service.ADMIN.value).allowed
    assert access.decide(who("root", "admin"), CONNECT, None, Service.ADMIN.value).allowed
    assert access.decide(bob, CONSUME, Q, "mq.sys.dmq").allowed
    assert access.source == "the default rules"
    assert DEFAULT_RULES.startswith("version=JMQFileAccessControlModel/100")


def test_the_file_is_reread_when_it_changes_at_most_once_per_interval(tmp_path: Path) -> None:
    path = tmp_path / "acl.properties"
    clock = Ticks()
    access = AccessControl(path, clock=clock, interval=1.0)
    bob = who("bob")
    assert access.decide(bob, PRODUCE, Q, "orders").allowed  # defaults

    path.write_text("queue.*.consume.allow.user=*\n")
    assert access.decide(bob, PRODUCE, Q, "orders").allowed  # not looked at again yet
    clock.now = 1.0
    assert not access.decide(bob, PRODUCE, Q, "orders").allowed
    assert access.decide(bob, CONSUME, Q, "orders").allowed
    assert access.source == str(path)

    path.write_text("queue.*.consume.allow.user=*\nqueue.*.consume.deny.user=bob\n")
    clock.now = 2.0
    assert not access.decide(bob, CONSUME, Q, "orders").allowed

    path.unlink()
    clock.now = 3.0
    assert access.decide(bob, PRODUCE, Q, "orders").allowed  # back to the defaults


def test_an_invalid_file_refuses_everything_until_fixed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "acl.properties"
    path.write_text("queue.*.consume.allow.user=*\nqueue.*.eat.allow.user=*\n")
    clock = Ticks()
    access = AccessControl(path, clock=clock, interval=1.0)
    assert access.problem is not None
    assert f"{path}, line 2" in caplog.text
    decision = access.decide(who("bob"), CONSUME, Q, "orders")
    assert (decision.allowed, decision.invalid) == (False, True)
    with pytest.raises(AccessDenied) as caught:
        access.check(who("bob"), CONSUME, Q, "orders")
    assert "access rules cannot be read" in str(caught.value)
    with pytest.raises(ConfigError, match="line 2"):
        access.require_valid()

    path.write_text("queue.*.consume.allow.user=*\n")
    clock.now = 1.0
    assert access.decide(who("bob"), CONSUME, Q, "orders").allowed
    access.require_valid()


def test_connect_is_checked_without_a_destination_and_only_it(tmp_path: Path) -> None:
    access = AccessControl(tmp_path / "none")
    with pytest.raises(ValueError, match="CONNECT"):
        access.decide(who("bob"), CONNECT, Q, "orders")
    with pytest.raises(ValueError, match="CONNECT"):
        access.decide(who("bob"), PRODUCE, None, "orders")


REFUSALS = [
    pytest.param(PRODUCE, Q, "orders", "user bob may not produce to /queue/orders"),
    pytest.param(CONSUME, T, "prices", "user bob may not consume from /topic/prices"),
    pytest.param(BROWSE, Q, "orders", "user bob may not browse /queue/orders"),
    pytest.param(CREATE, Q, "new", "user bob may not create /queue/new"),
    pytest.param(CONNECT, None, "NORMAL", "user bob may not connect"),
]


@pytest.mark.parametrize(("operation", "kind", "name", "summary"), REFUSALS)
def test_refusals_name_the_user_the_operation_and_the_destination(
    tmp_path: Path,
    operation: Operation,
    kind: DestinationKind | None,
    name: str,
    summary: str,
) -> None:
    path = tmp_path / "acl.properties"
    path.write_text("queue.nothing.produce.allow.user=nobody\n")
    access = AccessControl(path)
    with pytest.raises(Forbidden) as caught:
        access.check(who("bob"), operation, kind, name)
    error = caught.value
    assert error.status is Status.FORBIDDEN
    assert error.summary == summary
    assert str(error).startswith(f"{summary}: the broker's access rules do not allow it")
    assert ".allow.user=bob" in str(error)  # what an administrator would add
    assert error.destination == (None if kind is None else f"/{kind.value}/{name}")
    assert str(path) not in str(error)  # the client is not told where the broker's files are
