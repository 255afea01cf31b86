"""Reaching the PostgreSQL database of the jdbc store: the connection settings, taken from the
broker's configuration, and the errors that say what is wrong with them.

The URL is a libpq connection URI; the user and the password may be given apart from it
(`imq.persist.jdbc.postgresql.user`, `.password.file`), so the configuration need not hold a
secret. A password file others may read is refused, as ssh refuses such a key. Messages name
the database by its URL without the password.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit, urlunsplit

from sluiceway.config.cluster import ClusterConfig
from sluiceway.core.model.store import StoreError

if TYPE_CHECKING:
    import psycopg

INSTALL_HINT: Final = "pip install 'sluiceway[cluster]' (psycopg 3)"


class DatabaseError(StoreError):
    """The database of the jdbc store cannot be used: unreachable, refused the login, holds a
    schema this broker cannot use. The message says which and what to do."""


def redact(url: str) -> str:
    """The URL without its password, for messages and the log."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit((parts.scheme, f"{user}{host}", parts.path, parts.query, parts.fragment))


def read_password_file(path: str) -> str:
    """The first line of `path`; refused when the file is missing or others may read it."""
    file = Path(path)
    try:
        mode = file.stat().st_mode
        text = file.read_text(encoding="utf-8")
    except OSError as error:
        raise DatabaseError(
            f"cannot read the database password file {path} "
            f"(imq.persist.jdbc.postgresql.password.file): {error.strerror or error}"
        ) from error
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise DatabaseError(
            f"the database password file {path} may be read by others (mode "
            f"{stat.S_IMODE(mode):o}): make it readable by the broker's user only "
            f"(chmod 600 {path})"
        )
    lines = text.splitlines()
    return lines[0] if lines else ""


@dataclass(frozen=True, slots=True)
class Database:
    """Where the jdbc store's database is and how to log in to it."""

    url: str
    user: str = ""
    password: str | None = None  # from the password file; None: the URL's, or libpq's own
    connect_timeout: float = 5.0
    # What the server shows for its connections (pg_stat_activity): a broker's name its own
    # (member_application), so that the member taking its store over can cut them off.
    application_name: str = "sluiceway"

    @classmethod
    def from_config(
        cls,
        url: str,
        user: str,
        password_file: str,
        connect_timeout: float,
        *,
        application_name: str = "sluiceway",
    ) -> Database:
        password = read_password_file(password_file) if password_file else None
        return cls(url, user, password, connect_timeout, application_name)

    @property
    def shown(self) -> str:
        """The URL for messages: no password."""
        return redact(self.url)

    def connect(self, *, autocommit: bool = False) -> psycopg.Connection[tuple[object, ...]]:
        """A new connection; DatabaseError naming the database and the reason when there is
        none to be had."""
        try:
            import psycopg  # noqa: PLC0415  (late: the driver is the cluster extra's)
        except ImportError as error:
            raise DatabaseError(
                f"imq.persist.store=jdbc needs the PostgreSQL driver: {INSTALL_HINT}"
            ) from error
        options: dict[str, object] = {
            "autocommit": autocommit,
            "connect_timeout": max(1, round(self.connect_timeout)),
            "application_name": self.application_name,
        }
        if self.user:
            options["user"] = self.user
        if self.password is not None:
            options["password"] = self.password
        try:
            return psycopg.connect(self.url, **options)  # type: ignore[arg-type]
        except psycopg.OperationalError as error:
            reason = " ".join(str(error).split()) or type(error).__name__
            raise DatabaseError(
                f"cannot reach the database {self.shown}: {reason}. Check that PostgreSQL runs "
                "there and accepts this user (imq.persist.jdbc.postgresql.property.url, .user, "
                ".password.file)"
            ) from error


def member_application(cluster_id: str, broker_id: str) -> str:
    """The application name of every connection of broker `broker_id` of cluster `cluster_id`
    (both at most 23 characters: it fits PostgreSQL's 63)."""
    return f"sluiceway {cluster_id}/{broker_id}"


def member_database(config: ClusterConfig) -> Database:
    """The database of broker `config.broker_id`'s jdbc store and cluster, as the configuration
    names it, its connections named after the broker (member_application)."""
    return Database.from_config(
        config.jdbc_url,
        config.jdbc_user,
        config.jdbc_password_file,
        config.jdbc_connect_timeout,
        application_name=member_application(config.cluster_id, config.broker_id),
    )
