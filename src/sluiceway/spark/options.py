"""The data source's options: read case-insensitively, validated once, kept as frozen values.

Spark hands the options over in a case-insensitive mapping whose keys are stored lower-cased;
copying it into a plain dict and asking for `maxMessagesPerTrigger` finds nothing, and the limit
would be silently ignored. Every option is therefore read through `OptionReader`, which looks
names up lower-cased. A bad value raises ConfigError naming the option and what it accepts.
Options are strings; times are in seconds (decimals allowed), sizes in bytes with an optional
`k`, `m` or `g` suffix. An option the source or the sink does not know is refused by name
(option_names), so that a misspelt one is never silently ignored.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Final, TypeVar

from sluiceway.client.credentials import one_source, read_environment, read_password_file
from sluiceway.client.pipeline import PipelineSettings
from sluiceway.client.producer import RetryPolicy
from sluiceway.client.settings import AddressList, parse_address_list
from sluiceway.client.tls import TlsSettings, client_context
from sluiceway.config.properties import int_parser, parse_bool, size_parser
from sluiceway.errors import ConfigError
from sluiceway.naming import DestinationKind, DestinationName, parse_destination, validate_name
from sluiceway.spark import option_names
from sluiceway.spark.destinations import SourceDestinations, parse_destinations

T = TypeVar("T")

DEFAULT_HOST: Final = "127.0.0.1"
DEFAULT_PORT: Final = 61613
# A week: far beyond any sensible wait, small enough that a typo (ms for s) stands out.
_MAX_SECONDS: Final = 7 * 24 * 3600.0
# failoverDeadlineSec: longer than a cluster member's takeover of a failed one (about 10 s) and a
# standalone broker's restart, short enough that a query whose brokers are all gone stops.
DEFAULT_FAILOVER: Final = 60.0
# retryPauseSec (the first pause, doubling up to _MAX_PAUSE) and retryDeadlineSec.
DEFAULT_RETRY_PAUSE: Final = 0.1
DEFAULT_RETRY_DEADLINE: Final = 60.0
_MAX_PAUSE: Final = 5.0
# Protocol numbers (sequences, leases, batches) are 0 to 2^63-1.
MAX_NUMBER: Final = 2**63 - 1


class StartingPosition(Enum):
    """Where a query with a new checkpoint starts (`startingOffsets`)."""

    EARLIEST = "earliest"  # the oldest message the topic retains
    LATEST = "latest"  # the next message sent
    COMMITTED = "committed"  # the group's cursor (created at earliest when new)
    SEQUENCE = "sequence"  # a sequence number given as JSON


class ExpiredLeasePolicy(Enum):
    """What a replayed batch does with a lease that expired while the query was down."""

    FAIL = "fail"  # stop the query, naming the lease: an operator decides
    SKIP = "skip"  # read nothing for it and log a warning; its messages come back redelivered


class DeliveryGuarantee(Enum):
    """How the sink publishes."""

    EXACTLY_ONCE = "exactlyonce"  # stage on executors, publish once from the driver's commit
    AT_LEAST_ONCE = "atleastonce"  # publish from the executors directly


class OptionReader:
    """Typed, case-insensitive access to Spark's options."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self._options = options

    def text(self, name: str) -> str | None:
        """The option's value, whatever the case of its name in the mapping."""
        for key in (name.lower(), name):
            value = self._options.get(key)
            if value is not None:
                return str(value)
        wanted = name.lower()
        for key, value in self._options.items():
            if key.lower() == wanted:
                return str(value)
        return None

    def parsed(self, name: str, parse: Callable[[str], T], default: T) -> T:
        text = self.text(name)
        if text is None or text.strip() == "":
            return default
        try:
            return parse(text)
        except ValueError as exc:
            raise ConfigError(
                name, f"option {name}={text!r} is not valid; it must be {exc}"
            ) from None

    def integer(self, name: str, default: int, minimum: int = 0) -> int:
        return self.parsed(name, int_parser(minimum, MAX_NUMBER), default)

    def optional_integer(self, name: str, minimum: int = 1) -> int | None:
        return self.parsed(name, int_parser(minimum, MAX_NUMBER), None)

    def boolean(self, name: str, default: bool) -> bool:
        return self.parsed(name, parse_bool, default)

    def seconds(self, name: str, default: float | None) -> float | None:
        return self.parsed(name, _parse_seconds, default)

    def seconds_or_off(self, name: str, default: float) -> float:
        """Seconds, where 0 turns what the option times off."""
        return self.parsed(name, _parse_seconds_or_off, default)

    def size(self, name: str) -> int | None:
        value = self.parsed(name, size_parser(), None)
        return value or None

    def choice(self, name: str, enum_type: type[Enum], default: Enum) -> Enum:
        def parse(text: str) -> Enum:
            wanted = text.strip().lower()
            for member in enum_type:
                if str(member.value).lower() == wanted:
                    return member
            raise ValueError("one of " + ", ".join(str(m.value) for m in enum_type))

        return self.parsed(name, parse, default)

    def optional_text(self, name: str) -> str | None:
        """The option's value stripped; None when it is not given or blank."""
        text = self.text(name)
        return text.strip() if text is not None and text.strip() else None

    def required(self, name: str, why: str) -> str:
        text = self.text(name)
        if text is None or not text.strip():
            raise ConfigError(name, f"option {name} is required: {why}")
        return text.strip()


def _parse_seconds(text: str) -> float:
    return _seconds(text, allow_zero=False)


def _parse_seconds_or_off(text: str) -> float:
    return _seconds(text, allow_zero=True)


def _seconds(text: str, *, allow_zero: bool) -> float:
    lowest = "from 0" if allow_zero else "above 0"
    accepted = f"a number of seconds {lowest} up to {_MAX_SECONDS:.0f}"
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError(accepted) from None
    above_floor = value >= 0 if allow_zero else value > 0
    if not (above_floor and value <= _MAX_SECONDS):  # (NaN is neither)
        raise ValueError(accepted)
    return value


def _destination(reader: OptionReader, name: str, why: str) -> DestinationName:
    text = reader.required(name, why)
    try:
        return parse_destination(text)
    except ValueError as exc:
        raise ConfigError(name, f"option {name}={text!r} is not valid: {exc}") from None


def _group(reader: OptionReader, name: str) -> str | None:
    text = reader.text(name)
    if text is None or not text.strip():
        return None
    try:
        validate_name(text.strip())
    except ValueError as exc:
        raise ConfigError(name, f"option {name}={text!r} is not valid: {exc}") from None
    return text.strip()


def connection_settings(
    reader: OptionReader, *, retry_deadline: float = DEFAULT_RETRY_DEADLINE
) -> PipelineSettings:
    """`host`, `port` or `addresses`, `tls` and its `tlsCaFile`, `tlsHostnameCheck`, the
    credentials (`username`, `password` or their aliases `login`, `passcode`; `usernameEnv`,
    `passwordEnv`, `passwordFile`), `timeoutSec`, `maxInflight`, `failoverDeadlineSec`,
    `retryPauseSec`: how to reach the broker, and how long to keep trying when it fails.
    `retry_deadline` bounds the retries of refused sends (the sink's `retryDeadlineSec`).

    Checked here, so that a mistake stops the query before it starts: the CA file is loaded,
    and the password file and the environment variables must be readable in this process (the
    driver). The executors read them again when they connect: the settings hold the file's path
    and the variables' names, never a password read from them."""
    defaults = PipelineSettings()
    timeout = reader.seconds("timeoutSec", defaults.timeout)
    pause = reader.seconds("retryPauseSec", DEFAULT_RETRY_PAUSE)
    assert timeout is not None
    assert pause is not None
    retry = RetryPolicy(pause=pause, backoff=2.0, max_pause=_MAX_PAUSE, deadline=retry_deadline)
    addresses = reader.parsed("addresses", parse_address_list, AddressList((), None))
    tls = _tls(reader, addresses)
    username, password = reader.text("username"), reader.text("password")
    login, passcode = reader.text("login"), reader.text("passcode")
    username_env, password_env, password_file = _credential_sources(
        reader,
        ("username", username) if username is not None else ("login", login),
        ("password", password) if password is not None else ("passcode", passcode),
    )
    return PipelineSettings(
        host=reader.optional_text("host") or DEFAULT_HOST,
        port=reader.parsed("port", int_parser(1, 65535), DEFAULT_PORT),
        username=username,
        password=password,
        login=login,
        passcode=passcode,
        timeout=timeout,
        retry=retry,
        max_inflight=reader.integer("maxInflight", defaults.max_inflight, minimum=1),
        addresses=addresses.addresses,
        failover=reader.seconds_or_off("failoverDeadlineSec", DEFAULT_FAILOVER),
        tls=tls,
        username_env=username_env,
        password_env=password_env,
        password_file=password_file,
    )


def _tls(reader: OptionReader, addresses: AddressList) -> TlsSettings | None:
    """`tls` (default: what the scheme of `addresses` says, else false), `tlsCaFile` and
    `tlsHostnameCheck`; the CA file is loaded now, to refuse a bad one before the query starts."""
    given = reader.text("tls")
    on = reader.boolean("tls", bool(addresses.tls))
    if given is not None and addresses.tls is not None and on != addresses.tls:
        scheme = "ssl://" if addresses.tls else "stomp://"
        raise ConfigError(
            "tls",
            f"option tls={given.strip()} contradicts the {scheme} addresses of option "
            "addresses: leave tls out, or give addresses of the other scheme",
        )
    ca_file = reader.optional_text("tlsCaFile")
    check_hostname = reader.boolean("tlsHostnameCheck", True)
    if not on:
        for name in ("tlsCaFile", "tlsHostnameCheck"):
            if reader.optional_text(name) is not None:
                raise ConfigError(
                    name,
                    f"option {name} applies to TLS connections only: add tls=true (with the "
                    "port of the broker's imq.stomp.tls.port), or ssl:// addresses",
                )
        return None
    if not addresses.addresses and reader.optional_text("port") is None:
        raise ConfigError(
            "port",
            "option port is required with tls=true: STOMP over TLS has no default port (give "
            "the broker's imq.stomp.tls.port)",
        )
    settings = TlsSettings(ca_file=ca_file, check_hostname=check_hostname)
    client_context(settings, "tlsCaFile")
    return settings


def _credential_sources(
    reader: OptionReader, username: tuple[str, str | None], password: tuple[str, str | None]
) -> tuple[str | None, str | None, str | None]:
    """`usernameEnv`, `passwordEnv` and `passwordFile`: one source per credential (beside
    `username` and `password`, each given as its option's name and value), and what they name
    readable here."""
    username_env = reader.optional_text("usernameEnv")
    password_env = reader.optional_text("passwordEnv")
    password_file = reader.optional_text("passwordFile")
    one_source({username[0]: username[1], "usernameEnv": username_env})
    one_source(
        {password[0]: password[1], "passwordEnv": password_env, "passwordFile": password_file}
    )
    if username_env is not None:
        read_environment(username_env, "usernameEnv")
    if password_env is not None:
        read_environment(password_env, "passwordEnv")
    if password_file is not None:
        read_password_file(password_file, "passwordFile")
    return username_env, password_env, password_file


@dataclass(frozen=True, slots=True)
class Starting:
    """`startingOffsets`: a position kind, and the sequence number for SEQUENCE."""

    position: StartingPosition
    sequence: int = 0


def _starting(reader: OptionReader, name: str) -> Starting | None:
    text = reader.text(name)
    if text is None or not text.strip():
        return None
    value = text.strip()
    for position in (StartingPosition.EARLIEST, StartingPosition.LATEST):
        if value.lower() == position.value:
            return Starting(position)
    if value.lower() == StartingPosition.COMMITTED.value:
        return Starting(StartingPosition.COMMITTED)
    accepted = 'earliest, latest, committed, a sequence number, or JSON {"sequence": N}'
    try:
        parsed = json.loads(value)
    except ValueError:
        raise ConfigError(
            name, f"option {name}={value!r} is not valid; it must be {accepted}"
        ) from None
    if isinstance(parsed, dict):
        parsed = parsed.get("sequence")
    if isinstance(parsed, bool) or not isinstance(parsed, int) or not 0 <= parsed <= MAX_NUMBER:
        raise ConfigError(name, f"option {name}={value!r} is not valid; it must be {accepted}")
    return Starting(StartingPosition.SEQUENCE, parsed)


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """Everything the readers need, parsed once on the driver and pickled to executors."""

    connection: PipelineSettings
    destinations: SourceDestinations
    group: str | None
    starting: Starting | None  # None: not given (each kind of read has its default)
    ending: int | None  # batch reads: `endingOffsets` (exclusive; None: the head)
    max_messages: int | None  # maxMessagesPerTrigger; None: the destination's flow limit
    max_bytes: int | None  # maxBytesPerTrigger; None: no byte cap
    min_partitions: int
    fail_on_data_loss: bool
    include_headers: bool
    lease_ttl_ms: int | None  # None: the broker's imq.lease.ttl
    on_expired_lease: ExpiredLeasePolicy

    @property
    def is_queue(self) -> bool:
        return self.destinations.kind is DestinationKind.QUEUE

    def stream_starting(self) -> Starting:
        """Where a stream with a new checkpoint starts: by default a topic at its group's
        committed cursor; a queue always at the messages waiting in it."""
        starting = self.starting
        if not self.is_queue:
            return starting or Starting(StartingPosition.COMMITTED)
        if starting is not None and starting.position in (
            StartingPosition.LATEST,
            StartingPosition.SEQUENCE,
        ):
            raise ConfigError(
                "startingOffsets",
                f"option startingOffsets={starting.position.value} does not apply to queues "
                f"({self.destinations.text}): a queue stream reads the messages waiting in them "
                "(earliest or committed)",
            )
        return Starting(StartingPosition.EARLIEST)

    def stream_group(self) -> str:
        """The group, which a stream needs: its cursor or its leases are named after it."""
        if self.group is None:
            raise ConfigError(
                "group",
                "option group is required for a stream: it names the reader's durable cursor "
                "(topics) or leases (queues); use one name per query, such as the query's name",
            )
        return self.group


def source_options(options: Mapping[str, str]) -> SourceOptions:
    option_names.check_names(options, option_names.SOURCE, "source", option_names.SINK)
    reader = OptionReader(options)
    destinations = parse_destinations(
        reader.required(
            "destination",
            "the queues or topics to read: /queue/NAME or /topic/NAME, several separated by "
            "commas, or a pattern such as /topic/orders.*",
        )
    )
    starting = _starting(reader, "startingOffsets")
    ending_text = reader.text("endingOffsets")
    ending = None
    if ending_text is not None and ending_text.strip().lower() not in ("", "latest"):
        ending = reader.integer("endingOffsets", 0)
    if destinations.several:
        _one_destination_positions(destinations, starting, ending)
    ttl = reader.seconds("leaseTtlSec", None)
    return SourceOptions(
        connection=connection_settings(reader),
        destinations=destinations,
        group=_group(reader, "group"),
        starting=starting,
        ending=ending,
        max_messages=reader.optional_integer("maxMessagesPerTrigger"),
        max_bytes=reader.size("maxBytesPerTrigger"),
        min_partitions=reader.integer("minPartitions", 1, minimum=1),
        fail_on_data_loss=reader.boolean("failOnDataLoss", True),
        include_headers=reader.boolean("includeHeaders", True),
        lease_ttl_ms=None if ttl is None else round(ttl * 1000),
        on_expired_lease=_policy(reader),
    )


def _one_destination_positions(
    destinations: SourceDestinations, starting: Starting | None, ending: int | None
) -> None:
    """A sequence number is a position in one destination: refused for several."""
    if starting is not None and starting.position is StartingPosition.SEQUENCE:
        named = "startingOffsets"
    elif ending is not None:
        named = "endingOffsets"
    else:
        return
    raise ConfigError(
        named,
        f"option {named} gives a sequence number, a position in one destination, but option "
        f"destination={destinations.text!r} names several: use earliest, latest or committed, "
        "or read each destination with a source of its own",
    )


def _policy(reader: OptionReader) -> ExpiredLeasePolicy:
    policy = reader.choice("onExpiredLease", ExpiredLeasePolicy, ExpiredLeasePolicy.FAIL)
    assert isinstance(policy, ExpiredLeasePolicy)
    return policy


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """The sink's options; `sink_id` is None for batch writes and atLeastOnce."""

    connection: PipelineSettings
    destination: str | None  # None: every row names its own (a destination column)
    guarantee: DeliveryGuarantee
    sink_id: str | None
    stage_ttl_ms: int | None  # None: the broker's imq.stage.ttl
    persistent: bool
    priority: int


def sink_options(options: Mapping[str, str]) -> SinkOptions:
    option_names.check_names(options, option_names.SINK, "sink", option_names.SOURCE)
    reader = OptionReader(options)
    destination = None
    if reader.text("destination"):
        destination = _destination(reader, "destination", "").path
    deadline = reader.seconds("retryDeadlineSec", DEFAULT_RETRY_DEADLINE)
    assert deadline is not None
    guarantee = reader.choice(
        "deliveryGuarantee", DeliveryGuarantee, DeliveryGuarantee.EXACTLY_ONCE
    )
    assert isinstance(guarantee, DeliveryGuarantee)
    ttl = reader.seconds("stageTtlSec", None)
    return SinkOptions(
        connection=connection_settings(reader, retry_deadline=deadline),
        destination=destination,
        guarantee=guarantee,
        sink_id=_group(reader, "sinkId"),
        stage_ttl_ms=None if ttl is None else round(ttl * 1000),
        persistent=reader.boolean("persistent", True),
        priority=reader.parsed("priority", int_parser(0, 9), 4),
    )
