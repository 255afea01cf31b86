"""The store model (test_store_model.py) over the jdbc store: the same histories, the journal's
files in PostgreSQL (persist.pg_files) instead of on a simulated disk.

On PostgreSQL a crash of the process and a power cut are one: what the last commit holds
survives, the pending operations do not (every crash is checked as a power cut, which allows
that loss and nothing more). A crash in the middle of an operation is PgFiles.arm (a commit it
stops took effect or not); a failed fsync is a fence that refuses a commit; the medium does not
fill up. The model must find what it finds on a disk: 0 lost, 0 resurrected, 0 partial COMMITs.
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from sluiceway.persist.database import Database
from sluiceway.persist.files import Files
from sluiceway.persist.pg_files import Fenced, PgFiles
from sluiceway.persist.schema import ensure_schema
from sluiceway.persist.simulated import Fault
from tests.persistence.ledger import Stop
from tests.persistence.test_store_model import StoreMachine, run_machine
from tests.soak import iterations

_STORES = itertools.count()


class PgMedium:
    """SimulatedDisk's controls over PgFiles: one PgFiles per broker life, on one store."""

    def __init__(self, database: Database, root: Path) -> None:
        self.database, self.root = database, root
        self.broker_id = f"model{next(_STORES)}"
        self.fault: Fault | None = None
        self.capacity: int | None = None  # (never set: the machine does not squeeze)
        self.files = self._open()

    def _open(self) -> PgFiles:
        return PgFiles(self.database, "model", self.broker_id, self.root, fence=self._fence)

    def _fence(self, connection: object) -> None:
        """A failed fsync, asked for by the machine: the fence refuses the commit."""
        error = self.fault("fsync", self.root) if self.fault is not None else None
        if error is not None:
            raise Fenced(str(error))

    def arm(self, operations: int, rng: random.Random) -> None:
        self.files.arm(operations, rng)

    def disarm(self) -> None:
        self.files.disarm()

    def crash(self, rng: random.Random, *, power: bool) -> None:
        self.files.abandon()
        self.files = self._open()

    def stopped(self) -> None:
        """The broker stopped cleanly: what it wrote and did not fsync is committed, as the
        operating system writes a file's pages after the process ends."""
        self.fault = None
        self.files.shutdown()
        self.files = self._open()

    def used(self) -> int:
        raise AssertionError("the jdbc store is not squeezed")

    def close(self) -> None:
        self.files.abandon()


class PgStoreMachine(StoreMachine):
    SQUEEZABLE = False
    database: Database | None = None  # set by the test

    def __init__(self) -> None:
        super().__init__()
        assert self.database is not None
        self.medium = PgMedium(self.database, self.root)
        self.disk = self.medium

    def files(self) -> Files:
        return self.medium.files

    def crashed(self, stop: Stop, why: str) -> None:
        super().crashed(Stop.POWER, why)  # the pending operations are lost, whatever stopped

    def restarted(self, stop: Stop, why: str) -> None:
        if stop is Stop.CLEAN:
            self.medium.stopped()
        super().restarted(stop, why)

    def teardown(self) -> None:
        super().teardown()
        self.medium.close()


EXAMPLES = iterations(suite=200, soak=5_000)


@pytest.mark.slow
@pytest.mark.soak
@pytest.mark.timeout(120 + EXAMPLES)  # about 0.3 s an example, on a loaded machine
def test_the_jdbc_store_against_its_model(pg_url: str) -> None:
    database = Database(pg_url)
    ensure_schema(database)
    PgStoreMachine.database = database
    run_machine(PgStoreMachine, EXAMPLES, "jdbc ")
