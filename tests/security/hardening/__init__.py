"""The hardening table's rows and probes: a row (Case) says what is tried and what must be
seen; its probe starts the broker through a Trial. tests/security/test_hardening.py holds the
table; the modules here hold the probes, one module per area."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

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
