"""Configuration: defaults, the properties file, -D overrides, refusals that name the property."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluiceway.config import (
    BrokerConfig,
    DispatchPolicy,
    LimitBehavior,
    build_config,
    load_config,
    render_reference,
)
from sluiceway.errors import ConfigError
from sluiceway.naming import DestinationKind

ROOT = Path(__file__).resolve().parents[1]


def test_defaults_are_open_mq_and_loopback() -> None:
    config = build_config({})
    assert config == BrokerConfig()
    assert config.host == "127.0.0.1"
    assert config.stomp_port == 61613
    assert config.tcp_nodelay is True
    assert config.autocreate_queue
    assert config.autocreate_topic
    assert config.autocreate_queue_settings.consumer_flow_limit == 1000
    assert config.autocreate_topic_settings.consumer_flow_limit == 1000
    assert config.autocreate_queue_settings.dispatch_policy is DispatchPolicy.OPENMQ
    assert config.tx_producer_max_msgs == 1000
    assert config.tx_consumer_max_msgs == 100
    assert config.expiration_interval_s == 60


def test_values_are_parsed_by_type() -> None:
    config = build_config(
        {
            "imq.stomp.tcp.port": "7000",
            "imq.protocol.tcp.nodelay": "FALSE",
            "imq.protocol.tcp.outbufsz": "4k",
            "imq.stomp.max_frame_size": "1m",
            "imq.stomp.heartbeat.grace": "1.5",
            "imq.autocreate.queue.dispatchPolicy": "Fair",
            "imq.autocreate.topic.consumerFlowLimit": "-1",
        }
    )
    assert config.stomp_port == 7000
    assert config.tcp_nodelay is False
    assert config.tcp_outbufsz == 4096
    assert config.max_frame_size == 1024 * 1024
    assert config.heartbeat_grace == 1.5
    assert config.autocreate_queue_settings.dispatch_policy is DispatchPolicy.FAIR
    assert config.autocreate_topic_settings.consumer_flow_limit == -1


def test_shared_autocreate_property_sets_both_kinds() -> None:
    config = build_config(
        {
            "imq.autocreate.destination.maxNumMsgs": "-1",
            "imq.autocreate.destination.limitBehavior": "flow_control",
        }
    )
    for settings in (config.autocreate_queue_settings, config.autocreate_topic_settings):
        assert settings.max_num_msgs == -1
        assert settings.limit_behavior is LimitBehavior.FLOW_CONTROL


def test_auto_created_and_admin_created_defaults_differ_as_in_open_mq() -> None:
    config = build_config({"imq.destination.queue.made.maxNumProducers": "5"})
    auto = config.autocreate_queue_settings
    (made,) = config.destinations
    assert (auto.max_num_msgs, auto.max_total_msg_bytes, auto.max_bytes_per_msg) == (
        100_000,
        10 * 1024**3,
        10 * 1024**2,
    )
    assert (made.settings.max_num_msgs, made.settings.max_bytes_per_msg) == (-1, -1)
    assert made.settings.max_num_producers == 5
    assert made.settings.limit_behavior is LimitBehavior.REJECT_NEWEST


def test_the_dead_message_queue_cannot_be_defined_in_the_configuration() -> None:
    with pytest.raises(ConfigError, match="belong to the broker"):
        build_config({"imq.destination.queue.mq.sys.dmq.maxNumMsgs": "5"})


def test_memory_levels_must_rise() -> None:
    with pytest.raises(ConfigError, match=r"imq\.orange\.threshold"):
        build_config({"imq.yellow.threshold": "95"})


def test_per_destination_properties_create_destinations() -> None:
    config = build_config(
        {
            "imq.autocreate.queue.consumerFlowLimit": "50",
            "imq.destination.queue.orders.eu.consumerFlowLimit": "3",
            "imq.destination.topic.prices.consumerFlowLimit": "10",
        }
    )
    by_name = {d.name: d for d in config.destinations}
    orders = by_name["orders.eu"]  # dots belong to the name; the property is the last part
    assert orders.kind is DestinationKind.QUEUE
    assert orders.settings.consumer_flow_limit == 3
    assert by_name["prices"].kind is DestinationKind.TOPIC


@pytest.mark.parametrize(
    ("name", "value", "fragment"),
    [
        ("imq.stomp.tcp.port", "http", "an integer from -1 to 65535"),
        ("imq.stomp.tcp.port", "70000", "an integer from -1 to 65535"),
        ("imq.protocol.tcp.nodelay", "yes", "true or false"),
        ("imq.protocol.tcp.inbufsz", "2 kilobytes", "such as 2048, 512k"),
        ("imq.autocreate.queue.dispatchPolicy", "random", "one of openmq, fair"),
        ("imq.autocreate.queue.consumerFlowLimit", "-5", "an integer from -1, or auto"),
        ("imq.stomp.heartbeat.grace", "0.5", "from 1.0 to 10.0"),
        ("imq.log.level", "LOUD", "DEBUG, INFO, WARNING, ERROR"),
    ],
)
def test_bad_values_name_the_property_and_accepted_values(
    name: str, value: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        build_config({name: value})
    assert raised.value.name == name
    assert name in str(raised.value)
    assert repr(value) in str(raised.value)
    assert fragment in str(raised.value)


def test_unknown_property_is_refused_with_a_suggestion() -> None:
    with pytest.raises(ConfigError) as raised:
        build_config({"imq.autocreate.queue.consumerFlowLimt": "3"})
    message = str(raised.value)
    assert "unknown property imq.autocreate.queue.consumerFlowLimt" in message
    assert "Did you mean imq.autocreate.queue.consumerFlowLimit" in message


def test_unknown_destination_property_lists_the_accepted_ones() -> None:
    with pytest.raises(ConfigError, match="accepted topic properties: consumerFlowLimit"):
        build_config({"imq.destination.topic.t.dispatchPolicy": "fair"})  # queues only
    with pytest.raises(ConfigError, match="may contain only"):
        build_config({"imq.destination.queue.bad name.consumerFlowLimit": "3"})


def test_watermarks_must_be_consistent_and_low_follows_high() -> None:
    with pytest.raises(ConfigError, match=r"imq\.stomp\.write\.low_water"):
        build_config({"imq.stomp.write.high_water": "8k", "imq.stomp.write.low_water": "16k"})
    config = build_config({"imq.stomp.write.high_water": "8k"})
    assert config.write_low_water == 2048


def test_file_then_overrides(tmp_path: Path) -> None:
    path = tmp_path / "broker.properties"
    path.write_text(
        "# Open MQ style\n"
        "imq.stomp.tcp.port = 7001\n"
        "imq.autocreate.queue.consumerFlowLimit: 20\n"
        "imq.log.level=DEBUG\n"
    )
    config = load_config(path, ["imq.stomp.tcp.port=7002"])
    assert config.stomp_port == 7002  # -D wins over the file
    assert config.autocreate_queue_settings.consumer_flow_limit == 20
    assert config.log_level == "DEBUG"


def test_malformed_override() -> None:
    with pytest.raises(ConfigError, match="name=value"):
        load_config(None, ["imq.stomp.tcp.port"])


def test_configuration_reference_is_up_to_date() -> None:
    """docs/configuration.md is generated from the declarations; regenerate it when they change:
    `sluiceway broker --list-properties > docs/configuration.md`."""
    assert (ROOT / "docs" / "configuration.md").read_text() == render_reference()


def test_every_property_is_documented() -> None:
    reference = render_reference()
    for name in (
        "imq.protocol.tcp.nodelay",
        "imq.protocol.tcp.inbufsz",
        "imq.protocol.tcp.outbufsz",
        "imq.stomp.max_frame_size",
        "imq.stomp.max_header_count",
        "imq.stomp.max_header_length",
        "consumerFlowLimit",
        "dispatchPolicy",
    ):
        assert f"`{name}`" in reference
