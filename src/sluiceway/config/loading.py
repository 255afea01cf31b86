"""Building the configuration from defaults, a properties file and -D overrides."""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from sluiceway.config.broker import BrokerConfig
from sluiceway.config.destination import (
    DestinationDefinition,
    DestinationSettings,
    autocreate_defaults,
)
from sluiceway.config.properties import PropertyInfo
from sluiceway.config.service import ServiceConfig
from sluiceway.errors import ConfigError
from sluiceway.javaprops import load_properties
from sluiceway.naming import SYSTEM_PREFIX, DestinationKind, validate_name


def _broker_properties() -> dict[str, tuple[str, PropertyInfo]]:
    """Broker property name -> (BrokerConfig field name, declaration)."""
    table: dict[str, tuple[str, PropertyInfo]] = {}
    service = {f.name for f in dataclasses.fields(ServiceConfig)}
    # The broker's own properties first, then those of the services around it (for the reference).
    fields = sorted(dataclasses.fields(BrokerConfig), key=lambda f: f.name in service)
    for f in fields:
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


def _autocreate_properties() -> dict[str, tuple[tuple[DestinationKind, ...], str, PropertyInfo]]:
    """`imq.autocreate.*` name -> (the kinds it sets the default for, field name, declaration);
    a shared name (`imq.autocreate.destination.*`) sets it for both kinds."""
    table: dict[str, tuple[tuple[DestinationKind, ...], str, PropertyInfo]] = {}
    for field_name, info in DESTINATION_PROPERTIES.values():
        for kind in DestinationKind:
            if kind in info.kinds:
                name = autocreate_property_name(kind, info)
                kinds = table[name][0] if name in table else ()
                table[name] = ((*kinds, kind), field_name, info)
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
    autocreate: dict[DestinationKind, dict[str, Any]] = {
        kind: autocreate_defaults(kind) for kind in DestinationKind
    }
    per_destination: dict[tuple[DestinationKind, str], dict[str, Any]] = {}
    for name, text in values.items():
        if name in BROKER_PROPERTIES:
            field_name, info = BROKER_PROPERTIES[name]
            broker[field_name] = _parse_value(name, info, text)
        elif name in AUTOCREATE_PROPERTIES:
            kinds, field_name, info = AUTOCREATE_PROPERTIES[name]
            value = _parse_value(name, info, text)
            for kind in kinds:
                autocreate[kind][field_name] = value
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
    # Destinations defined in the configuration are admin-created: Open MQ's admin defaults.
    definitions = tuple(
        DestinationDefinition(kind, dest, DestinationSettings(**fields))
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
    if name.startswith(SYSTEM_PREFIX):
        raise ConfigError(
            property_name,
            f"property {property_name}: names beginning with {SYSTEM_PREFIX!r} belong to the "
            "broker; the dead message queue keeps Open MQ's settings and is changed at run time "
            "through the admin API",
        )
    return name


def change_settings(
    kind: DestinationKind, settings: DestinationSettings, changes: Mapping[str, str]
) -> DestinationSettings:
    """`settings` with `changes` (Open MQ property names, text values) applied, as an
    administrator changes a destination at run time. Raises ConfigError naming a bad one."""
    fields: dict[str, Any] = {}
    for prop_name, text in changes.items():
        field_name, info = _destination_property(prop_name, kind, prop_name)
        fields[field_name] = _parse_value(prop_name, info, text)
    return dataclasses.replace(settings, **fields)


# Broker properties `update bkr` may change while the broker runs (they are read where they are
# used); the others (ports, the data directory, the store...) need a restart.
RUNTIME_PROPERTIES: Final = frozenset(
    {
        "imq.system.max_count",
        "imq.system.max_size",
        "imq.message.max_size",
        "imq.message.expiration.interval",
        "imq.autocreate.queue",
        "imq.autocreate.topic",
        "imq.log.level",
        "imq.throttling.server.threshold",
        "imq.throttling.destination.threshold",
        "imq.throttling.lag",
        "imq.producer.hold.timeout",
        "imq.producer.hold.max_messages",
        "imq.producer.hold.max_bytes",
        "imq.lease.ttl",
        "imq.lease.max_messages",
        "imq.lease.max_bytes",
        "imq.lease.max_open",
        "imq.lease.max_groups",
        "imq.cursor.max_groups",
        "imq.stage.ttl",
        "imq.destination.DMQ.truncateBody",
        "imq.destination.logDeadMsgs",
        "imq.memory.budget",
        "imq.yellow.threshold",
        "imq.orange.threshold",
        "imq.red.threshold",
        "imq.green.count",
        "imq.yellow.count",
        "imq.orange.count",
        "imq.red.count",
        "imq.memory.hysteresis",
        "imq.transaction.producer.maxNumMsgs",
        "imq.transaction.consumer.maxNumMsgs",
        "imq.stomp.max_subscriptions",
        "imq.stomp.max_transactions",
        "imq.stomp.transactions.max_messages",
        "imq.stomp.transactions.max_bytes",
        "imq.stomp.stalled.reclaim",
        "imq.persist.file.disk.free.limit",
        "imq.persist.file.disk.backlog.max_size",
    }
)


def update_config(config: BrokerConfig, changes: Mapping[str, str]) -> BrokerConfig:
    """`config` with `changes` applied, as `update bkr -o name=value` does: only properties in
    RUNTIME_PROPERTIES and the `imq.autocreate.*` destination defaults. Raises ConfigError
    naming the first unknown, fixed or badly valued property."""
    broker: dict[str, Any] = {}
    autocreate: dict[DestinationKind, dict[str, Any]] = {}
    for name, text in changes.items():
        if name in AUTOCREATE_PROPERTIES:
            kinds, field_name, info = AUTOCREATE_PROPERTIES[name]
            value = _parse_value(name, info, text)
            for kind in kinds:
                autocreate.setdefault(kind, {})[field_name] = value
        elif name in RUNTIME_PROPERTIES:
            field_name, info = BROKER_PROPERTIES[name]
            broker[field_name] = _parse_value(name, info, text)
        elif name in BROKER_PROPERTIES:
            raise ConfigError(
                name, f"{name} cannot be changed while the broker runs; set it and restart"
            )
        else:
            raise _unknown(name)
    updated = dataclasses.replace(config, **broker)
    for kind, fields in autocreate.items():
        settings = dataclasses.replace(updated.autocreate_settings(kind), **fields)
        if kind is DestinationKind.QUEUE:
            updated = dataclasses.replace(updated, autocreate_queue_settings=settings)
        else:
            updated = dataclasses.replace(updated, autocreate_topic_settings=settings)
    _check_consistency(updated)
    return updated


def _check_consistency(config: BrokerConfig) -> None:
    _check_cluster(config)
    if config.stomp_port < 0 and config.stomp_tls_port < 0 and config.ws_port < 0:
        raise ConfigError(
            "imq.stomp.tcp.port",
            "no STOMP listener is on: imq.stomp.tcp.port, imq.stomp.tls.port and "
            "imq.stomp.ws.port are all -1; give at least one of them a port (0: any free one)",
        )
    if config.write_low_water > config.write_high_water:
        raise ConfigError(
            "imq.stomp.write.low_water",
            f"imq.stomp.write.low_water ({config.write_low_water}) must not exceed "
            f"imq.stomp.write.high_water ({config.write_high_water})",
        )
    levels = (
        ("imq.yellow.threshold", config.yellow_threshold),
        ("imq.orange.threshold", config.orange_threshold),
        ("imq.red.threshold", config.red_threshold),
    )
    for (low_name, low), (high_name, high) in itertools.pairwise(levels):
        if low > high:
            raise ConfigError(
                high_name,
                f"{high_name} ({high}) must not be below {low_name} ({low}): the memory levels "
                "rise from YELLOW to ORANGE to RED",
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
        "Generated from `src/sluiceway/config/` (`sluiceway broker --list-properties`); a test",
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
        default = info.text(getattr(defaults, field_name))
        lines.append(f"| `{name}` | `{default}` | {info.doc} |")
    lines += [
        "",
        "## Destination properties",
        "",
        "Each applies as `imq.destination.<queue|topic>.<NAME>.<property>` (creates destination",
        "NAME at start-up with that value; other properties take the admin-created default) and",
        "as the default for destinations created on first use:",
        "`imq.autocreate.destination.<property>` for properties both kinds share,",
        "`imq.autocreate.<queue|topic>.<property>` for the others.",
        "",
        "| property | applies to | admin-created default | auto-created default | meaning |",
        "|---|---|---|---|---|",
    ]
    settings = DestinationSettings()
    for name, (field_name, info) in DESTINATION_PROPERTIES.items():
        kinds = ", ".join(k.value for k in DestinationKind if k in info.kinds)
        default = info.text(getattr(settings, field_name))
        auto = info.text(info.autocreate_default) if info.has_autocreate_default else default
        scope = (
            "destination"
            if info.shared_autocreate
            else "queue"
            if info.kinds == {DestinationKind.QUEUE}
            else "<queue/topic>"
        )
        lines.append(
            f"| `{name}` | {kinds} | `{default}` | `{auto}` (`imq.autocreate.{scope}.{name}`) "
            f"| {info.doc} |"
        )
    return "\n".join(lines) + "\n"


def _check_cluster(config: BrokerConfig) -> None:
    """A jdbc store needs its database and this broker's id; a cluster needs a jdbc store."""
    if config.persist_store == "jdbc":
        if not config.jdbc_url:
            raise ConfigError(
                "imq.persist.jdbc.postgresql.property.url",
                "imq.persist.store=jdbc needs the database: set "
                "imq.persist.jdbc.postgresql.property.url to a libpq URI such as "
                "postgresql://sluiceway@127.0.0.1:5432/sluiceway",
            )
        if not config.broker_id:
            raise ConfigError(
                "imq.brokerid",
                "imq.persist.store=jdbc needs imq.brokerid: the name under which this broker "
                "keeps its state in the database, unique among the brokers sharing it",
            )
    if config.cluster_ha and config.persist_store != "jdbc":
        raise ConfigError(
            "imq.cluster.ha",
            f"imq.cluster.ha=true needs the shared store, imq.persist.store=jdbc (it is "
            f"{config.persist_store}): the members of a cluster keep their state in one "
            "PostgreSQL database",
        )
    if config.monitor_threshold * config.monitor_interval < config.heartbeat_interval / 2:
        raise ConfigError(
            "imq.cluster.monitor.threshold",
            "imq.cluster.monitor.interval x imq.cluster.monitor.threshold must be at least half "
            "of imq.cluster.heartbeat.interval: it is the margin between a broker fencing "
            "itself and another taking over its messages",
        )
