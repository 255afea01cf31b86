"""Access changes that reach the connections already open.

A CONNECT checks the users file and the access rules as they are; this watcher, run by the
broker's once-a-second tick, carries later changes to the connections that passed them:

- a user deleted from the users file (imq.user_repository.file.filename): each of its
  connections gets an ERROR with status 401 (`user NAME no longer exists`), then is closed;
- a user whose groups changed keeps its connections, and the rules see the new groups from the
  next frame on;
- a user whom the rules no longer let connect (connection.NORMAL): ERROR 403 (`user NAME may not
  connect`), then close.

Rights on destinations need nothing here: every SEND and SUBSCRIBE applies the rules in force
(security.access), so a revoked right refuses the next one. Subscriptions already made go on, as
in Open MQ, which checks a consumer when it is created. A password change does not close
anything: the connections proved the password that was valid when they connected, and the new
one counts from the next CONNECT.

Each look costs one stat per file, at most once a second. A change is acted on once the file has
stayed the same for one more look (so between one and two seconds after it is written), so that
a file caught half-written (an editor that truncates, then writes) never closes connections. A
users file that cannot be read leaves the connections as they are (the error is logged; every
new CONNECT is refused meanwhile); so does a rules file that cannot be read (every SEND and
SUBSCRIBE is refused meanwhile).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from sluiceway.errors import BrokerError, ConfigError, Unauthorized
from sluiceway.security.access import Gate, Operation, Service, file_stamp, refusal
from sluiceway.security.users import Principal, UserFile

log = logging.getLogger(__name__)


class Holder(Protocol):
    """An open connection as the watcher sees it (a STOMP session that has connected)."""

    principal: Principal | None  # None: authentication was off when it connected
    peer: str

    @property
    def closing(self) -> bool: ...

    def revoke(self, error: BrokerError) -> None:
        """Send `error` in an ERROR frame, then close."""


def user_deleted(user: str) -> Unauthorized:
    """The ERROR a deleted user's connections get (status 401)."""
    return Unauthorized(
        f"user {user} no longer exists",
        f"user {user} no longer exists: an administrator deleted it from the broker's users "
        "file, and its connections are closed",
    )


Stamps = tuple[tuple[int, ...] | None, tuple[int, ...] | None]


class AccessWatcher:
    """Looks at the users file and the access rules of `gate` on every `tick`, and applies what
    changed to the connections `holders` returns. Used on the broker's event loop only."""

    def __init__(self, gate: Gate, holders: Callable[[], Iterable[Holder]]) -> None:
        self._users = UserFile(gate.users)
        self._access = gate.access
        self._holders = holders
        self._seen = self._acted = self._stamps()

    def _stamps(self) -> Stamps:
        access = self._access
        return file_stamp(self._users.path), access.stamp if access is not None else None

    def tick(self) -> None:
        """One look; act on a change that has settled."""
        if self._access is not None:
            self._access.refresh()  # (at most once a second, whoever asks)
        stamps = self._stamps()
        settled = stamps == self._seen
        self._seen = stamps
        if settled and stamps != self._acted:
            self._acted = stamps
            self.apply()

    def apply(self) -> None:
        """Bring every open connection in line with the users file and the rules in force."""
        try:
            users = self._users.load()
        except ConfigError as exc:
            # The message names the file and the line: there is no bug to trace.
            log.error(  # noqa: TRY400 (the message names file and line: no traceback)
                "access change: %s; open connections are left as they are until it is fixed", exc
            )
            return
        regrouped: dict[str, tuple[Principal, Principal, int]] = {}
        for holder in list(self._holders()):
            principal = holder.principal
            if principal is None or holder.closing:
                continue
            user = users.get(principal.user)
            if user is None:
                log.info(
                    "%s: closing the connection of user %s: it no longer exists in %s",
                    holder.peer,
                    principal.user,
                    self._users.path,
                )
                holder.revoke(user_deleted(principal.user))
                continue
            groups = frozenset(user.groups)
            if groups != principal.groups:
                before = principal
                principal = holder.principal = Principal(principal.user, groups)
                count = regrouped.get(principal.user, (before, principal, 0))[2]
                regrouped[principal.user] = (before, principal, count + 1)
            self._check_connect(holder, principal)
        for before, after, count in regrouped.values():
            log.info(
                "access change: user %s is now in the groups %s (was %s); %d open connections "
                "follow the change",
                after.user,
                _groups(after),
                _groups(before),
                count,
            )

    def _check_connect(self, holder: Holder, principal: Principal) -> None:
        """Close the connection if the rules no longer let its user connect."""
        access = self._access
        if access is None:
            return
        normal = Service.NORMAL.value
        decision = access.decide(principal, Operation.CONNECT, None, normal)
        if decision.allowed or decision.invalid:
            return  # (an invalid file refuses every frame already; it closes nothing)
        log.info(
            "%s: closing the connection of user %s: it may no longer connect: %s",
            holder.peer,
            principal.user,
            decision.explain(),
        )
        holder.revoke(refusal(principal, Operation.CONNECT, None, normal, decision))


def _groups(principal: Principal) -> str:
    return ",".join(sorted(principal.groups)) or "(none)"
