"""The values the pipeline connection takes and returns: settings, messages, end markers,
lease and stage states. Plain frozen values, safe to pickle and to ship to Spark executors."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Final

from sluiceway.client.credentials import (
    credential,
    one_source,
    read_environment,
    read_password_file,
)
from sluiceway.client.message import MessageView
from sluiceway.client.retry import RetryPolicy
from sluiceway.client.tls import TlsSettings
from sluiceway.errors import RemoteProtocolError

# Status of a refused lease ACK: the lease expired (or was released) before it was acknowledged.
STATUS_GONE: Final = 410

# Sends waiting for their receipts at once. Pipelining is what makes a persistent send cheap (the
# broker syncs the journal once for many); the bound keeps what is kept for a retry small.
DEFAULT_MAX_INFLIGHT: Final = 512
DEFAULT_MAX_INFLIGHT_BYTES: Final = 8 * 1024 * 1024

# Longer than the broker's default imq.producer.hold.timeout (60 s), so a held send ends with
# the broker's reason, not with ours.
DEFAULT_TIMEOUT: Final = 90.0


class LeaseState(Enum):
    """`lease-state` of a lease read's end marker, or of the RECEIPT of its ACK or NACK."""

    OPEN = "open"
    ACKNOWLEDGED = "acknowledged"
    EXPIRED = "expired"
    UNREAD = "unread"  # never read (a read with create=False made nothing)


class StageState(Enum):
    """`stage-state` of the RECEIPT of a stage COMMIT."""

    COMMITTED = "committed"
    COMMITTED_BEFORE = "committed-before"


def _default_retry() -> RetryPolicy:
    return RetryPolicy(pause=0.1, deadline=60.0)


@dataclass(frozen=True, slots=True, init=False)
class PipelineSettings:
    """Where the broker is and how to talk to it; a plain value, safe to pickle.

    The credentials are `username` and `password`, as everywhere else in the product; `login`
    and `passcode` are accepted as their aliases (see `sluiceway.client.credentials`). Each may
    instead be read where the connection is made, so that the settings (pickled to Spark's
    executors) never hold it: `username_env`, `password_env` name environment variables,
    `password_file` a file whose first line is the password, readable by its owner only. One
    source per credential; `credentials()` reads them.
    """

    host: str
    port: int
    username: str | None
    password: str | None
    timeout: float  # seconds to wait for any one answer of the broker
    retry: RetryPolicy
    max_inflight: int  # sends awaiting their receipts (messages)
    max_inflight_bytes: int  # their bodies (bytes)
    # Brokers to try in order, each (host, port), in place of host and port: the members of a
    # cluster (imqAddressList). Empty: host and port.
    addresses: tuple[tuple[str, int], ...]
    # Seconds an operation keeps trying after a lost connection, a failed connect, a timeout or
    # a refusal with status 503, pausing as `retry` says between attempts; 0: no failover (a
    # request that finds an idle connection lost is tried once more at once, nothing else).
    failover: float
    tls: TlsSettings | None  # whom a TLS connection trusts; None: plain TCP
    username_env: str | None  # an environment variable holding the user name
    password_env: str | None  # an environment variable holding the password
    password_file: str | None  # a file whose first line is the password
    # Runs of messages for one destination go many to a SEND (pipelines-protocol.md, "Packed
    # sends") when the broker takes packed SENDs; False: one SEND per message.
    pack_sends: bool

    def __init__(  # noqa: PLR0917  (the fields' order, as the dataclass's own __init__ had it)
        self,
        host: str = "127.0.0.1",
        port: int = 61613,
        username: str | None = None,
        password: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        max_inflight: int = DEFAULT_MAX_INFLIGHT,
        max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES,
        *,
        login: str | None = None,
        passcode: str | None = None,
        addresses: tuple[tuple[str, int], ...] = (),
        failover: float = 0.0,
        tls: TlsSettings | None = None,
        username_env: str | None = None,
        password_env: str | None = None,
        password_file: str | None = None,
        pack_sends: bool = True,
    ) -> None:
        if not 0 <= failover < math.inf:
            raise ValueError(f"failover must be a number of seconds, 0 or more, not {failover!r}")
        username = credential("username", username, "login", login)
        password = credential("password", password, "passcode", passcode)
        one_source({"username": username, "username_env": username_env})
        one_source(
            {"password": password, "password_env": password_env, "password_file": password_file}
        )
        # Frozen: the fields are set the way the generated __init__ would set them.
        values = {
            "host": host,
            "port": port,
            "username": username,
            "password": password,
            "timeout": timeout,
            "retry": retry if retry is not None else _default_retry(),
            "max_inflight": max_inflight,
            "max_inflight_bytes": max_inflight_bytes,
            "addresses": tuple(addresses),
            "failover": float(failover),
            "tls": tls,
            "username_env": username_env,
            "password_env": password_env,
            "password_file": password_file,
            "pack_sends": pack_sends,
        }
        for name, value in values.items():
            object.__setattr__(self, name, value)

    @property
    def targets(self) -> tuple[tuple[str, int], ...]:
        """The brokers to try, in order."""
        return self.addresses or ((self.host, self.port),)

    def credentials(self) -> tuple[str | None, str | None]:
        """The user name and password to send on CONNECT, read now from the environment or the
        password file when the settings name one: on the machine that connects (a Spark
        executor reads its own environment and file). ConfigError when one cannot be read."""
        username, password = self.username, self.password
        if self.username_env is not None:
            username = read_environment(self.username_env, "username_env")
        if self.password_env is not None:
            password = read_environment(self.password_env, "password_env")
        elif self.password_file is not None:
            password = read_password_file(self.password_file, "password_file")
        return username, password

    @property
    def login(self) -> str | None:
        """The older name of `username`."""
        return self.username

    @property
    def passcode(self) -> str | None:
        """The older name of `password`."""
        return self.password

    def __repr__(self) -> str:
        # Never print the password (settings end up in Spark's plans and logs); where it is
        # read from is no secret.
        sources = (
            ("tls", self.tls),
            ("username_env", self.username_env),
            ("password_env", self.password_env),
            ("password_file", self.password_file),
        )
        given = "".join(f", {name}={value!r}" for name, value in sources if value is not None)
        return (
            f"PipelineSettings(host={self.host!r}, port={self.port}, "
            f"addresses={self.addresses!r}, username={self.username!r}, timeout={self.timeout}, "
            f"failover={self.failover}{given})"
        )


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """One message to send: the body and the SEND headers besides `destination`."""

    destination: str
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)
    persistent: bool = True
    priority: int = 4
    expires: int = 0  # ms since the epoch; 0: never


@dataclass(frozen=True, slots=True)
class PipelineMessage(MessageView):
    """A message returned by a range or lease read."""

    body: bytes
    headers: Mapping[str, str]

    @property
    def sequence(self) -> int:
        """Its position in its destination (the `sequence` header)."""
        return int(self.headers.get("sequence", "0"))


def optional_int(headers: Mapping[str, str], name: str) -> int | None:
    text = headers.get(name)
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise RemoteProtocolError(f"the broker sent {name}:{text!r}, not an integer") from None


@dataclass(frozen=True, slots=True)
class EndMarker:
    """The end marker of a read (a MESSAGE with `browser:end`), field by field.

    Fields the document makes mandatory are still optional here so that the client reads what
    an older broker sends; `consumer_flow_limit` then comes from the RECEIPT of the SUBSCRIBE,
    which carries the same effective limit.
    """

    next_sequence: int
    head_sequence: int
    first_sequence: int | None
    message_count: int | None
    consumer_flow_limit: int | None
    cursor_sequence: int | None
    lease_state: LeaseState | None
    lease_count: int | None
    lease_expires: int | None
    lease_bytes: int | None  # bytes of the lease's message bodies
    lease_high: int | None  # the highest number the lease's group used (-1: none)
    headers: Mapping[str, str]

    @classmethod
    def parse(cls, headers: Mapping[str, str], receipt: Mapping[str, str]) -> EndMarker:
        state = headers.get("lease-state")
        try:
            lease_state = LeaseState(state) if state is not None else None
        except ValueError:
            raise RemoteProtocolError(f"the broker sent an unknown lease-state {state!r}") from None
        flow_limit = optional_int(headers, "consumer-flow-limit")
        if flow_limit is None:
            flow_limit = optional_int(receipt, "consumer-flow-limit")
        return cls(
            next_sequence=optional_int(headers, "next-sequence") or 0,
            head_sequence=optional_int(headers, "head-sequence") or 0,
            first_sequence=optional_int(headers, "first-sequence"),
            message_count=optional_int(headers, "message-count"),
            consumer_flow_limit=flow_limit,
            cursor_sequence=optional_int(headers, "cursor-sequence"),
            lease_state=lease_state,
            lease_count=optional_int(headers, "lease-count"),
            lease_expires=optional_int(headers, "lease-expires"),
            lease_bytes=optional_int(headers, "lease-bytes"),
            lease_high=optional_int(headers, "lease-high"),
            headers=dict(headers),
        )


@dataclass(frozen=True, slots=True)
class StageResult:
    """What the RECEIPT of a stage COMMIT said."""

    state: StageState
    count: int  # messages published by this COMMIT (0 when committed before)
