"""Who a session's client is, and what the access rules let it do.

With imq.authentication.enabled the CONNECT must carry the `login` and `passcode` of a user of
the users file (401 otherwise); the password is checked off the event loop (security.logins).
With imq.accesscontrol.enabled the access rules (security.access) are checked here, not in the
core: connecting (connection.NORMAL), SEND (produce, and create when the destination is new),
SUBSCRIBE (consume, or browse with `browser:true`, and create when new), moving a cursor or
ending a lease (consume). A refusal is a 403 that names the user, the operation and the
destination, logged at WARNING with the peer; a passcode is never logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sluiceway.config import BrokerConfig
from sluiceway.core.model.registry import DestinationRegistry
from sluiceway.errors import BrokerError
from sluiceway.naming import DestinationKind, DestinationName
from sluiceway.protocol.frames import Frame
from sluiceway.security.access import (
    AccessControl,
    AccessDenied,
    Gate,
    Operation,
    Outcome,
    Service,
)
from sluiceway.security.logins import PendingLogin
from sluiceway.security.users import Principal

log = logging.getLogger(__name__)


class SessionAccess:
    """The login of one session and the access checks of its frames."""

    def __init__(
        self,
        config: BrokerConfig,
        registry: DestinationRegistry,
        peer: str,
        gate: Gate | None,
    ) -> None:
        self._config = config
        self._registry = registry  # whether a destination exists (or this request creates it)
        self._peer = peer
        # The users file and rules the listener's sessions share; None: read on first use.
        self._gate = gate
        # Who connected, and the access rules that apply to them (None when
        # imq.accesscontrol.enabled is false).
        self.principal: Principal | None = None
        self.rules: AccessControl | None = None

    def login(self, frame: Frame, done: Callable[[Outcome], None]) -> Outcome | PendingLogin:
        """The user the CONNECT's login and passcode stand for, or the error to refuse it with:
        now, or later through `done` (called on the event loop)."""
        gate = self._gate
        if gate is None:  # a session made without its listener's gate reads the files itself
            gate = self._gate = Gate(self._config)
        login, passcode = frame.headers.get("login"), frame.headers.get("passcode")
        return gate.login(login, passcode, self._peer, done)

    def admit(self, outcome: Outcome) -> Principal:
        """Raise the refusal, or take the principal once the access rules let it connect."""
        if isinstance(outcome, BrokerError):
            raise outcome
        gate = self._gate
        self.principal, self.rules = outcome, gate.access if gate is not None else None
        self.authorize(Operation.CONNECT, None, Service.NORMAL.value)
        return outcome

    def authorize(self, operation: Operation, kind: DestinationKind | None, name: str) -> None:
        """Raise (and log) a 403 if the access rules refuse this connection's user."""
        rules, principal = self.rules, self.principal
        if rules is None or principal is None:
            return
        try:
            rules.check(principal, operation, kind, name)
        except AccessDenied as exc:
            log.warning("%s: %s: %s", self._peer, exc.summary, exc.decision.explain())
            raise

    def authorize_use(self, operation: Operation, destination: DestinationName) -> None:
        """`operation` on `destination`, and creating it if this request would auto-create it."""
        if self.rules is None:
            return
        self.authorize(operation, destination.kind, destination.name)
        if (
            self._registry.get(destination) is None
            and not destination.is_system
            and self._config.autocreate_enabled(destination.kind)
        ):
            self.authorize(Operation.CREATE, destination.kind, destination.name)
