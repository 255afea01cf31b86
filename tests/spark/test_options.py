"""Options as Spark hands them over (a case-insensitive mapping with lower-cased keys), without a
Spark session."""

from __future__ import annotations

import pytest
from pyspark.sql.datasource import CaseInsensitiveDict

from sluiceway.errors import ConfigError
from sluiceway.naming import DestinationKind
from sluiceway.spark.options import (
    DeliveryGuarantee,
    ExpiredLeasePolicy,
    StartingPosition,
    sink_options,
    source_options,
)


def spark_options(**options: str) -> CaseInsensitiveDict:
    return CaseInsensitiveDict(options)


def test_options_are_read_whatever_the_case_spark_stored_them_in() -> None:
    options = spark_options(
        destination="/topic/orders",
        maxMessagesPerTrigger="750",
        maxBytesPerTrigger="2m",
        minPartitions="3",
        failOnDataLoss="false",
        includeHeaders="false",
        startingOffsets='{"sequence": 1200}',
        leaseTtlSec="1.5",
        onExpiredLease="Skip",
        group="etl",
        host="broker.example",
        port="61614",
        login="pipe",
        passcode="secret",
        timeoutSec="10",
    )
    # Spark lower-cases the keys: a plain copy would lose maxMessagesPerTrigger.
    assert "maxMessagesPerTrigger" not in dict(options)
    parsed = source_options(options)
    assert parsed.destination.kind is DestinationKind.TOPIC
    assert parsed.max_messages == 750
    assert parsed.max_bytes == 2 * 1024 * 1024
    assert parsed.min_partitions == 3
    assert parsed.fail_on_data_loss is False
    assert parsed.include_headers is False
    assert parsed.starting is not None
    assert parsed.starting.position is StartingPosition.SEQUENCE
    assert parsed.starting.sequence == 1200
    assert parsed.lease_ttl_ms == 1500
    assert parsed.on_expired_lease is ExpiredLeasePolicy.SKIP
    assert parsed.stream_group() == "etl"
    connection = parsed.connection
    assert (connection.host, connection.port, connection.login) == ("broker.example", 61614, "pipe")
    assert connection.passcode == "secret"
    assert connection.timeout == 10.0
    assert "secret" not in repr(parsed)


def test_defaults_leave_the_limits_to_the_broker() -> None:
    parsed = source_options({"destination": "/queue/orders"})
    assert parsed.max_messages is None  # the destination's flow limit, asked at run time
    assert parsed.max_bytes is None
    assert parsed.lease_ttl_ms is None  # the broker's imq.lease.ttl
    assert parsed.on_expired_lease is ExpiredLeasePolicy.FAIL
    assert parsed.fail_on_data_loss is True
    assert parsed.stream_starting().position is StartingPosition.EARLIEST
    topic = source_options({"destination": "/topic/orders"})
    assert topic.stream_starting().position is StartingPosition.COMMITTED


@pytest.mark.parametrize(
    ("options", "named", "says"),
    [
        ({}, "destination", "required"),
        ({"destination": "orders"}, "destination", "/queue/NAME"),
        (
            {"destination": "/queue/a", "maxMessagesPerTrigger": "0"},
            "maxMessagesPerTrigger",
            "integer",
        ),
        ({"destination": "/queue/a", "maxBytesPerTrigger": "lots"}, "maxBytesPerTrigger", "size"),
        ({"destination": "/queue/a", "failOnDataLoss": "maybe"}, "failOnDataLoss", "true or false"),
        ({"destination": "/queue/a", "onExpiredLease": "retry"}, "onExpiredLease", "fail, skip"),
        ({"destination": "/queue/a", "group": "a/b"}, "group", "letters"),
        ({"destination": "/topic/a", "startingOffsets": "soon"}, "startingOffsets", "earliest"),
        ({"destination": "/queue/a", "port": "70000"}, "port", "65535"),
        ({"destination": "/queue/a", "leaseTtlSec": "-1"}, "leaseTtlSec", "seconds"),
        ({"destination": "/queue/a", "addresses": "a:b"}, "addresses", "a valid port"),
        ({"destination": "/queue/a", "failoverDeadlineSec": "-1"}, "failoverDeadlineSec", "from 0"),
        ({"destination": "/queue/a", "failoverDeadlineSec": "soon"}, "failoverDeadlineSec", "0"),
        ({"destination": "/queue/a", "timeoutSec": "0"}, "timeoutSec", "above 0"),
        ({"destination": "/queue/a", "retryPauseSec": "0"}, "retryPauseSec", "above 0"),
    ],
)
def test_a_bad_option_is_refused_naming_it_and_what_it_accepts(
    options: dict[str, str], named: str, says: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        source_options(spark_options(**options))
    assert refused.value.name == named
    assert says in str(refused.value)


def test_streams_need_a_group_and_queues_have_no_latest() -> None:
    with pytest.raises(ConfigError, match="group is required"):
        source_options({"destination": "/topic/a"}).stream_group()
    queue = source_options({"destination": "/queue/a", "startingOffsets": "latest"})
    with pytest.raises(ConfigError, match="does not apply to the queue"):
        queue.stream_starting()


def test_sink_options() -> None:
    parsed = sink_options(
        spark_options(
            destination="/queue/out",
            sinkId="orders-sink",
            deliveryGuarantee="atLeastOnce",
            stageTtlSec="30",
            retryDeadlineSec="5",
            retryPauseSec="0.2",
            persistent="false",
            priority="7",
            maxInflight="64",
        )
    )
    assert parsed.destination == "/queue/out"
    assert parsed.sink_id == "orders-sink"
    assert parsed.guarantee is DeliveryGuarantee.AT_LEAST_ONCE
    assert parsed.stage_ttl_ms == 30_000
    assert parsed.connection.retry.deadline == 5.0
    assert parsed.connection.retry.pause == 0.2
    assert parsed.connection.max_inflight == 64
    assert (parsed.persistent, parsed.priority) == (False, 7)
    default = sink_options({})
    assert default.guarantee is DeliveryGuarantee.EXACTLY_ONCE
    assert default.destination is None
    with pytest.raises(ConfigError, match="priority"):
        sink_options({"priority": "10"})


def test_failover_is_on_by_default_and_off_at_0_for_source_and_sink() -> None:
    source = source_options({"destination": "/queue/a"}).connection
    sink = sink_options({}).connection
    assert source.failover == sink.failover == 60.0
    assert source.retry.pause == sink.retry.pause == 0.1
    off = source_options(spark_options(destination="/queue/a", failoverDeadlineSec="0"))
    assert off.connection.failover == 0.0
    assert sink_options(spark_options(failoverDeadlineSec="0")).connection.failover == 0.0


def test_the_source_pauses_between_failover_attempts_as_the_sink_does() -> None:
    parsed = source_options(
        spark_options(destination="/queue/a", failoverDeadlineSec="2.5", retryPauseSec="0.4")
    )
    assert parsed.connection.failover == 2.5
    assert parsed.connection.retry.pause == 0.4
    assert parsed.connection.retry.max_pause == 5.0
    sink = sink_options(spark_options(failoverDeadlineSec="15", retryPauseSec="0.3"))
    assert (sink.connection.failover, sink.connection.retry.pause) == (15.0, 0.3)
    assert sink.connection.retry.deadline == 60.0  # retryDeadlineSec: the sends' own
