"""Fixtures: brokers with authentication on, a users file and an access control file."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Protocol

import pytest

from sluiceway.security.users import UserFile
from sluiceway.testing import BrokerThread
from tests.conftest import BrokerFactory
from tests.e2e.rawclient import RawClient

# Users, their passwords and groups. Every password is distinctive, so a test can look for it
# in a log.
USERS: Final = {
    "alice": ("alice-pw-Q7f2", ("writers",)),
    "bob": ("bob-pw-K9x4", ("readers",)),
    "carol": ("carol-pw-M3z8", ("readers", "writers")),
    "mallory": ("mallory-pw-T5w1", ("writers",)),
    "eve": ("eve-pw-H2j6", ()),
    "root": ("root-pw-B8n3", ("admin",)),
}
PASSWORDS: Final = tuple(password for password, _ in USERS.values())

# The rules most tests run under (Open MQ syntax).
RULES: Final = """\
version=JMQFileAccessControlModel/100
connection.NORMAL.allow.user=*
connection.NORMAL.deny.user=eve
connection.ADMIN.allow.group=admin
queue.orders.produce.allow.user=alice,bob
queue.scratch.produce.allow.user=*
queue.*.consume.allow.group=readers
queue.*.browse.allow.user=alice
queue.mq.sys.dmq.consume.deny.user=bob
topic.*.produce.allow.group=writers
topic.prices.produce.deny.user=mallory
topic.*.consume.allow.user=*
queue.create.allow.user=alice
topic.create.allow.group=writers
topic.audit.consume.deny.user=bob
"""


@dataclass
class Secured:
    """A broker with authentication on, and what the tests need to talk to it."""

    broker: BrokerThread
    directory: Path
    access_file: Path
    _clients: list[RawClient] = field(default_factory=list)

    @property
    def port(self) -> int:
        return self.broker.port

    def raw(self, user: str | None = None, *, connect: bool = True, **headers: str) -> RawClient:
        """A raw-frame client, connected (with failed receipts) as `user` and their password."""
        client = RawClient(self.broker.port)
        self._clients.append(client)
        if connect:
            credentials = {"login": user, "passcode": USERS[user][0]} if user else {}
            client.connect(failed_receipts="true", **credentials, **headers)
        return client

    def refused_connect(self, **headers: str) -> dict[str, str]:
        """CONNECT with `headers`; the ERROR's headers (and body as "body"). The broker must
        close the connection after it."""
        client = self.raw(connect=False)
        client.send("CONNECT", {"accept-version": "1.2", "host": "localhost", **headers})
        error = client.expect("ERROR")
        client.expect_closed()
        return {**error.headers, "body": error.body.decode()}

    def close(self) -> None:
        for client in self._clients:
            client.close()


def add_users(path: Path) -> None:
    users = UserFile(path)
    for name, (password, groups) in USERS.items():
        users.add(name, password, groups)


@pytest.fixture(scope="session")
def users_template(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The users file, hashed once for the whole run (scrypt takes a while per user)."""
    path = tmp_path_factory.mktemp("users") / "passwd"
    add_users(path)
    return path.read_bytes()


@pytest.fixture
def secured_factory(
    make_broker: BrokerFactory, tmp_path: Path, users_template: bytes
) -> Iterator[SecuredFactory]:
    made: list[Secured] = []

    def make(rules: str | None = RULES, **properties: str) -> Secured:
        directory = tmp_path / f"broker{len(made)}"
        directory.mkdir()
        users = directory / "passwd"
        users.write_bytes(users_template)
        access = directory / "accesscontrol.properties"
        if rules is not None:
            access.write_text(rules)
        values = {
            "imq.authentication.enabled": "true",
            "imq.user_repository.file.filename": str(users),
            "imq.accesscontrol.file.filename": str(access),
            **properties,
        }
        secured = Secured(make_broker(values), directory, access)
        made.append(secured)
        return secured

    yield make
    for secured in made:
        secured.close()


class SecuredFactory(Protocol):
    """`secured_factory(rules=RULES, **properties)`: a Secured broker (rules None: no file)."""

    def __call__(self, rules: str | None = RULES, **properties: str) -> Secured: ...


@pytest.fixture
def secured(secured_factory: SecuredFactory) -> Secured:
    """A broker with authentication on, the users of USERS and the rules of RULES."""
    return secured_factory()
