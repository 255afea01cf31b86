"""The users file: user names, salted password hashes, groups (what Open MQ's imqusermgr manages).

One user per line, fields separated by colons:

    name:scrypt$<n>$<r>$<p>$<salt, base64>$<hash, base64>:group,group

Passwords are hashed with scrypt (hashlib, the standard library), with a random 16-byte salt per
user; the file is written atomically with mode 0600. Lines starting with `#` are comments. The
group `admin` may use the admin API; every user may connect (access rules may say more, see
security.access).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import os
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from sluiceway.config import BrokerConfig
from sluiceway.errors import ConfigError

ADMIN_GROUP: Final = "admin"
# scrypt cost: 2**14 iterations, 8 KiB blocks: about 20 ms and 16 MiB per check.
SCRYPT_N: Final = 2**14
SCRYPT_R: Final = 8
SCRYPT_P: Final = 1
_NAME_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-@")


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a connection or an admin request authenticated as."""

    user: str
    groups: frozenset[str]

    @property
    def is_admin(self) -> bool:
        return ADMIN_GROUP in self.groups


ANONYMOUS: Final = Principal("", frozenset({ADMIN_GROUP}))  # authentication off: loopback only


@dataclass(frozen=True, slots=True)
class User:
    name: str
    password_hash: str
    groups: tuple[str, ...]


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(16)
    digest = _scrypt(password, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)
    b64 = base64.b64encode
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${b64(salt).decode()}${b64(digest).decode()}"


def verify_password(password: str, stored: str) -> bool:
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        expected = base64.b64decode(digest)
        actual = _scrypt(password, base64.b64decode(salt), int(n), int(r), int(p))
    except ValueError:
        return False
    return hmac.compare_digest(actual, expected)


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, maxmem=64 * 1024 * 1024)


def check_name(name: str, what: str = "user name") -> None:
    if not name or not set(name) <= _NAME_CHARS:
        raise ValueError(
            f"{what} {name!r} must be non-empty and use only letters, digits and . _ - @"
        )


def users_path(config: BrokerConfig) -> Path:
    """The users file in force: imq.user_repository.file.filename, else passwd in the data
    directory."""
    if config.users_file:
        return Path(config.users_file)
    return Path(config.data_directory) / "passwd"


class UserFile:
    """Reads and writes one users file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, User]:
        """The users by name; no file means no users. A malformed line is an error naming it."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise ConfigError("imq.user_repository.file.filename", f"{self.path}: {exc}") from None
        users: dict[str, User] = {}
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            fields = line.split(":")
            if len(fields) != 3 or not fields[0] or not fields[1].startswith("scrypt$"):
                raise ConfigError(
                    "imq.user_repository.file.filename",
                    f"{self.path}, line {number}: expected name:scrypt$...:groups; manage the "
                    "file with `sluiceway cmd user`",
                )
            groups = tuple(g for g in fields[2].split(",") if g)
            users[fields[0]] = User(fields[0], fields[1], groups)
        return users

    def save(self, users: dict[str, User]) -> None:
        """Write atomically (a temporary file renamed over the old one), readable by its owner
        only."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lines = ["# Sluiceway users: name:password hash:groups (managed by `sluiceway cmd user`)"]
        lines += [f"{u.name}:{u.password_hash}:{','.join(u.groups)}" for u in users.values()]
        fd, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".passwd-")
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write("\n".join(lines) + "\n")
            os.chmod(temporary, 0o600)
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    def add(self, name: str, password: str, groups: tuple[str, ...]) -> None:
        check_name(name)
        for group in groups:
            check_name(group, "group name")
        if not password:
            raise ValueError("the password must not be empty")
        users = self.load()
        users[name] = User(name, hash_password(password), groups)
        self.save(users)

    def delete(self, name: str) -> bool:
        users = self.load()
        if users.pop(name, None) is None:
            return False
        self.save(users)
        return True


# What tells one state of the users file from another (None: no file). The inode catches a file
# replaced by rename (as `sluiceway cmd user` writes it), so a changed password is seen even when
# the new file has the old one's size and modification time.
Stamp = tuple[int, int, int, int] | None


def _stamp(path: Path) -> Stamp:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return (-1, exc.errno or 0, 0, 0)  # unreadable: loading it says why
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class Authenticator:
    """Checks credentials against the users file, re-reading it when it changes on disk.

    `refresh` and `find` are cheap (a stat, and a read when the file changed): they run on the
    broker's event loop. `check` runs scrypt (tens of ms): security.logins runs it in a worker
    thread. `authenticate` does both, for callers that may block."""

    def __init__(self, path: Path) -> None:
        self._file = UserFile(path)
        self._users: dict[str, User] = {}
        self._stamp: Stamp | tuple[()] = ()  # (): never read
        self.refresh()

    @property
    def path(self) -> Path:
        return self._file.path

    def refresh(self) -> Stamp:
        """Read the file again if it changed; the stamp of the state now in force. Raises
        ConfigError (naming the file and the line) when it cannot be read or is malformed; the
        users read before stay in force meanwhile, and the next call tries again."""
        stamp = _stamp(self._file.path)
        if stamp != self._stamp:
            self._users = self._file.load()
            self._stamp = stamp
        return stamp

    def find(self, name: str | None) -> User | None:
        """The user of that name in the file as last read (see `refresh`)."""
        return self._users.get(name or "")

    def authenticate(self, name: str | None, password: str | None) -> Principal | None:
        """The principal for these credentials, or None (unknown user or wrong password)."""
        self.refresh()
        return check(self.find(name), password)

    @property
    def empty(self) -> bool:
        self.refresh()
        return not self._users


def check(user: User | None, password: str | None) -> Principal | None:
    """The principal if `password` is `user`'s, else None; scrypt, tens of milliseconds. For an
    unknown user (None) it spends the same time as for a wrong password, so a probe cannot tell
    which users exist."""
    if user is None:
        verify_password(password or "", _dummy_hash())
        return None
    if not verify_password(password or "", user.password_hash):
        return None
    return Principal(user.name, frozenset(user.groups))


@functools.cache
def _dummy_hash() -> str:
    return hash_password(secrets.token_hex(8))
