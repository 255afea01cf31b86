"""A broker on a journal, opened as the edge (app.storage) opens one."""

from __future__ import annotations

from sluiceway.config import BrokerConfig
from sluiceway.core.broker import Broker
from sluiceway.core.containers.pending import Spill
from sluiceway.core.values.clock import Clock
from sluiceway.persist.journal import Journal
from sluiceway.persist.journal_store import JournalStore
from sluiceway.persist.replay import Recovery
from sluiceway.persist.restoring import restore_broker


def journal_broker(
    config: BrokerConfig, journal: Journal, *, clock: Clock, spill: Spill | None = None
) -> tuple[Broker, Recovery]:
    """A broker kept in `journal`, with what the journal held read back into it."""
    store = JournalStore(journal)
    broker = Broker(config, clock=clock, store=store, spill=spill)
    return broker, restore_broker(store, broker)
