"""The simulated disk: what survives a process crash and a power cut, and failures on demand."""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import pytest

from sluiceway.persist.simulated import SimulatedDisk

ROOT = Path("/disk")
FILE = ROOT / "f"
CREATE = os.O_RDWR | os.O_CREAT | os.O_APPEND


def disk_with_directory() -> SimulatedDisk:
    disk = SimulatedDisk()
    disk.names(ROOT)
    return disk


def sync_directory(disk: SimulatedDisk, directory: Path = ROOT) -> None:
    fd = disk.open(directory, os.O_RDONLY)
    disk.fsync(fd)
    disk.close(fd)


def file_synced(disk: SimulatedDisk, data: bytes, *, name_too: bool) -> int:
    """FILE holding `data`, fsynced (and its directory entry, with `name_too`); its fd."""
    fd = disk.open(FILE, CREATE)
    disk.write(fd, data)
    disk.fsync(fd)
    if name_too:
        sync_directory(disk)
    return fd


def test_a_process_crash_keeps_everything_written() -> None:
    disk = disk_with_directory()
    fd = disk.open(FILE, CREATE)
    disk.write(fd, b"written, never synced")
    disk.crash(random.Random(1), power=False)
    assert disk.files(ROOT) == {"f": b"written, never synced"}


def test_a_power_cut_keeps_what_was_synced_and_a_prefix_of_the_rest() -> None:
    seen = set()
    for seed in range(200):
        disk = disk_with_directory()
        fd = file_synced(disk, b"synced", name_too=True)
        disk.write(fd, b"+later")
        disk.crash(random.Random(seed), power=True)
        content = disk.files(ROOT)["f"]
        assert (b"synced+later").startswith(content)
        assert content.startswith(b"synced")
        seen.add(content)
    assert len(seen) == len("+later") + 1  # every prefix happens


def test_a_file_whose_directory_was_not_synced_may_vanish_in_a_power_cut() -> None:
    outcomes = set()
    for seed in range(50):
        disk = disk_with_directory()
        file_synced(disk, b"x", name_too=False)  # its data, not its name
        disk.crash(random.Random(seed), power=True)
        outcomes.add(tuple(disk.files(ROOT).items()))
    assert outcomes == {(), (("f", b"x"),)}
    disk = disk_with_directory()
    file_synced(disk, b"x", name_too=True)
    disk.crash(random.Random(0), power=True)
    assert disk.files(ROOT) == {"f": b"x"}


def test_renames_survive_in_order_or_not_at_all() -> None:
    for seed in range(50):
        disk = disk_with_directory()
        for name, data in (("old", b"old"), ("new.tmp", b"new")):
            fd = disk.open(ROOT / name, CREATE)
            disk.write(fd, data)
            disk.fsync(fd)
            disk.close(fd)
        sync_directory(disk)
        disk.replace(ROOT / "new.tmp", ROOT / "old")
        disk.crash(random.Random(seed), power=True)
        assert disk.files(ROOT) in ({"old": b"old", "new.tmp": b"new"}, {"old": b"new"})


def test_a_full_disk_takes_what_fits_then_refuses() -> None:
    disk = disk_with_directory()
    disk.capacity = 10
    fd = disk.open(FILE, CREATE)
    assert disk.write(fd, b"0123456789abc") == 10
    with pytest.raises(OSError, match="no space") as caught:
        disk.write(fd, b"abc")
    assert caught.value.errno == errno.ENOSPC
    disk.capacity = None
    assert disk.write(fd, b"abc") == 3
    assert disk.files(ROOT)["f"] == b"0123456789abc"


def test_operations_fail_on_demand() -> None:
    disk = disk_with_directory()
    fd = disk.open(FILE, CREATE)
    disk.fault = lambda operation, path: (
        OSError(errno.EIO, "input/output error") if operation == "fsync" else None
    )
    disk.write(fd, b"x")
    with pytest.raises(OSError, match="input/output") as caught:
        disk.fsync(fd)
    assert caught.value.errno == errno.EIO
    disk.crash(random.Random(3), power=True)
    assert disk.files(ROOT) == {}  # neither the data nor the name was ever durable


def test_descriptors_and_names_behave_as_the_operating_systems() -> None:
    disk = disk_with_directory()
    with pytest.raises(FileNotFoundError):
        disk.open(ROOT / "missing", os.O_RDONLY)
    fd = disk.open(FILE, CREATE | os.O_EXCL)
    with pytest.raises(FileExistsError):
        disk.open(FILE, CREATE | os.O_EXCL)
    disk.write(fd, b"hello world")
    assert disk.pread(fd, 5, 6) == b"world"
    assert disk.size(fd) == 11
    disk.truncate(fd, 5)
    assert disk.pread(fd, 100, 0) == b"hello"
    disk.close(fd)
    with pytest.raises(OSError, match="bad file descriptor"):
        disk.close(fd)
    disk.make_directory(ROOT / "sub")
    assert sorted(disk.names(ROOT)) == ["f", "sub"]
    assert disk.exists(ROOT / "sub")
    disk.remove(FILE)
    assert not disk.exists(FILE)
    with pytest.raises(FileNotFoundError):
        disk.remove(FILE)
