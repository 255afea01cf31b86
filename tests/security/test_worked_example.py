"""The worked example of docs/security.md, end to end, as the page writes it: its users and
groups, its rules file verbatim, every row of its table (outcome, message and deciding rule),
and the `sluiceway cmd create dst` step it prescribes, run as a process."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from sluiceway.naming import DestinationKind
from sluiceway.security.access import AccessControl, Operation
from sluiceway.security.users import Principal
from tests.e2e.rawclient import RawClient
from tests.security.access_support import (
    WORKED_USERS,
    admin_status,
    client,
    run_as_written,
    worked_example,
    worked_users,
)
from tests.security.conftest import Secured, SecuredFactory

REQUEST = re.compile(
    r"`(?P<user>[\w.@-]+)` (?P<verb>connects|uses the admin endpoint|sends to|consumes|browses)"
    r"(?: `(?P<path>/[^`]+)`)?(?P<before> before it exists)?"
)
RULE = re.compile(r"^`(?P<key>[a-zA-Z*.]+\.(?:allow|deny)\.(?:user|group))=(?P<name>[^`]+)`")
OPERATIONS = {"sends to": Operation.PRODUCE, "consumes": Operation.CONSUME}


def test_the_users_are_the_pages() -> None:
    line = worked_example().users_line
    found: dict[str, tuple[str, ...]] = {}
    for names, group in re.findall(
        r"((?:`[\w.@-]+`(?:, | and )?)+) \((`[\w.@-]+`|no group)\)", line
    ):
        for name in re.findall(r"`([^`]+)`", names):
            found[name] = (group.strip("`"),) if group != "no group" else ()
    assert found == {name: groups for name, (_, groups) in WORKED_USERS.items()}


def test_the_rules_load_without_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "accesscontrol.properties"
    path.write_text(worked_example().rules)
    access = AccessControl(path)
    assert access.problem is None
    assert "WARNING" not in caplog.text


def test_every_row_of_the_table(secured_factory: SecuredFactory, tmp_path: Path) -> None:
    example = worked_example()
    assert len(example.rows) >= 12, example.rows
    secured = secured_factory(example.rules, **worked_users(tmp_path))
    rules = AccessControl(secured.access_file)
    # The rows about a destination before it exists first, then the administrator's step the
    # page prescribes, then the others (which the page writes for an existing queue).
    before = [row for row in example.rows if row[0].endswith("before it exists")]
    after = [row for row in example.rows if row not in before]
    for row in before:
        _check_row(secured, rules, *row)
    created = run_as_written(secured, example.create_command)
    assert (created.status, created.out, created.err) == (0, "Created queue orders.\n", "")
    for row in after:
        _check_row(secured, rules, *row)


def _check_row(
    secured: Secured, rules: AccessControl, request: str, outcome: str, deciding: str
) -> None:
    match = REQUEST.fullmatch(request)
    assert match is not None, f"a row this test cannot read: {request!r}"
    allowed, message = _outcome(outcome)
    seen_allowed, seen_message = _try(secured, match)
    assert seen_allowed == allowed, request
    if message is not None:
        assert seen_message == message, request
    _check_deciding_rule(rules, match, allowed, deciding)


def _outcome(text: str) -> tuple[bool, str | None]:
    """ "allowed", "refused" or "refused: `message`"."""
    if text == "allowed":
        return True, None
    assert text.startswith("refused"), text
    quoted = re.match(r"refused: `([^`]+)`", text)
    return False, quoted.group(1) if quoted else None


def _try(secured: Secured, match: re.Match[str]) -> tuple[bool, str | None]:
    """Do what the row's request says: (allowed, the refusal's message)."""
    user, verb, path = match["user"], match["verb"], match["path"]
    password = WORKED_USERS[user][0]
    if verb == "uses the admin endpoint":
        status = admin_status(secured.broker.admin_port, user, WORKED_USERS)
        return status == 200, None if status == 200 else "not an administrator"
    if verb == "connects":
        raw = RawClient(secured.port)
        try:
            raw.send("CONNECT", {"accept-version": "1.2", "login": user, "passcode": password})
            deadline = time.monotonic() + raw.timeout
            while not raw.other:
                raw.read_some(deadline)
            frame = raw.other.popleft()
        finally:
            raw.close()
        return frame.command == "CONNECTED", frame.headers.get("message")
    raw = client(secured, user, WORKED_USERS, failed_receipts="true")
    if verb == "sends to":
        receipt = raw.request("SEND", {"destination": path}, b"worked example")
    else:
        headers = {"destination": path, "id": "s1"}
        if verb == "browses":
            headers["browser"] = "true"
        receipt = raw.request("SUBSCRIBE", headers)
    return "status" not in receipt.headers, receipt.headers.get("message")


def _check_deciding_rule(
    rules: AccessControl, match: re.Match[str], allowed: bool, deciding: str
) -> None:
    """Where the third column names a rule, it is the one the broker's rules decide by."""
    named = RULE.match(deciding)
    if named is None:
        return  # the page explains in words (no single rule decides, or a fallback does)
    user, verb, path = match["user"], match["verb"], match["path"]
    principal = Principal(user, frozenset(WORKED_USERS[user][1]))
    if verb == "connects":
        decision = rules.decide(principal, Operation.CONNECT, None, "NORMAL")
    elif verb == "uses the admin endpoint":
        decision = rules.decide(principal, Operation.CONNECT, None, "ADMIN")
    else:
        kind, _, name = path.strip("/").partition("/")
        operation = OPERATIONS.get(verb, Operation.BROWSE)
        decision = rules.decide(principal, operation, DestinationKind(kind), name)
    assert decision.allowed == allowed
    assert (decision.rule, decision.principal) == (named["key"], named["name"])
