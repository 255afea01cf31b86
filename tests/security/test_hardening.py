"""What a careless or hostile client meets, one row per case (docs/security.md).

Each row's probe starts a real broker through its Trial (authentication on, the users of USERS,
the rules of RULES or the row's own, the row's properties, and any the probe adds, such as the
files it made in `trial.directory`), does what the row names over real sockets, and returns what
it saw; the row says what that must be. A probe may expect the start itself to fail. What a
probe returns is what a client or an operator can observe (a status, a message, whether the
socket closed, a count), not the broker's internals.

The rows are grouped by what they harden; each group is a list below, and CASES joins them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.security.conftest import Secured, SecuredFactory


@dataclass(frozen=True)
class Case:
    """One row: the broker's properties, what is tried against it, and what must be seen."""

    id: str
    probe: Callable[[Trial], object]
    expected: object
    properties: dict[str, str] = field(default_factory=dict)
    rules: str | None = None  # the access rules file; None: the suite's RULES


@dataclass
class Trial:
    """What a probe starts its broker with."""

    case: Case
    factory: SecuredFactory
    directory: Path  # the test's own directory, for files the probe makes

    def start(self, **properties: str) -> Secured:
        """The row's broker, with `properties` added to the row's."""
        values = {**self.case.properties, **properties}
        if self.case.rules is None:
            return self.factory(**values)
        return self.factory(self.case.rules, **values)


# -- the input budget: partly received frames, frames before CONNECT ------------------------

INPUT_CASES: list[Case] = []


# -- password checks: off the event loop, cached, slowed down for repeated failures ----------

PASSWORD_CASES: list[Case] = []


# -- listeners and TLS: the plain port off, certificates checked at start --------------------

LISTENER_CASES: list[Case] = []


# -- browsers: Origin on the WebSocket endpoint, Host on the admin endpoint, /ws -------------

BROWSER_CASES: list[Case] = []


# -- the admin endpoint: its rules, slow and idle requests -----------------------------------

ADMIN_CASES: list[Case] = []


# -- access changes: deleted users, revoked rights, connections destroyed --------------------

ACCESS_CHANGE_CASES: list[Case] = []


# -- counts: connections, transactions, cursors and lease groups -----------------------------

COUNT_CASES: list[Case] = []


CASES = [
    *INPUT_CASES,
    *PASSWORD_CASES,
    *LISTENER_CASES,
    *BROWSER_CASES,
    *ADMIN_CASES,
    *ACCESS_CHANGE_CASES,
    *COUNT_CASES,
]


@pytest.mark.parametrize("case", [pytest.param(case, id=case.id) for case in CASES])
def test_case(case: Case, secured_factory: SecuredFactory, tmp_path: Path) -> None:
    assert case.probe(Trial(case, secured_factory, tmp_path)) == case.expected
