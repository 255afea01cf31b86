"""The record format's one table, and the errors of the storage engine."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import sluiceway.persist
from sluiceway.errors import SluicewayError
from sluiceway.persist.format import RECORDS, RESTATED_BY, RecordType
from sluiceway.persist.simulated import SimulatedCrash

R = RecordType


def test_every_record_type_has_one_row_naming_a_codec_that_exists() -> None:
    assert set(RECORDS) == set(RecordType)
    for kind, spec in RECORDS.items():
        assert spec.type is kind
        assert spec.payload
        importlib.import_module(f"sluiceway.{spec.codec}")


def test_the_record_type_codes_are_the_journal_s() -> None:
    """The type byte of every record, as journals on disk hold it: never renumbered."""
    assert {kind.name: int(kind) for kind in RecordType} == {
        "ADD": 1,
        "REMOVE": 2,
        "DELIVERED": 3,
        "SEQ": 4,
        "TX": 5,
        "DURABLE": 6,
        "DURABLE_END": 7,
        "DURABLE_ACK": 8,
        "DURABLE_DELIVERED": 9,
        "SNAPSHOT": 11,
        "TX_CUT": 12,
        "DELIVERED_RUN": 13,
        "REMOVE_RUN": 14,
        "CURSOR": 20,
        "CURSOR_END": 21,
        "LEASE": 22,
        "LEASE_MARK": 23,
        "LEASE_END": 24,
        "LEASE_SNAPSHOT": 25,
        "STAGE_OPEN": 30,
        "STAGE_ADD": 31,
        "STAGE_COMMIT": 32,
        "STAGE_DISCARD": 33,
        "STAGE_SNAPSHOT": 34,
    }


def test_each_state_record_is_restated_by_its_own_snapshot() -> None:
    """A snapshot supersedes the state records of its kind only (recovery relies on it)."""
    assert {
        **dict.fromkeys((R.SNAPSHOT, R.SEQ, R.DURABLE, R.DURABLE_END), R.SNAPSHOT),
        **dict.fromkeys(
            (R.CURSOR, R.CURSOR_END, R.LEASE, R.LEASE_END, R.LEASE_SNAPSHOT), R.LEASE_SNAPSHOT
        ),
        **dict.fromkeys(
            (R.STAGE_OPEN, R.STAGE_COMMIT, R.STAGE_DISCARD, R.STAGE_SNAPSHOT), R.STAGE_SNAPSHOT
        ),
    } == RESTATED_BY


def test_every_error_of_the_storage_engine_is_a_sluiceway_error() -> None:
    # SimulatedCrash stands for the machine stopping: nothing may catch it and go on, so it is
    # no Exception at all, and no error either.
    allowed = {SimulatedCrash}
    found = []
    for info in pkgutil.iter_modules(sluiceway.persist.__path__, "sluiceway.persist."):
        module = importlib.import_module(info.name)
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__ == module.__name__:
                found.append(value)
                if value not in allowed:
                    assert issubclass(value, SluicewayError), value
    assert len(found) > len(allowed)
