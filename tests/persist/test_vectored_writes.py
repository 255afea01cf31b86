"""segments.write_all_parts: a journal write hands its records' parts to the file as they are
(vectored writes), IOV_MAX at a time, and resumes a short write where it stopped."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import cast

from sluiceway.persist.files import OS_FILES, Data, Files
from sluiceway.persist.segments import IOV_MAX, write_all_parts


class ShortWrites:
    """Takes at most `most` bytes per call, and records how many parts each call was given."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.data = bytearray()
        self.calls: list[int] = []

    def writev(self, fd: int, parts: Sequence[Data]) -> int:
        self.calls.append(len(parts))
        taken = b"".join(parts)[: self.most]
        self.data += taken
        return len(taken)


def test_short_writes_resume_where_they_stopped() -> None:
    parts = [b"head-%d|" % i + bytes([i]) * i for i in range(50)] + [b"", b"end"]
    files = ShortWrites(most=97)
    write_all_parts(cast(Files, files), 0, parts)
    assert bytes(files.data) == b"".join(parts)
    assert len(files.calls) == -(-len(b"".join(parts)) // 97)


def test_more_parts_than_one_call_takes_go_in_several(tmp_path: Path) -> None:
    parts = [b"%06d;" % i for i in range(3 * IOV_MAX + 5)]
    files = ShortWrites(most=1 << 30)
    write_all_parts(cast(Files, files), 0, parts)
    assert files.calls == [IOV_MAX, IOV_MAX, IOV_MAX, 5]
    path = tmp_path / "segment"
    fd = OS_FILES.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        write_all_parts(OS_FILES, fd, parts)
    finally:
        OS_FILES.close(fd)
    assert path.read_bytes() == b"".join(parts)
