"""The swap area: write, read, free, segment lifecycle."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluiceway.core.containers.pending import SwapRef
from sluiceway.persist.swap import SwapArea, SwapError

ENTRY = 12  # header bytes before each entry's data


@pytest.fixture
def swap(tmp_path: Path) -> Iterator[SwapArea]:
    area = SwapArea(tmp_path / "swap", segment_size=100)
    area.open()
    yield area
    area.close()


def files(area_directory: Path) -> list[str]:
    return sorted(os.listdir(area_directory))


def test_write_read_free(swap: SwapArea, tmp_path: Path) -> None:
    first = swap.write(b"hello")
    second = swap.write(b"")
    third = swap.write(b"world" * 3)
    assert first == SwapRef(segment=1, offset=ENTRY, length=5)
    assert second == SwapRef(1, ENTRY + 5 + ENTRY, 0)
    assert swap.read(third) == b"world" * 3
    assert swap.read(second) == b""
    assert swap.read(first) == b"hello"
    swap.free(second)
    assert swap.read(first) == b"hello"
    assert swap.bytes_on_disk == 3 * ENTRY + 5 + 15
    assert swap.bytes_on_disk == (tmp_path / "swap" / f"{1:020d}.swap").stat().st_size


def test_segments_rotate_and_go_when_all_freed(swap: SwapArea, tmp_path: Path) -> None:
    refs = [swap.write(bytes([i]) * 30) for i in range(6)]  # 42 bytes each: two per segment
    assert [r.segment for r in refs] == [1, 1, 2, 2, 3, 3]
    assert swap.segment_count == 3
    assert swap.bytes_on_disk == 6 * 42
    swap.free(refs[0])
    assert swap.segment_count == 3  # one live ref left in segment 1
    swap.free(refs[1])
    assert swap.segment_count == 2
    assert files(tmp_path / "swap") == [f"{2:020d}.swap", f"{3:020d}.swap"]
    assert swap.bytes_on_disk == 4 * 42
    swap.free(refs[4])
    swap.free(refs[5])
    assert swap.segment_count == 2  # the active segment is kept, empty of live data
    assert swap.read(refs[2]) == bytes([2]) * 30
    # once no longer active, an all-freed segment goes at the next write
    refs.append(swap.write(b"x" * 60))
    assert refs[-1].segment == 4
    assert files(tmp_path / "swap") == [f"{2:020d}.swap", f"{4:020d}.swap"]


def test_oversized_entry_gets_a_segment_of_its_own(swap: SwapArea) -> None:
    small = swap.write(b"s")
    big = swap.write(b"B" * 500)
    after = swap.write(b"a")
    assert (small.segment, big.segment, after.segment) == (1, 2, 3)
    assert swap.read(big) == b"B" * 500


def test_free_twice_or_unknown_raises(swap: SwapArea) -> None:
    ref = swap.write(b"data")
    keep = swap.write(b"more")
    swap.free(ref)
    with pytest.raises(ValueError, match="already freed"):
        swap.free(ref)
    with pytest.raises(ValueError, match="already freed"):
        swap.read(ref)
    with pytest.raises(ValueError, match="never issued"):
        swap.free(SwapRef(keep.segment, keep.offset + 1, keep.length))
    with pytest.raises(ValueError, match="never issued"):
        swap.free(SwapRef(keep.segment, keep.offset, keep.length + 1))
    with pytest.raises(ValueError, match="never issued"):
        swap.free(SwapRef(99, ENTRY, 1))
    assert swap.read(keep) == b"more"  # the refused frees changed nothing


def test_free_after_the_segment_was_deleted_raises(swap: SwapArea) -> None:
    ref = swap.write(b"x" * 80)
    swap.write(b"y" * 80)  # segment 1 is no longer active
    swap.free(ref)
    assert swap.segment_count == 1
    with pytest.raises(ValueError, match="never issued"):
        swap.free(ref)


def test_open_wipes_a_previous_run(tmp_path: Path) -> None:
    directory = tmp_path / "swap"
    directory.mkdir()
    (directory / f"{1:020d}.swap").write_bytes(b"old data")
    (directory / f"{7:020d}.swap").write_bytes(b"more old data")
    (directory / "notes.txt").write_text("not ours")
    area = SwapArea(directory)
    area.open()
    assert files(directory) == ["notes.txt"]
    assert area.bytes_on_disk == 0
    assert area.segment_count == 0
    ref = area.write(b"new")
    assert area.read(ref) == b"new"
    area.close()
    assert files(directory) == ["notes.txt"]  # close deletes the segments


def test_not_open_or_bad_size(tmp_path: Path) -> None:
    area = SwapArea(tmp_path)
    with pytest.raises(SwapError, match="not open"):
        area.write(b"x")
    with pytest.raises(SwapError, match="too small"):
        SwapArea(tmp_path, segment_size=12)
