"""Connection-factory attributes: Open MQ names and defaults, Pythonic keywords, clear refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sluiceway.client import ConnectionFactory
from sluiceway.client.settings import (
    UNLIMITED_CONSUMER_WINDOW,
    AddressList,
    ClientSettings,
    build_settings,
    parse_address_list,
)
from sluiceway.errors import ConfigError


def test_open_mq_defaults() -> None:
    settings = ConnectionFactory().settings
    assert settings == ClientSettings()
    assert settings.addresses == (("127.0.0.1", 61613),)
    assert settings.consumer_flow_limit == 1000
    assert settings.consumer_flow_threshold == 50
    assert settings.consumer_flow_limit_prefetch is True
    assert settings.connection_flow_count == 100
    assert settings.connection_flow_limit == 1000
    assert settings.connection_flow_limit_enabled is False
    assert settings.ack_timeout is None  # imqAckTimeout 0: no limit
    assert settings.ack_on_produce is None  # unset: persistent sends wait
    assert settings.reconnect_enabled is False
    assert settings.reconnect_attempts == 0
    assert settings.reconnect_interval == 3.0  # imqReconnectInterval 3000 ms
    assert settings.ping_interval == 30.0  # imqPingInterval 30 s
    assert settings.queue_browser_max_messages_per_retrieve == 1000


def test_open_mq_names_with_open_mq_units() -> None:
    settings = build_settings(
        properties={
            "imqAddressList": "stomp://a:1,stomp://b:2",
            "imqConsumerFlowLimit": "100",
            "imqConsumerFlowThreshold": "10",
            "imqConsumerFlowLimitPrefetch": "false",
            "imqConnectionFlowCount": "7",
            "imqConnectionFlowLimit": "40",
            "imqConnectionFlowLimitEnabled": "true",
            "imqAckTimeout": "2500",
            "imqAckOnProduce": "true",
            "imqReconnectEnabled": "true",
            "imqReconnectAttempts": "-1",
            "imqReconnectInterval": "250",
            "imqPingInterval": "5",
            "imqQueueBrowserMaxMessagesPerRetrieve": "50",
        }
    )
    assert settings.addresses == (("a", 1), ("b", 2))
    assert (settings.consumer_flow_limit, settings.consumer_flow_threshold) == (100, 10)
    assert settings.consumer_flow_limit_prefetch is False
    assert (settings.connection_flow_count, settings.connection_flow_limit) == (7, 40)
    assert settings.connection_flow_limit_enabled is True
    assert settings.ack_timeout == 2.5
    assert settings.ack_on_produce is True
    assert settings.attempts_per_address is None  # -1: no limit
    assert settings.reconnect_interval == 0.25
    assert settings.ping_interval == 5.0
    assert settings.queue_browser_max_messages_per_retrieve == 50


def test_keywords_win_over_properties(tmp_path: Path) -> None:
    path = tmp_path / "client.properties"
    path.write_text("imqConsumerFlowLimit=100\nimqConsumerFlowThreshold = 30\n")
    factory = ConnectionFactory("stomp://h:7", properties=path, consumer_flow_limit=5)
    assert factory.settings.consumer_flow_limit == 5
    assert factory.settings.consumer_flow_threshold == 30
    assert factory.settings.addresses == (("h", 7),)


@pytest.mark.parametrize(
    ("properties", "keywords", "window"),
    [
        ({}, {}, 1000),
        ({}, {"consumer_flow_limit": 20}, 20),
        ({"imqConsumerFlowLimit": "-1"}, {}, UNLIMITED_CONSUMER_WINDOW),
        ({}, {"consumer_flow_limit": 0}, UNLIMITED_CONSUMER_WINDOW),
    ],
)
def test_a_consumer_asks_for_a_finite_window_even_without_a_limit(
    properties: dict[str, str], keywords: dict[str, Any], window: int
) -> None:
    settings = build_settings(None, properties, **keywords)
    assert settings.consumer_window == window


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"consumer_flow_limit": "many"}, "consumer_flow_limit (imqConsumerFlowLimit)"),
        ({"consumer_flow_threshold": 150}, "consumer_flow_threshold (imqConsumerFlowThreshold)"),
        ({"connection_flow_count": -1}, "connection_flow_count (imqConnectionFlowCount)"),
        ({"ack_timeout": -1}, "ack_timeout (imqAckTimeout)"),
        ({"reconnect_enabled": "yes"}, "reconnect_enabled (imqReconnectEnabled)"),
        ({"address": "http://x"}, "addresses (imqAddressList)"),
        ({"prefetch": True}, "unknown connection-factory keyword 'prefetch'"),
    ],
)
def test_bad_keywords_raise_at_construction_naming_the_attribute(
    kwargs: dict[str, object], named: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        ConnectionFactory(**kwargs)  # type: ignore[arg-type]  # wrong on purpose
    assert named in str(raised.value)


@pytest.mark.parametrize(
    ("name", "value", "fragment"),
    [
        ("imqConsumerFlowLimit", "lots", "an integer"),
        ("imqConsumerFlowThreshold", "101", "from 0 to 100"),
        ("imqConnectionFlowLimitEnabled", "maybe", "true or false"),
        ("imqConsumerFlowLimt", "3", "unknown connection-factory attribute imqConsumerFlowLimt"),
    ],
)
def test_bad_open_mq_values_raise_naming_the_attribute(
    name: str, value: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        ConnectionFactory(properties={name: value})
    assert raised.value.name == name
    assert fragment in str(raised.value)


def test_address_schemes_say_plain_or_tls_and_do_not_mix() -> None:
    assert parse_address_list("a:1, stomp://b:2") == AddressList((("a", 1), ("b", 2)), False)
    assert parse_address_list("ssl://a:1,stomp+ssl://[::1]:2,c:3").tls is True
    assert parse_address_list("a").tls is None  # bare: as the client's TLS setting says
    with pytest.raises(ValueError, match="no default port"):
        parse_address_list("ssl://a")
    with pytest.raises(ValueError, match="not 'stomp://a:1' with 'ssl://b:2'"):
        parse_address_list("stomp://a:1,ssl://b:2")
