"""One broker process per test module (the modules keep their state apart by names)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sluiceway.testing import BrokerProcess


@pytest.fixture(scope="module")
def broker() -> Iterator[BrokerProcess]:
    with BrokerProcess() as process:
        yield process
