"""The swap area: message data that does not fit in memory, kept on disk until freed.

Nothing here is durable: files are never fsynced, and `open()` wipes what a previous run left.
Data goes to segment files `<n>.swap` (n zero-padded to 20 digits), appended to the active one
until it would pass `segment_size` bytes; a segment whose data is all freed is deleted at once
(the active one once it is no longer active).

Each entry is a 12-byte header `<4sQ` (state tag b"LIVE" or b"FREE", data length in bytes), then the
data; a `SwapRef` points at the data. The tag is how `free()` and `read()` catch a ref freed twice
or never issued without keeping any memory per ref: in memory there is only a count of live refs
per segment.
"""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path
from typing import Final

from sluiceway.core.containers.pending import SwapRef
from sluiceway.errors import SluicewayError

_ENTRY: Final = struct.Struct("<4sQ")
assert _ENTRY.size == 12
_LIVE: Final = b"LIVE"
_FREE: Final = b"FREE"
_NAME: Final = re.compile(r"\d{20}\.swap")


class SwapError(SluicewayError):
    """The swap area cannot store or return data (closed, or a disk error)."""


class SwapArea:
    """Append-only files for swapped-out message data; use from one thread."""

    def __init__(self, directory: Path, *, segment_size: int = 16 * 1024 * 1024) -> None:
        if segment_size <= _ENTRY.size:
            raise SwapError(f"swap segment_size {segment_size} is too small: use 13 bytes or more")
        self._directory = Path(directory)
        self._segment_size = segment_size
        self._fds: dict[int, int] = {}  # open segments by number
        self._sizes: dict[int, int] = {}  # bytes per segment
        self._live: dict[int, int] = {}  # live refs per segment
        self._active = 0  # the segment writes go to; 0 before the first write
        self._last_number = 0
        self._opened = False

    def open(self) -> None:
        """Create the directory and delete the segment files a previous run left in it.

        Only files named like swap segments are deleted: a directory set by mistake to one that
        holds other data loses nothing else.
        """
        self._directory.mkdir(parents=True, exist_ok=True)
        for entry in os.scandir(self._directory):
            if _NAME.fullmatch(entry.name):
                os.unlink(entry.path)
        self._opened = True

    def write(self, data: bytes) -> SwapRef:
        """Append `data` to the active segment, starting a new one when it is full."""
        if not self._opened:
            raise SwapError("the swap area is not open; call open() first")
        entry = _ENTRY.size + len(data)
        size = self._sizes.get(self._active, 0)
        if self._active == 0 or (size > 0 and size + entry > self._segment_size):
            self._start_segment()
            size = 0
        header = _ENTRY.pack(_LIVE, len(data))
        try:
            fd = self._fds[self._active]
            written = os.writev(fd, [header, data])
            if written < entry:  # a short write (the disk is nearly full): finish it or raise
                rest = memoryview(header + data)[written:]
                while rest:
                    rest = rest[os.write(fd, rest) :]
        except OSError as error:
            raise SwapError(f"cannot write {len(data)} bytes to the swap area: {error}") from error
        self._sizes[self._active] = size + entry
        self._live[self._active] += 1
        return SwapRef(self._active, size + _ENTRY.size, len(data))

    def read(self, ref: SwapRef) -> bytes:
        """The data `ref` points at; ValueError if it was freed or never issued."""
        fd = self._entry_fd(ref)
        block = os.pread(fd, _ENTRY.size + ref.length, ref.offset - _ENTRY.size)
        self._check_live(ref, block)
        return block[_ENTRY.size :]

    def free(self, ref: SwapRef) -> None:
        """The data is no longer needed; ValueError if it was already freed or never issued."""
        fd = self._entry_fd(ref)
        self._check_live(ref, os.pread(fd, _ENTRY.size, ref.offset - _ENTRY.size))
        os.pwrite(fd, _FREE, ref.offset - _ENTRY.size)
        self._live[ref.segment] -= 1
        if self._live[ref.segment] == 0 and ref.segment != self._active:
            self._delete(ref.segment)

    @property
    def bytes_on_disk(self) -> int:
        """Bytes in all segment files, entry headers and freed data not yet deleted included."""
        return sum(self._sizes.values())

    @property
    def segment_count(self) -> int:
        return len(self._fds)

    def close(self) -> None:
        """Close and delete every segment: the data is unreachable once the refs are gone."""
        for number in list(self._fds):
            self._delete(number)
        self._active = 0
        self._opened = False

    def _start_segment(self) -> None:
        old = self._active
        self._last_number += 1
        self._active = self._last_number
        path = self._path(self._active)
        try:
            self._fds[self._active] = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        except OSError as error:
            raise SwapError(f"cannot create swap segment {path}: {error}") from error
        self._sizes[self._active] = 0
        self._live[self._active] = 0
        if old and self._live[old] == 0:
            self._delete(old)

    def _delete(self, number: int) -> None:
        os.close(self._fds.pop(number))
        del self._sizes[number], self._live[number]
        self._path(number).unlink()

    def _path(self, number: int) -> Path:
        return self._directory / f"{number:020d}.swap"

    def _entry_fd(self, ref: SwapRef) -> int:
        fd = self._fds.get(ref.segment)
        inside = _ENTRY.size <= ref.offset <= self._sizes.get(ref.segment, 0) - ref.length
        if fd is None or not inside or ref.length < 0:
            raise ValueError(f"{ref} was never issued by this swap area, or its segment was freed")
        return fd

    @staticmethod
    def _check_live(ref: SwapRef, block: bytes) -> None:
        tag, length = _ENTRY.unpack_from(block)
        if tag == _FREE and length == ref.length:
            raise ValueError(f"{ref} was already freed")
        if tag != _LIVE or length != ref.length:
            raise ValueError(f"{ref} was never issued by this swap area")
