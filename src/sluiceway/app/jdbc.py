"""Opening the jdbc store (`imq.persist.store=jdbc`): the database, its tables, and the journal's
files in it for this broker.

The broker creates its tables in an empty database, and upgrades an older schema, itself
(persist.schema.ensure_schema); a schema newer than the broker, an unreachable database, or
another process writing this broker's store stop the start-up with a DatabaseError that says
which and what to do. The journal's files are this broker's rows, keyed by (imq.cluster.clusterid,
imq.brokerid); the local data directory still holds the lock and the swap area, which need not
outlive the process.
"""

from __future__ import annotations

from pathlib import Path

from sluiceway.config import BrokerConfig
from sluiceway.persist.database import member_database
from sluiceway.persist.pg_files import Fence, PgFiles
from sluiceway.persist.schema import ensure_schema


def open_store_files(config: BrokerConfig, root: Path, fence: Fence | None = None) -> PgFiles:
    """This broker's journal files in the database, its tables made current first. `fence`
    runs in every commit (the cluster membership's check that the store is still this
    broker's)."""
    database = member_database(config)
    ensure_schema(database)
    return PgFiles(database, config.cluster_id, config.broker_id, root, fence=fence)
