"""Swap areas for the spilling tests: a small segment size, and a check that nothing is live."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from sluiceway.persist.swap import SwapArea

SEGMENT_SIZE: Final = 64 * 1024  # a few chunks per segment
ENTRY: Final = 12  # bytes of header before each swap entry


def assert_swap_empty(area: SwapArea, directory: Path) -> None:
    """No live data in the swap area.

    A segment whose data is all freed is deleted, except the active one, which goes when the next
    write needs a new segment. So after a write that fills a segment by itself, a single segment
    of exactly that size is left only if nothing written before is still live.
    """
    assert area.segment_count <= 1
    if area.segment_count:
        probe = area.write(bytes(SEGMENT_SIZE - ENTRY))  # needs a segment of its own
        assert area.segment_count == 1  # so the previous active one held nothing live
        assert area.bytes_on_disk == SEGMENT_SIZE
        area.free(probe)
    assert len(list(directory.glob("*.swap"))) == area.segment_count
