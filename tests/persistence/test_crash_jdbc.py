"""The crash loop of test_crash.py on the jdbc store: the same broker killed with SIGKILL under
persistent load again and again, its journal in PostgreSQL (imq.persist.store=jdbc), and the
same ledger: nothing lost, nothing resurrected, duplicates only for messages delivered and not
acknowledged, all flagged redelivered. Fewer kills in the suite than the file journal's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Final

import psycopg
import pytest

from sluiceway.persist.database import Database
from sluiceway.persist.schema import ensure_schema
from tests.persistence.test_crash import CrashLoop, seed  # noqa: F401  (seed: the fixture)
from tests.soak import iterations

KILLS: Final = iterations(suite=6, soak=100)
BROKER_ID: Final = "crash"
SAMPLE_S: Final = 0.05  # how often the segment files are listed (a query each time)
# A kill forgets the deliveries since the last group commit, as a power cut does on a disk: the
# DELIVERED record is committed with the next group, the MESSAGE is not held for it. A second
# delivery without redelivered:true is accepted for messages first delivered this long before a
# kill (a commit on a loaded machine takes far less), never for older ones.
FORGETTING_S: Final = 1.0


class SegmentRows:
    """Lists the broker's segment files from the database, on a connection of its own."""

    def __init__(self, url: str) -> None:
        self.connection = psycopg.connect(url, autocommit=True)

    def __call__(self) -> dict[str, int]:
        rows = self.connection.execute(
            "SELECT name, size FROM sluiceway_file WHERE broker_id = %s AND name LIKE %s",
            (BROKER_ID, "journal/%.log"),
        ).fetchall()
        return {str(name).rpartition("/")[2]: int(size) for name, size in rows}

    def close(self) -> None:
        self.connection.close()


@pytest.fixture
def segment_rows(pg_url: str) -> Iterator[SegmentRows]:
    lister = SegmentRows(pg_url)
    yield lister
    lister.close()


@pytest.mark.slow
@pytest.mark.soak
@pytest.mark.timeout(120 + 20 * KILLS)
def test_persistent_messages_on_the_jdbc_store_survive_repeated_sigkill(
    tmp_path: Path,
    seed: int,  # noqa: F811  (the fixture imported above)
    pg_url: str,
    segment_rows: SegmentRows,
) -> None:
    args = (
        "-D",
        "imq.persist.store=jdbc",
        "-D",
        f"imq.persist.jdbc.postgresql.property.url={pg_url}",
        "-D",
        f"imq.brokerid={BROKER_ID}",
    )
    ensure_schema(Database(pg_url))  # (the first start would; the lister needs the tables)
    loop = CrashLoop(
        tmp_path / "data",
        seed,
        args=args,
        lister=segment_rows,
        every=SAMPLE_S,
        forgetting=FORGETTING_S,
    )
    for iteration in range(KILLS):
        loop.life(iteration)
    loop.finish()
    print("jdbc " + loop.summary())
    ledger, where = loop.ledger.figures, loop.where(KILLS, "")
    assert ledger.receipted > 50 * KILLS, where
    assert ledger.commits, where
    assert ledger.duplicates, where
