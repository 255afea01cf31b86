"""Broker configuration: one frozen object, built once at the edge and passed down.

Values come, in order of precedence, from the defaults below, a properties file (`--config FILE`,
Java-properties syntax) and `-D name=value` overrides, the way `imqbrokerd` takes them. Property
names are Open MQ's where Open MQ has one (`imq.autocreate.queue.consumerFlowLimit`,
`imq.protocol.tcp.nodelay`, ...); properties Sluiceway adds use the `imq.stomp.` prefix.

Every property is declared once, on the dataclass field it sets (name, parser, documentation), so
the reference in `docs/configuration.md` is generated from the same declarations that parse the
values (`render_reference()`), and an unknown name or a bad value stops start-up with a message
that names the property and the values it accepts.

Destination properties (`consumerFlowLimit`, `dispatchPolicy`) apply in three places:
`imq.autocreate.queue.<prop>` / `imq.autocreate.topic.<prop>` set the defaults of auto-created
destinations, and `imq.destination.queue.<NAME>.<prop>` / `imq.destination.topic.<NAME>.<prop>`
create destination NAME at start-up with that setting.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

from sluiceway.errors import ConfigError
from sluiceway.javaprops import load_properties
from sluiceway.naming import DestinationKind, validate_name

E = TypeVar("E", bound=enum.Enum)


class DispatchPolicy(enum.Enum):
    """How a queue shares its pending messages among ready consumers.

    OPENMQ reproduces Open MQ: the first ready consumer takes up to its flow-control window from
    the shared pending list, so with a backlog smaller than the sum of the windows one consumer may
    get everything while the others idle (the trade-off the Open MQ tuning guide describes: fewer,
    larger batches; uneven spread). FAIR gives each message to the ready consumer with the fewest
    outstanding messages, so a small backlog is spread evenly, at the cost of one comparison per
    consumer per message.
    """

    OPENMQ = "openmq"
    FAIR = "fair"


# --------------------------------------------------------------------------- value parsers


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    raise ValueError("true or false")


def int_parser(minimum: int | None = None, maximum: int | None = None) -> Callable[[str], int]:
    """A parser for a decimal integer within [minimum, maximum]."""

    def parse(text: str) -> int:
        bounds = _describe_bounds(minimum, maximum)
        try:
            value = int(text.strip(), 10)
        except ValueError:
            raise ValueError(f"an integer{bounds}") from None
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            raise ValueError(f"an integer{bounds}")
        return value

    return parse


def float_parser(minimum: float, maximum: float) -> Callable[[str], float]:
    """A parser for a decimal number within [minimum, maximum]."""

    def parse(text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            raise ValueError(f"a number from {minimum} to {maximum}") from None
        if not minimum <= value <= maximum:
            raise ValueError(f"a number from {minimum} to {maximum}")
        return value

    return parse


_SIZE_UNITS: Final = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
_SIZE_RE: Final = re.compile(r"^\s*(-?\d+)\s*([bkmgBKMG]?)\s*$")


def size_parser(*, allow_unlimited: bool = False) -> Callable[[str], int]:
    """Open MQ's size syntax: a number of bytes, or a number with `b`, `k`, `m` or `g` suffix."""

    def parse(text: str) -> int:
        accepted = "a size in bytes such as 2048, 512k, 10m or 1g"
        if allow_unlimited:
            accepted += " (-1 for unlimited)"
        match = _SIZE_RE.match(text)
        if match is None:
            raise ValueError(accepted)
        number = int(match.group(1))
        if number == -1 and allow_unlimited:
            return -1
        if number < 0:
            raise ValueError(accepted)
        return number * _SIZE_UNITS[match.group(2).lower()]

    return parse


def enum_parser(enum_type: type[E]) -> Callable[[str], E]:
    """A parser accepting the enum's values, case-insensitively."""

    def parse(text: str) -> E:
        wanted = text.strip().lower()
        for member in enum_type:
            if str(member.value).lower() == wanted:
                return member
        raise ValueError("one of " + ", ".join(str(m.value) for m in enum_type))

    return parse


def enum_text_parser(*choices: str) -> Callable[[str], str]:
    """A parser accepting one of `choices`, case-insensitively."""

    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in choices:
            raise ValueError("one of " + ", ".join(choices))
        return value

    return parse


def parse_path(text: str) -> str:
    path = text.strip()
    if not path:
        raise ValueError("a directory path")
    return path


def parse_host(text: str) -> str:
    host = text.strip()
    if not host or any(c.isspace() for c in host):
        raise ValueError("a host name or IP address, such as 127.0.0.1")
    return host


def parse_log_level(text: str) -> str:
    level = text.strip().upper()
    if level not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
        raise ValueError("one of DEBUG, INFO, WARNING, ERROR")
    return level


def _describe_bounds(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f" from {minimum} to {maximum}"
    if minimum is not None:
        return f" of at least {minimum}"
    if maximum is not None:
        return f" of at most {maximum}"
    return ""


def _format_default(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return str(value.value)
    return str(value)


# --------------------------------------------------------------------------- declarations


@dataclass(frozen=True, slots=True)
class PropertyInfo:
    """How one configuration property is named, parsed and documented."""

    name: str
    parse: Callable[[str], Any]
    doc: str
    # For destination properties: the destination kinds the property applies to, and whether its
    # auto-create default is shared by both kinds (imq.autocreate.destination.*) or per kind.
    kinds: frozenset[DestinationKind] = frozenset()
    shared_autocreate: bool = False


def prop(name: str, parse: Callable[[str], Any], default: Any, doc: str) -> Any:
    """A dataclass field that is set by broker property `name`."""
    return field(default=default, metadata={"property": PropertyInfo(name, parse, doc)})


def dest_prop(
    name: str,
    parse: Callable[[str], Any],
    default: Any,
    doc: str,
    *,
    kinds: Iterable[DestinationKind] = tuple(DestinationKind),
    shared_autocreate: bool = False,
) -> Any:
    """A dataclass field that is set by physical destination property `name`."""
    info = PropertyInfo(name, parse, doc, frozenset(kinds), shared_autocreate)
    return field(default=default, metadata={"property": info})


@dataclass(frozen=True, slots=True)
class DestinationSettings:
    """Physical destination properties (Open MQ names) of one queue or topic."""

    consumer_flow_limit: int = dest_prop(
        "consumerFlowLimit",
        int_parser(minimum=-1),
        1000,
        "Cap on each consumer's flow limit, in messages; the smaller of this and the consumer's "
        "own limit wins. 0 or -1: no cap.",
    )
    dispatch_policy: DispatchPolicy = dest_prop(
        "dispatchPolicy",
        enum_parser(DispatchPolicy),
        DispatchPolicy.OPENMQ,
        "How a queue shares pending messages among ready consumers: openmq (the first ready "
        "consumer takes up to its window, as Open MQ does) or fair (each message to the ready "
        "consumer with the fewest outstanding messages).",
        kinds=(DestinationKind.QUEUE,),
    )


@dataclass(frozen=True, slots=True)
class DestinationDefinition:
    """A destination created at start-up from `imq.destination.<kind>.<NAME>.<prop>` lines."""

    kind: DestinationKind
    name: str
    settings: DestinationSettings


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """Everything the broker is configured with. Units are in each property's documentation."""

    host: str = prop(
        "imq.hostname",
        parse_host,
        "127.0.0.1",
        "Address every service binds to. The default keeps the broker on the loopback interface.",
    )
    stomp_port: int = prop(
        "imq.stomp.tcp.port",
        int_parser(0, 65535),
        61613,
        "TCP port of the STOMP service (0: any free port, reported in the ready log line).",
    )
    tcp_nodelay: bool = prop(
        "imq.protocol.tcp.nodelay",
        parse_bool,
        True,
        "Disable Nagle's algorithm (TCP_NODELAY). Keep true: most exchanges are request and "
        "response (a SEND and its RECEIPT, an ACK), and Nagle's algorithm would delay each small "
        "reply by milliseconds. Only a slow WAN link carrying non-persistent messages without "
        "receipts gains from false.",
    )
    tcp_inbufsz: int = prop(
        "imq.protocol.tcp.inbufsz",
        size_parser(),
        0,
        "Socket receive buffer (SO_RCVBUF), in bytes; 0 leaves it to the operating system, which "
        "sizes it automatically. Open MQ's advice: about the average packet plus 1 KB (2048 for "
        "1 KB bodies) saves memory per connection; larger values help bulk transfers only "
        "slightly.",
    )
    tcp_outbufsz: int = prop(
        "imq.protocol.tcp.outbufsz",
        size_parser(),
        0,
        "Socket send buffer (SO_SNDBUF), in bytes; 0 leaves it to the operating system. Same "
        "advice as imq.protocol.tcp.inbufsz; a small send buffer also bounds how many frames "
        "wait in the kernel ahead of a RECEIPT.",
    )
    max_frame_size: int = prop(
        "imq.stomp.max_frame_size",
        size_parser(),
        72 * 1024 * 1024,
        "Largest STOMP frame accepted, in bytes, command to NUL: room for a 70m body "
        "(imq.message.max_size) and a full header block. A larger frame gets an ERROR.",
    )
    max_header_count: int = prop(
        "imq.stomp.max_header_count",
        int_parser(minimum=1),
        256,
        "Most headers accepted in one frame.",
    )
    max_header_length: int = prop(
        "imq.stomp.max_header_length",
        size_parser(),
        8 * 1024,
        "Longest header line accepted, in bytes (name, colon and value, as escaped on the wire).",
    )
    heartbeat_send_ms: int = prop(
        "imq.stomp.heartbeat.send",
        int_parser(minimum=0),
        10000,
        "Shortest interval, in ms, at which the broker offers to send heart-beats (CONNECTED "
        "heart-beat, first value); 0: the broker never sends them.",
    )
    heartbeat_receive_ms: int = prop(
        "imq.stomp.heartbeat.receive",
        int_parser(minimum=0),
        10000,
        "Interval, in ms, at which the broker wants heart-beats from clients (CONNECTED "
        "heart-beat, second value); 0: the broker does not ask for them.",
    )
    heartbeat_grace: float = prop(
        "imq.stomp.heartbeat.grace",
        float_parser(1.0, 10.0),
        2.0,
        "A client that negotiated heart-beats and sends nothing for this many negotiated intervals "
        "is disconnected with an ERROR.",
    )
    connect_timeout_ms: int = prop(
        "imq.stomp.connect.timeout",
        int_parser(minimum=1),
        10000,
        "Time, in ms, a new TCP connection has to send its CONNECT frame before it is closed.",
    )
    write_high_water: int = prop(
        "imq.stomp.write.high_water",
        size_parser(),
        256 * 1024,
        "Bytes waiting to be written to one connection above which the broker stops giving it "
        "messages: a client that stops reading costs at most this much broker memory.",
    )
    write_low_water: int = prop(
        "imq.stomp.write.low_water",
        size_parser(),
        64 * 1024,
        "Bytes waiting to be written below which delivery to a connection resumes. When only "
        "the high-water mark is set, this follows it at a quarter of its value.",
    )
    stalled_reclaim_ms: int = prop(
        "imq.stomp.stalled.reclaim",
        int_parser(minimum=0),
        5000,
        "A connection that has not drained its writes for this long (ms) gives the queue messages "
        "it holds but has not written back to the queue, so other consumers can take them; "
        "0 disables.",
    )
    max_subscriptions: int = prop(
        "imq.stomp.max_subscriptions",
        int_parser(minimum=1),
        1000,
        "Most subscriptions one connection may hold at a time.",
    )
    max_transactions: int = prop(
        "imq.stomp.max_transactions",
        int_parser(minimum=1),
        100,
        "Most transactions one connection may have open at a time.",
    )
    tx_producer_max_msgs: int = prop(
        "imq.transaction.producer.maxNumMsgs",
        int_parser(minimum=1),
        1000,
        "Most messages one transaction may send.",
    )
    tx_consumer_max_msgs: int = prop(
        "imq.transaction.consumer.maxNumMsgs",
        int_parser(minimum=1),
        100,
        "Most messages one transaction may acknowledge.",
    )
    message_max_size: int = prop(
        "imq.message.max_size",
        size_parser(allow_unlimited=True),
        70 * 1024 * 1024,
        "Largest message body accepted for any destination, in bytes (-1: no limit). A larger "
        "message is refused with status 423, naming this limit.",
    )
    persist_store: str = prop(
        "imq.persist.store",
        enum_text_parser("file", "memory"),
        "file",
        "Where persistent messages are kept: file (the journal under the data directory, "
        "imq.persist.file.directory) or memory (nothing survives a restart).",
    )
    data_directory: str = prop(
        "imq.persist.file.directory",
        parse_path,
        "./sluiceway-data",
        "The broker's data directory: the journal, the swap area and a lock that keeps a second "
        "broker out (`sluiceway broker --data-dir`).",
    )
    sync_policy: str = prop(
        "imq.persist.file.sync.policy",
        enum_text_parser("group", "always", "os"),
        "group",
        "When journal writes are fsynced. group: a background thread fsyncs, and every write "
        "that arrives while one fsync runs shares the next; a RECEIPT is sent once its records "
        "are on disk (survives a power cut; cheap under concurrency). always: every flush is "
        "fsynced before the broker goes on (same guarantee, one fsync per event-loop turn). os: "
        "never fsync; RECEIPTs do not wait (survives a killed broker, not a power cut).",
    )
    segment_size: int = prop(
        "imq.persist.file.segment.size",
        size_parser(),
        64 * 1024 * 1024,
        "Size at which the journal starts a new segment file; whole segments are deleted or "
        "compacted when their records are dead.",
    )
    skip_corrupt: bool = prop(
        "imq.persist.file.skip_corrupt",
        parse_bool,
        False,
        "A corrupt record in the middle of the journal stops start-up, naming its segment and "
        "offset; true skips it (the bad bytes are saved under journal/discarded) and loses the "
        "messages it held.",
    )
    swap_threshold: int = prop(
        "imq.swap.threshold",
        size_parser(),
        64 * 1024 * 1024,
        "Bytes of queued messages (bodies plus a fixed per-message estimate) the broker keeps in "
        "memory; beyond it newly queued messages go to the swap area on disk and are read back "
        "when consumers need them. 0: never swap.",
    )
    expiration_interval_s: int = prop(
        "imq.message.expiration.interval",
        int_parser(minimum=1),
        60,
        "Seconds between sweeps that remove expired messages no consumer asked for. Expired "
        "messages are never delivered, whatever this interval.",
    )
    autocreate_queue: bool = prop(
        "imq.autocreate.queue",
        parse_bool,
        True,
        "Create a queue on first use (SEND or SUBSCRIBE); false: such a frame gets an ERROR 404.",
    )
    autocreate_topic: bool = prop(
        "imq.autocreate.topic",
        parse_bool,
        True,
        "Create a topic on first use; false: such a frame gets an ERROR 404.",
    )
    log_level: str = prop(
        "imq.log.level",
        parse_log_level,
        "INFO",
        "Broker log level: DEBUG, INFO, WARNING or ERROR.",
    )
    autocreate_queue_settings: DestinationSettings = field(default_factory=DestinationSettings)
    autocreate_topic_settings: DestinationSettings = field(default_factory=DestinationSettings)
    destinations: tuple[DestinationDefinition, ...] = ()

    def autocreate_settings(self, kind: DestinationKind) -> DestinationSettings:
        """The settings a destination of `kind` gets when it is created on first use."""
        if kind is DestinationKind.QUEUE:
            return self.autocreate_queue_settings
        return self.autocreate_topic_settings

    def autocreate_enabled(self, kind: DestinationKind) -> bool:
        return self.autocreate_queue if kind is DestinationKind.QUEUE else self.autocreate_topic


# --------------------------------------------------------------------------- loading


def _broker_properties() -> dict[str, tuple[str, PropertyInfo]]:
    """Broker property name -> (BrokerConfig field name, declaration)."""
    table: dict[str, tuple[str, PropertyInfo]] = {}
    for f in dataclasses.fields(BrokerConfig):
        info = f.metadata.get("property")
        if isinstance(info, PropertyInfo):
            table[info.name] = (f.name, info)
    return table


def _destination_properties() -> dict[str, tuple[str, PropertyInfo]]:
    """Destination property name -> (DestinationSettings field name, declaration)."""
    table: dict[str, tuple[str, PropertyInfo]] = {}
    for f in dataclasses.fields(DestinationSettings):
        info = f.metadata["property"]
        assert isinstance(info, PropertyInfo)
        table[info.name] = (f.name, info)
    return table


BROKER_PROPERTIES: Final = _broker_properties()
DESTINATION_PROPERTIES: Final = _destination_properties()


def autocreate_property_name(kind: DestinationKind, info: PropertyInfo) -> str:
    scope = "destination" if info.shared_autocreate else kind.value
    return f"imq.autocreate.{scope}.{info.name}"


def _autocreate_properties() -> dict[str, tuple[DestinationKind, str, PropertyInfo]]:
    table: dict[str, tuple[DestinationKind, str, PropertyInfo]] = {}
    for field_name, info in DESTINATION_PROPERTIES.values():
        for kind in DestinationKind:
            if kind in info.kinds:
                table[autocreate_property_name(kind, info)] = (kind, field_name, info)
    return table


AUTOCREATE_PROPERTIES: Final = _autocreate_properties()
_DESTINATION_LINE: Final = re.compile(r"^imq\.destination\.(queue|topic)\.(.+)\.([A-Za-z]+)$")


def _parse_value(name: str, info: PropertyInfo, text: str) -> Any:
    try:
        return info.parse(text)
    except ValueError as exc:
        raise ConfigError(
            name, f"property {name} has the value {text!r}; accepted values: {exc}"
        ) from None


def _unknown(name: str) -> ConfigError:
    known = [*BROKER_PROPERTIES, *AUTOCREATE_PROPERTIES]
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.75)
    hint = f" Did you mean {' or '.join(close)}?" if close else ""
    return ConfigError(
        name,
        f"unknown property {name}.{hint} The accepted properties are listed in "
        "docs/configuration.md (sluiceway broker --list-properties prints them).",
    )


def build_config(values: Mapping[str, str]) -> BrokerConfig:
    """Build a validated BrokerConfig from property names and their text values.

    Raises ConfigError naming the first unknown property or bad value.
    """
    broker: dict[str, Any] = {}
    autocreate: dict[DestinationKind, dict[str, Any]] = {k: {} for k in DestinationKind}
    per_destination: dict[tuple[DestinationKind, str], dict[str, Any]] = {}
    for name, text in values.items():
        if name in BROKER_PROPERTIES:
            field_name, info = BROKER_PROPERTIES[name]
            broker[field_name] = _parse_value(name, info, text)
        elif name in AUTOCREATE_PROPERTIES:
            kind, field_name, info = AUTOCREATE_PROPERTIES[name]
            autocreate[kind][field_name] = _parse_value(name, info, text)
        elif (match := _DESTINATION_LINE.match(name)) is not None:
            kind = DestinationKind(match.group(1))
            field_name, info = _destination_property(name, kind, match.group(3))
            key = (kind, _destination_name(name, match.group(2)))
            per_destination.setdefault(key, {})[field_name] = _parse_value(name, info, text)
        else:
            raise _unknown(name)
    if "write_low_water" not in broker and "write_high_water" in broker:
        default_low = BrokerConfig().write_low_water
        broker["write_low_water"] = min(default_low, broker["write_high_water"] // 4)
    queue_defaults = DestinationSettings(**autocreate[DestinationKind.QUEUE])
    topic_defaults = DestinationSettings(**autocreate[DestinationKind.TOPIC])
    defaults = {DestinationKind.QUEUE: queue_defaults, DestinationKind.TOPIC: topic_defaults}
    definitions = tuple(
        DestinationDefinition(kind, dest, dataclasses.replace(defaults[kind], **fields))
        for (kind, dest), fields in sorted(per_destination.items(), key=lambda i: i[0][1])
    )
    config = BrokerConfig(
        **broker,
        autocreate_queue_settings=queue_defaults,
        autocreate_topic_settings=topic_defaults,
        destinations=definitions,
    )
    _check_consistency(config)
    return config


def _destination_property(
    name: str, kind: DestinationKind, prop_name: str
) -> tuple[str, PropertyInfo]:
    entry = DESTINATION_PROPERTIES.get(prop_name)
    if entry is None or kind not in entry[1].kinds:
        accepted = sorted(n for n, (_, i) in DESTINATION_PROPERTIES.items() if kind in i.kinds)
        raise ConfigError(
            name,
            f"unknown {kind.value} property {prop_name!r} in {name}; "
            f"accepted {kind.value} properties: {', '.join(accepted)}",
        )
    return entry


def _destination_name(property_name: str, name: str) -> str:
    try:
        validate_name(name)
    except ValueError as exc:
        raise ConfigError(property_name, f"property {property_name}: {exc}") from None
    return name


def _check_consistency(config: BrokerConfig) -> None:
    if config.write_low_water > config.write_high_water:
        raise ConfigError(
            "imq.stomp.write.low_water",
            f"imq.stomp.write.low_water ({config.write_low_water}) must not exceed "
            f"imq.stomp.write.high_water ({config.write_high_water})",
        )


def parse_override(text: str) -> tuple[str, str]:
    """Split a `-D name=value` override."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise ConfigError(
            text, f"-D {text!r} is not of the form name=value, e.g. -D imq.stomp.tcp.port=61613"
        )
    return name.strip(), value


def load_config(path: str | Path | None = None, overrides: Iterable[str] = ()) -> BrokerConfig:
    """Defaults, then the properties file at `path`, then `-D name=value` overrides."""
    values: dict[str, str] = {}
    if path is not None:
        for line in load_properties(path):
            values[line.key] = line.value
    for text in overrides:
        name, value = parse_override(text)
        values[name] = value
    return build_config(values)


def render_reference() -> str:
    """The configuration reference (docs/configuration.md), generated from the declarations."""
    lines = [
        "# Configuration reference",
        "",
        "Generated from `src/sluiceway/config.py` (`sluiceway broker --list-properties`); a test",
        "checks that this file matches. Set properties in a file given with `--config FILE`",
        "(Java-properties syntax) or on the command line with `-D name=value`, which wins.",
        "An unknown property or a bad value stops start-up with a message that names it.",
        "",
        "## Broker properties",
        "",
        "| property | default | meaning |",
        "|---|---|---|",
    ]
    defaults = BrokerConfig()
    for name, (field_name, info) in BROKER_PROPERTIES.items():
        default = _format_default(getattr(defaults, field_name))
        lines.append(f"| `{name}` | `{default}` | {info.doc} |")
    lines += [
        "",
        "## Destination properties",
        "",
        "Each applies as `imq.autocreate.<queue|topic>.<property>` (the default for destinations",
        "created on first use) and as `imq.destination.<queue|topic>.<NAME>.<property>` (creates",
        "destination NAME at start-up with that value).",
        "",
        "| property | applies to | default | meaning |",
        "|---|---|---|---|",
    ]
    settings = DestinationSettings()
    for name, (field_name, info) in DESTINATION_PROPERTIES.items():
        kinds = ", ".join(k.value for k in DestinationKind if k in info.kinds)
        default = _format_default(getattr(settings, field_name))
        lines.append(f"| `{name}` | {kinds} | `{default}` | {info.doc} |")
    return "\n".join(lines) + "\n"
