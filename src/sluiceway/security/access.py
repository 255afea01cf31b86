"""Access rules: who may connect, produce, consume, browse and auto-create destinations.

The rules are Open MQ's accesscontrol.properties (JMQFileAccessControlModel/100): a Java
properties file named by imq.accesscontrol.file.filename (default: accesscontrol.properties in
the data directory). They apply only with imq.authentication.enabled and
imq.accesscontrol.enabled. One rule per key:

    connection.SERVICE.ACCESS.TYPE = PRINCIPALS      SERVICE: NORMAL (STOMP), ADMIN, or *
    queue.NAME.OPERATION.ACCESS.TYPE = PRINCIPALS    NAME: a queue name (dots allowed) or *
    topic.NAME.OPERATION.ACCESS.TYPE = PRINCIPALS    OPERATION: produce, consume, browse
    queue.create.ACCESS.TYPE = PRINCIPALS            auto-creating queues (no NAME, as in Open MQ)
    topic.create.ACCESS.TYPE = PRINCIPALS            auto-creating topics

ACCESS is allow or deny, TYPE is user or group, PRINCIPALS a comma-separated list of names or `*`
(every user; with `group`, every user who is in at least one group). `version=
JMQFileAccessControlModel/100` may come first, as in Open MQ's own files. Browsing a topic (its
retained messages) is this broker's extension; Open MQ browses queues only.

As in Open MQ, `connection.ADMIN` rules (and `connection.*` ones) decide who may use the admin
endpoint while access control is on; the group `admin` matters only through them (the default
rules allow it). A file that lets nobody, or everybody, administer is loaded with a warning.
Decisions are not cached: every SEND and SUBSCRIBE applies the rules in force, so a right
removed counts from the first frame after the change is noticed; security.watch applies changes
to the connections already open (a revoked connection.NORMAL closes them).

How a request is decided (Open MQ Administration Guide, "Application of Authorization Rules", as
its JMQFileAccessControlModel.computePermission implements it):

1. Rules naming the destination (or service) override the `*` rules: the `*` rules decide only
   when the named destination's rules say nothing about this user.
2. Within one of those levels: a rule naming the user overrides one naming one of the user's
   groups, which overrides `user=*`, which overrides `group=*`.
3. Where allow and deny meet at the same step (the user in both lists of a rule, or one of the
   user's groups allowed and another denied), deny wins. Open MQ cancels the two out and lets
   the next step decide, which can end in an allow; denying is the safer reading.
4. What no rule allows is denied.

Stricter than Open MQ, so that a mistake is an error rather than a silent change of rights: an
unknown key, a bad principal name, an empty list and a key written twice (Open MQ keeps the last
silently) are errors naming the file and line. While the file is invalid every request is
refused, as Open MQ does, and the log says why; the file is re-read when it changes (looked at
no more than once every RELOAD_INTERVAL_S), with no restart.
"""

from __future__ import annotations

import enum
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

from sluiceway.config import BrokerConfig
from sluiceway.errors import (
    BrokerError,
    ConfigError,
    Forbidden,
    InternalError,
    Unauthorized,
    Unavailable,
)
from sluiceway.javaprops import PropertyLine, load_properties, parse_properties
from sluiceway.naming import DestinationKind, DestinationName, validate_name
from sluiceway.security.logins import LoginResult, Logins, PendingLogin, Refusal
from sluiceway.security.users import Authenticator, Principal, check_name, users_path

log = logging.getLogger(__name__)

RULES_VERSION: Final = "JMQFileAccessControlModel/100"
PROPERTY: Final = "imq.accesscontrol.file.filename"
ALL: Final = "*"
# Seconds between two looks (one stat) at the file: checks run on every SEND, and a stat costs
# more than the check itself; an edit takes effect within this time.
RELOAD_INTERVAL_S: Final = 1.0


class Operation(enum.Enum):
    """What a request does; CONNECT is checked against `connection.SERVICE` rules."""

    CONNECT = "connect"
    PRODUCE = "produce"
    CONSUME = "consume"
    BROWSE = "browse"
    CREATE = "create"


class Service(enum.Enum):
    """Open MQ's connection service types."""

    NORMAL = "NORMAL"  # clients: STOMP over TCP, TLS and WebSocket
    ADMIN = "ADMIN"  # the admin endpoint


class Access(enum.Enum):
    ALLOW = "allow"
    DENY = "deny"


class PrincipalType(enum.Enum):
    USER = "user"
    GROUP = "group"


_DESTINATION_OPERATIONS: Final = frozenset({"produce", "consume", "browse"})
_RESOURCES: Final = ("connection", "queue", "topic")

# (resource, variant, operation): ("queue", "orders", "produce"), ("queue", None, "create"),
# ("connection", "NORMAL", None).
RuleKey = tuple[str, str | None, str | None]


@dataclass(frozen=True, slots=True)
class Grant:
    """The right-hand side of one rule: its principals and where it was written."""

    principals: frozenset[str]
    line: int


Rules = Mapping[RuleKey, Mapping[tuple[Access, PrincipalType], Grant]]


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of a check and the rule that decided it (`rule` None: no rule applied)."""

    allowed: bool
    rule: str | None = None  # "queue.orders.produce.deny.user"
    principal: str | None = None  # the name (or *) in that rule that matched
    line: int | None = None
    source: str = ""  # the file, or "the default rules"
    invalid: bool = False  # the file cannot be used: everything is refused

    def explain(self) -> str:
        """For the broker's log: which rule of which file decided."""
        if self.invalid:
            return f"the access control file {self.source} is invalid (see the error above)"
        if self.rule is None:
            return f"no rule of {self.source} allows it"
        where = f"line {self.line} of {self.source}" if self.line else self.source
        return f"{self.rule}={'...' if self.principal is None else self.principal} ({where})"


class AccessDenied(Forbidden):
    """A request the access rules refuse (status 403); `decision` says which rule refused it."""

    def __init__(self, summary: str, detail: str, decision: Decision, destination: str | None):
        super().__init__(summary, detail, destination=destination)
        self.decision = decision


# Every authenticated user may do everything except administer; this is what a broker without
# an access control file applies, and the file to start from when writing one.
DEFAULT_RULES: Final = f"""\
version={RULES_VERSION}
connection.NORMAL.allow.user=*
connection.ADMIN.allow.group=admin
queue.*.produce.allow.user=*
queue.*.consume.allow.user=*
queue.*.browse.allow.user=*
topic.*.produce.allow.user=*
topic.*.consume.allow.user=*
topic.*.browse.allow.user=*
queue.create.allow.user=*
topic.create.allow.user=*
"""


# -- parsing ----------------------------------------------------------------------------------


def parse_rules(lines: Iterable[PropertyLine], source: str) -> Rules:
    """The rules of a parsed file; raises ConfigError naming `source`, the line and what is
    accepted."""
    rules: dict[RuleKey, dict[tuple[Access, PrincipalType], Grant]] = {}
    seen: dict[str, int] = {}
    for entry in lines:
        where = f"{source}, line {entry.line}"
        if entry.key in seen:
            raise _error(
                where,
                f"{entry.key} was already set on line {seen[entry.key]}; write each rule once, "
                "with all its principals separated by commas",
            )
        seen[entry.key] = entry.line
        if entry.key == "version":
            if entry.value.strip() != RULES_VERSION:
                raise _error(where, f"version must be {RULES_VERSION}, not {entry.value!r}")
            continue
        key, access, kind = _parse_key(entry.key, where)
        principals = _parse_principals(entry.value, kind, where)
        rules.setdefault(key, {})[access, kind] = Grant(principals, entry.line)
    return rules


def _error(where: str, message: str) -> ConfigError:
    return ConfigError(PROPERTY, f"{where}: {message}")


_ACCEPTED: Final = (
    "a rule is connection.SERVICE.ACCESS.TYPE, queue|topic.NAME.OPERATION.ACCESS.TYPE or "
    "queue|topic.create.ACCESS.TYPE, with SERVICE NORMAL, ADMIN or *, NAME a destination name "
    "or *, OPERATION produce, consume or browse, ACCESS allow or deny, TYPE user or group"
)


def _parse_key(key: str, where: str) -> tuple[RuleKey, Access, PrincipalType]:
    parts = key.split(".")
    if len(parts) < 4 or parts[0] not in _RESOURCES:
        raise _error(where, f"unknown key {key!r}; {_ACCEPTED}")
    resource = parts[0]
    try:
        access = Access(parts[-2])
        kind = PrincipalType(parts[-1])
    except ValueError:
        raise _error(
            where, f"{key!r} must end in .allow.user, .allow.group, .deny.user or .deny.group"
        ) from None
    middle = parts[1:-2]
    if resource == "connection":
        if len(middle) != 1 or middle[0] not in (ALL, "NORMAL", "ADMIN"):
            raise _error(
                where,
                f"unknown key {key!r}: a connection rule is connection.SERVICE.ACCESS.TYPE with "
                "SERVICE NORMAL (clients), ADMIN (the admin endpoint) or *",
            )
        return (resource, middle[0], None), access, kind
    if middle == ["create"]:
        return (resource, None, "create"), access, kind
    operation, name = middle[-1], ".".join(middle[:-1])
    if operation == "create":
        raise _error(
            where,
            f"{key!r}: auto-creation rules apply to every {resource}; write "
            f"{resource}.create.{access.value}.{kind.value}",
        )
    if operation not in _DESTINATION_OPERATIONS or not name:
        raise _error(where, f"unknown key {key!r}; {_ACCEPTED}")
    if name != ALL:
        try:
            validate_name(name)
        except ValueError as exc:
            raise _error(
                where, f"{key!r}: {exc} (or * for every {resource}; patterns are not supported)"
            ) from None
    return (resource, name, operation), access, kind


def _parse_principals(value: str, kind: PrincipalType, where: str) -> frozenset[str]:
    names = [name.strip() for name in value.split(",") if name.strip()]
    if not names:
        raise _error(
            where,
            f"the rule names no {kind.value}s: list them separated by commas, or * for all "
            "(remove the line to remove the rule)",
        )
    for name in names:
        if name != ALL:
            try:
                check_name(name, f"{kind.value} name")
            except ValueError as exc:
                raise _error(where, f"{exc}, or be * for every {kind.value}") from None
    return frozenset(names)


_DEFAULTS: Final = parse_rules(parse_properties(DEFAULT_RULES, "the default rules"), "")


# -- deciding ---------------------------------------------------------------------------------


def apply_rules(
    rules: Rules, principal: Principal, operation: Operation, kind: str, name: str
) -> Decision:
    """Apply `rules` (see the module's documentation for the order) to one request."""
    if operation is Operation.CONNECT:
        levels: list[RuleKey] = [("connection", ALL, None), ("connection", name, None)]
    elif operation is Operation.CREATE:
        levels = [(kind, None, "create")]
    else:
        levels = [(kind, ALL, operation.value), (kind, name, operation.value)]
    decision = Decision(allowed=False)
    for key in levels:  # general first: a more specific level overrides what it decides
        grants = rules.get(key)
        if grants:
            decision = _decide_level(key, grants, principal) or decision
    return decision


def _decide_level(
    key: RuleKey, grants: Mapping[tuple[Access, PrincipalType], Grant], principal: Principal
) -> Decision | None:
    steps: list[tuple[PrincipalType, Iterable[str]]] = [
        (PrincipalType.USER, (principal.user,)),
        (PrincipalType.GROUP, sorted(principal.groups)),
        (PrincipalType.USER, (ALL,)),
    ]
    if principal.groups:  # `group=*` means every user who is in some group (as in Open MQ)
        steps.append((PrincipalType.GROUP, (ALL,)))
    for kind, names in steps:
        for access in (Access.DENY, Access.ALLOW):  # deny first: it wins at the same step
            grant = grants.get((access, kind))
            if grant is None:
                continue
            for name in names:
                if name in grant.principals:
                    rule = ".".join(p for p in (*key, access.value, kind.value) if p is not None)
                    return Decision(access is Access.ALLOW, rule, name, grant.line)
    return None


# Principals no rule can name (":" is not allowed in names): what `user=*` and `group=*` grant.
_ANY_USER: Final = Principal(":", frozenset())
_ANY_MEMBER: Final = Principal(":", frozenset({":"}))


def admin_warning(rules: Rules, source: str) -> str | None:
    """What to warn about in who may administer (connection.ADMIN, and connection.*, which
    covers the admin endpoint too): nobody at all, or every user. None when neither."""
    levels: tuple[RuleKey, ...] = (("connection", ALL, None), ("connection", "ADMIN", None))
    if not any(access is Access.ALLOW for key in levels for access, _ in rules.get(key, {})):
        return (
            f"no rule of {source} allows anyone to administer the broker, so the admin "
            "endpoint refuses every request; add connection.ADMIN.allow.group=admin to let "
            "the group admin administer"
        )
    for anyone in (_ANY_USER, _ANY_MEMBER):
        decision = apply_rules(rules, anyone, Operation.CONNECT, "connection", "ADMIN")
        if decision.allowed:
            return (
                f"{decision.rule}={decision.principal} (line {decision.line} of {source}) lets "
                "every user administer the broker; a connection.* rule covers the admin "
                "endpoint too: write connection.NORMAL to give a right to clients alone"
            )
    return None


# -- the file in force ------------------------------------------------------------------------


def access_path(config: BrokerConfig) -> Path:
    """The access control file: imq.accesscontrol.file.filename, else accesscontrol.properties
    in the data directory."""
    if config.access_file:
        return Path(config.access_file)
    return Path(config.data_directory) / "accesscontrol.properties"


_VERBS: Final = {
    Operation.PRODUCE: "produce to",
    Operation.CONSUME: "consume from",
    Operation.BROWSE: "browse",
    Operation.CREATE: "create",
}


class AccessControl:
    """The rules of one access control file (the default rules while there is none), re-read
    when the file changes. Used on the broker's event loop only."""

    def __init__(
        self,
        path: Path,
        *,
        clock: Callable[[], float] = time.monotonic,
        interval: float = RELOAD_INTERVAL_S,
    ) -> None:
        self.path = path
        self._clock = clock
        self._interval = interval
        self._rules: Rules = _DEFAULTS
        self.source = "the default rules"
        self.problem: ConfigError | None = None  # the file is invalid: everything is refused
        self._stamp: tuple[int, ...] | None = None
        self._next_look = -math.inf
        self._load(file_stamp(path))

    def refresh(self) -> None:
        """Re-read the file if it changed, at most once every `interval` seconds."""
        now = self._clock()
        if now < self._next_look:
            return
        self._next_look = now + self._interval
        stamp = file_stamp(self.path)
        if stamp != self._stamp:
            self._load(stamp)

    def _load(self, stamp: tuple[int, ...] | None) -> None:
        self._stamp = stamp
        if stamp is None:
            self._rules, self.source, self.problem = _DEFAULTS, "the default rules", None
            log.info("access control: no file at %s, the default rules apply", self.path)
            return
        self.source = str(self.path)
        try:
            rules = parse_rules(load_properties(self.path), self.source)
        except ConfigError as exc:
            self.problem = exc
            refused = "every request is refused until it is fixed"
            log.error("access control: %s; %s", exc, refused)  # noqa: TRY400  (it names the line)
            return
        self._rules, self.problem = rules, None
        log.info("access control: %d rules loaded from %s", len(rules), self.path)
        warning = admin_warning(rules, self.source)
        if warning is not None:
            log.warning("access control: %s", warning)

    @property
    def stamp(self) -> tuple[int, ...] | None:
        """What the file in force looked like when it was read (None: no file)."""
        return self._stamp

    def require_valid(self) -> None:
        """Raise the ConfigError of an invalid file (for start-up checks)."""
        self.refresh()
        if self.problem is not None:
            raise self.problem

    def decide(
        self, principal: Principal, operation: Operation, kind: DestinationKind | None, name: str
    ) -> Decision:
        """Whether `principal` may do `operation` on destination `name` of `kind`; for
        Operation.CONNECT, `kind` is None and `name` the connection service (Service values)."""
        if (operation is Operation.CONNECT) != (kind is None):
            raise ValueError("Operation.CONNECT, and only it, is checked without a destination")
        self.refresh()
        if self.problem is not None:
            return Decision(allowed=False, source=self.source, invalid=True)
        resource = "connection" if kind is None else kind.value
        decision = apply_rules(self._rules, principal, operation, resource, name)
        defaults = self._rules is _DEFAULTS
        return replace(decision, source=self.source, line=None if defaults else decision.line)

    def check(
        self, principal: Principal, operation: Operation, kind: DestinationKind | None, name: str
    ) -> Decision:
        """As `decide`, raising AccessDenied (status 403) when the rules refuse."""
        decision = self.decide(principal, operation, kind, name)
        if not decision.allowed:
            raise refusal(principal, operation, kind, name, decision)
        return decision


def refusal(
    principal: Principal,
    operation: Operation,
    kind: DestinationKind | None,
    name: str,
    decision: Decision,
) -> AccessDenied:
    """The 403 for a refused request: it names the user, the operation and the destination,
    and what an administrator would add; which rule refused stays in the broker's log."""
    user = principal.user
    if kind is None:
        summary = f"user {user} may not connect" + (
            " as an administrator" if name == "ADMIN" else ""
        )
        rule = f"connection.{name}.allow.user={user}"
        path = None
    else:
        path = DestinationName(kind, name).path
        summary = f"user {user} may not {_VERBS[operation]} {path}"
        variant = "" if operation is Operation.CREATE else f"{name}."
        rule = f"{kind.value}.{variant}{operation.value}.allow.user={user}"
    if decision.invalid:
        why = "the broker's access rules cannot be read; an administrator must fix them"
    else:
        why = (
            "the broker's access rules do not allow it; an administrator can allow it in the "
            f"access control file (imq.accesscontrol.file.filename), e.g. with {rule}"
        )
    return AccessDenied(summary, f"{summary}: {why}", decision, path)


def file_stamp(path: Path) -> tuple[int, ...] | None:
    """What tells a changed file apart (None: no file). The inode catches a file replaced by
    rename; size and both times catch one rewritten in place."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return (-1, exc.errno or 0)  # unreadable: loading it reports why
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


# -- what a STOMP session consults ------------------------------------------------------------

# The same words for an unknown user and a wrong password, so a probe cannot tell which users
# exist (security.logins also spends the same time on both: the dummy hash).
WRONG_CREDENTIALS: Final = Refusal.WRONG.value
NO_CREDENTIALS: Final = "no credentials"
TOO_MANY_LOGINS: Final = Refusal.BUSY.value


class AuthenticationFailed(Unauthorized):
    """A CONNECT without valid credentials (status 401); logged where it is raised."""


class TooManyLogins(Unavailable):
    """A CONNECT refused because too many password checks wait already (status 503); logged
    where it is made."""


# A login's outcome as a STOMP session takes it: the principal, or the error to answer with.
Outcome = Principal | BrokerError


class Gate:
    """The users file and the access rules of one broker, as its STOMP sessions use them."""

    def __init__(self, config: BrokerConfig) -> None:
        self.users = users_path(config)
        self.logins = Logins(config)  # the password checks (threads, cache, delays)
        self.access = AccessControl(access_path(config)) if config.access_control else None

    def login(
        self,
        login: str | None,
        passcode: str | None,
        peer: str,
        done: Callable[[Outcome], None],
    ) -> Outcome | PendingLogin:
        """The user a CONNECT's `login` and `passcode` stand for, or the error to refuse it
        with: AuthenticationFailed (401), TooManyLogins (503), or InternalError when the users
        file cannot be read. Now, or through `done` (on the event loop) when the password is
        checked in a thread or the answer is held back (security.logins). Every failure is
        logged at WARNING with `peer` and the user name given; the passcode never is."""
        if not login:
            log.warning("%s: connection refused: %s (no login header)", peer, NO_CREDENTIALS)
            return AuthenticationFailed(
                NO_CREDENTIALS,
                f"{NO_CREDENTIALS}: this broker requires a user name and password; send the "
                "login and passcode headers on CONNECT (in the Sluiceway client: username= and "
                "password=, or imqDefaultUsername and imqDefaultPassword)",
            )

        def answered(result: LoginResult) -> None:
            done(self._outcome(result, login, peer))

        started = self.logins.start(login, passcode, peer_host(peer), answered)
        if isinstance(started, PendingLogin):
            return started
        return self._outcome(started, login, peer)

    def _outcome(self, result: LoginResult, login: str, peer: str) -> Outcome:
        if result.principal is not None:
            return result.principal
        if result.refusal is Refusal.UNREADABLE:
            # The message names the file and the line: there is no bug to trace.
            log.error("%s: cannot check credentials: %s", peer, result.problem)
            return InternalError(
                "cannot check credentials",
                "the broker cannot read its users file; an administrator must fix it (the "
                "broker's log says what is wrong)",
            )
        if result.refusal is Refusal.BUSY:
            log.warning(
                "%s: connection refused: %s for user %r (%d checks wait, "
                "imq.authentication.queue.max)",
                peer,
                TOO_MANY_LOGINS,
                login,
                self.logins.queue_max,
            )
            return TooManyLogins(
                TOO_MANY_LOGINS,
                f"{TOO_MANY_LOGINS}: the broker is checking as many passwords as it may "
                "(imq.authentication.queue.max); nothing is wrong with this CONNECT: try again "
                "in a moment",
            )
        held = f", answered after {result.delay:.1f} s" if result.delay else ""
        log.warning(
            "%s: connection refused: %s for user %r (failure %d in a row from this address%s)",
            peer,
            WRONG_CREDENTIALS,
            login,
            result.failures,
            held,
        )
        return AuthenticationFailed(
            WRONG_CREDENTIALS,
            f"{WRONG_CREDENTIALS}: check the login and passcode sent on CONNECT; an "
            "administrator manages users with `sluiceway cmd user`",
        )

    def close(self) -> None:
        """The broker stops: no further password check starts."""
        self.logins.close()


def peer_host(peer: str) -> str:
    """The host of a `host:port` peer (an IPv6 host keeps its colons): logins that fail in a
    row are counted per host, whatever port each connection came from."""
    host, colon, port = peer.rpartition(":")
    return host if colon and port.isdigit() else peer


def check_security_files(config: BrokerConfig) -> None:
    """Start-up check: with authentication on, the users file and the access rules must be
    readable, so that a broker that could accept no one (or would refuse everything) says so
    and stops instead of starting and refusing every client. Raises ConfigError naming the
    property, the file and the line."""
    if not config.authentication:
        return
    Authenticator(users_path(config))
    if config.access_control:
        AccessControl(access_path(config)).require_valid()
