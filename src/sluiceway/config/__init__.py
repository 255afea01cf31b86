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

from sluiceway.config.broker import BrokerConfig
from sluiceway.config.destination import (
    DeliveryOrder,
    DestinationDefinition,
    DestinationSettings,
    DispatchPolicy,
    LimitBehavior,
)
from sluiceway.config.loading import (
    AUTOCREATE_PROPERTIES,
    BROKER_PROPERTIES,
    DESTINATION_PROPERTIES,
    autocreate_property_name,
    build_config,
    change_settings,
    load_config,
    parse_override,
    render_reference,
    update_config,
)
from sluiceway.config.properties import (
    PropertyInfo,
    dest_prop,
    enum_parser,
    enum_text_parser,
    float_parser,
    int_parser,
    parse_bool,
    parse_host,
    parse_log_level,
    parse_path,
    prop,
    size_parser,
)

__all__ = [
    "AUTOCREATE_PROPERTIES",
    "BROKER_PROPERTIES",
    "DESTINATION_PROPERTIES",
    "BrokerConfig",
    "DeliveryOrder",
    "DestinationDefinition",
    "DestinationSettings",
    "DispatchPolicy",
    "LimitBehavior",
    "PropertyInfo",
    "autocreate_property_name",
    "build_config",
    "change_settings",
    "dest_prop",
    "enum_parser",
    "enum_text_parser",
    "float_parser",
    "int_parser",
    "load_config",
    "parse_bool",
    "parse_host",
    "parse_log_level",
    "parse_override",
    "parse_path",
    "prop",
    "render_reference",
    "size_parser",
    "update_config",
]
