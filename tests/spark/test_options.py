"""Options as Spark hands them over (a case-insensitive mapping with lower-cased keys), without a
Spark session; then, with a local session: when Spark lets a bad option stop a query and what
the user sees, and TLS with a password file, end to end."""

from __future__ import annotations

import itertools
import os
import pickle
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from pyspark.errors import AnalysisException, StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.datasource import CaseInsensitiveDict

from sluiceway.client.tls import TlsSettings
from sluiceway.errors import ConfigError
from sluiceway.naming import DestinationKind
from sluiceway.security.users import UserFile
from sluiceway.spark import option_names
from sluiceway.spark.options import (
    DeliveryGuarantee,
    ExpiredLeasePolicy,
    StartingPosition,
    sink_options,
    source_options,
)
from sluiceway.testing import BrokerThread
from tests.server import conftest as server
from tests.spark.conftest import SPARK_WAIT

tls_files = server.tls_files  # the test CA, and the broker's certificate for 127.0.0.1
PASSWORD: Final = "etl-secret"  # noqa: S105  (a test password)


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
    assert parsed.destinations.kind is DestinationKind.TOPIC
    assert parsed.destinations.names == ("/topic/orders",)
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
        ({"destination": "/queue/a", "tls": "maybe"}, "tls", "true or false"),
        ({"destination": "/queue/a", "tls": "true"}, "port", "imq.stomp.tls.port"),
        ({"destination": "/queue/a", "tlsCaFile": "ca.pem"}, "tlsCaFile", "add tls=true"),
        ({"destination": "/queue/a", "tlsHostnameCheck": "false"}, "tlsHostnameCheck", "TLS"),
        (
            {"destination": "/queue/a", "tls": "false", "addresses": "ssl://a:1"},
            "tls",
            "contradicts the ssl:// addresses",
        ),
        ({"destination": "/queue/a", "addresses": "ssl://a"}, "addresses", "no default port"),
        (
            {"destination": "/queue/a", "addresses": "stomp://a:1,ssl://b:2"},
            "addresses",
            "all speak plain STOMP or all TLS",
        ),
        (
            {"destination": "/queue/a", "tls": "true", "port": "1", "tlsCaFile": "/none/ca.pem"},
            "tlsCaFile",
            "cannot read tlsCaFile '/none/ca.pem'",
        ),
        (
            {"destination": "/queue/a", "password": "pw", "passwordFile": "/none/pw"},
            "password",
            "password and passwordFile were given together",
        ),
        (
            {"destination": "/queue/a", "passcode": "pw", "passwordEnv": "PW"},
            "passcode",
            "passcode and passwordEnv",
        ),
        ({"destination": "/queue/a", "login": "u", "usernameEnv": "U"}, "login", "one source"),
        (
            {"destination": "/queue/a", "passwordEnv": "SLUICEWAY_TEST_UNSET"},
            "passwordEnv",
            "SLUICEWAY_TEST_UNSET (passwordEnv) is not set",
        ),
        ({"destination": "/queue/a", "passwordFile": "/none/pw"}, "passwordFile", "cannot read"),
        (
            {"destination": "/queue/a,/topic/b"},
            "destination",
            "names queues and topics: a source reads queues (by leases) or topics (by cursors)",
        ),
        ({"destination": "/queue/a,,/queue/b"}, "destination", "has an empty entry"),
        ({"destination": "/queue/orders.#"}, "destination", "'#' is reserved"),
        ({"destination": "/queue/orders*"}, "destination", "a whole segment between dots"),
        ({"destination": "/queue/>.eu"}, "destination", "last only"),
        (
            {"destination": "/topic/a,/topic/b", "startingOffsets": "12"},
            "startingOffsets",
            "gives a sequence number, a position in one destination",
        ),
        ({"destination": "/queue/q.*", "endingOffsets": "40"}, "endingOffsets", "names several"),
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
    with pytest.raises(ConfigError, match="does not apply to queues"):
        queue.stream_starting()


def test_a_source_reads_a_list_of_names_and_patterns_of_one_kind() -> None:
    listed = source_options(
        spark_options(destination=" /queue/a, /queue/orders.*,/queue/a,/queue/b.> ")
    ).destinations
    assert listed.kind is DestinationKind.QUEUE
    assert listed.names == ("/queue/a",)
    assert [pattern.path for pattern in listed.patterns] == ["/queue/orders.*", "/queue/b.>"]
    assert listed.several
    assert not source_options({"destination": "/topic/t"}).destinations.several
    # A sequence number is a position in one destination: fine for one.
    one = source_options({"destination": "/topic/t", "startingOffsets": "12"})
    assert one.starting is not None
    assert one.starting.sequence == 12


def test_an_unknown_option_is_refused_naming_the_closest_known_ones() -> None:
    with pytest.raises(ConfigError) as refused:
        source_options(spark_options(destination="/queue/a", maxMesagesPerTrigger="10"))
    assert refused.value.name == "maxmesagespertrigger"  # as Spark hands it over
    assert str(refused.value) == (
        "unknown option of the sluiceway source: maxmesagespertrigger (did you mean "
        "maxMessagesPerTrigger or maxBytesPerTrigger?); its options are listed in docs/spark.md"
    )
    with pytest.raises(ConfigError, match=r"deliveryguarantee \(an option of the sink\);"):
        source_options(spark_options(destination="/queue/a", deliveryGuarantee="atLeastOnce"))
    with pytest.raises(ConfigError) as refused:
        sink_options(spark_options(prioriti="3", grop="g"))
    assert str(refused.value).startswith(
        "unknown options of the sluiceway sink: grop, prioriti (did you mean priority or port?);"
    )
    # What Spark itself puts among the options (test_what_spark_passes_a_data_source).
    own = {"path": "/x", "checkpointLocation": "/c", "queryName": "q"}
    source_options(spark_options(destination="/queue/a", **own))
    sink_options(spark_options(**own))


def documented_options(section: str) -> tuple[set[str], set[str]]:
    """The names in the first column of the table under `### section` of docs/spark.md, and
    every name the table quotes."""
    text = (Path(__file__).parents[2] / "docs" / "spark.md").read_text()
    lines = text.split(f"### {section}\n", 1)[1].splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("|"))
    table = list(itertools.takewhile(lambda line: line.startswith("|"), lines[start:]))
    rows = [line.split(" | ")[0] for line in table[2:]]
    first = {name for row in rows for name in re.findall(r"`([A-Za-z]+)`", row)}
    return first, {name for line in table for name in re.findall(r"`([A-Za-z]+)`", line)}


def test_the_documented_options_are_the_known_ones() -> None:
    named, quoted = documented_options("Source options")
    assert named <= set(option_names.SOURCE)
    assert set(option_names.SOURCE) <= quoted  # login and passcode: aliases, in the text
    named, _ = documented_options("Sink options")
    assert named <= set(option_names.SINK)
    assert set(option_names.SINK) - named == {"login", "passcode"}  # "as for the source"


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


# -- TLS and credentials ------------------------------------------------------------------------


def test_ssl_addresses_turn_tls_on_and_the_ca_is_loaded_now(tls_files: server.TlsFiles) -> None:
    ca_file = str(tls_files.ca_file)
    parsed = source_options(
        spark_options(destination="/queue/a", addresses="ssl://a:61614,b:61615", tlsCaFile=ca_file)
    )
    assert parsed.connection.addresses == (("a", 61614), ("b", 61615))
    assert parsed.connection.tls == TlsSettings(ca_file=ca_file)
    explicit = sink_options(
        spark_options(tls="true", port="61614", tlsHostnameCheck="false")
    ).connection
    assert explicit.tls == TlsSettings(check_hostname=False)  # the system's CAs
    assert source_options({"destination": "/queue/a"}).connection.tls is None
    junk = tls_files.ca_file.with_name("junk.pem")
    junk.write_text("not a certificate")
    with pytest.raises(ConfigError, match="holds no CA certificate") as refused:
        source_options(
            spark_options(destination="/queue/a", tls="true", port="1", tlsCaFile=str(junk))
        )
    assert refused.value.name == "tlsCaFile"


def test_a_password_from_a_file_or_the_environment_stays_out_of_the_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    password_file = tmp_path / "password"
    password_file.write_text(PASSWORD)
    os.chmod(password_file, 0o600)
    monkeypatch.setenv("SLUICEWAY_TEST_USER", "etl")
    monkeypatch.setenv("SLUICEWAY_TEST_PASSWORD", PASSWORD)
    for credentials in (
        {"username": "etl", "passwordFile": str(password_file)},
        {"usernameEnv": "SLUICEWAY_TEST_USER", "passwordEnv": "SLUICEWAY_TEST_PASSWORD"},
    ):
        parsed = source_options(spark_options(destination="/queue/a", **credentials))
        assert parsed.connection.password is None
        assert parsed.connection.credentials() == ("etl", PASSWORD)
        # What Spark ships to the executors holds where the password is, not the password.
        assert PASSWORD.encode() not in pickle.dumps(parsed)
        assert PASSWORD not in repr(parsed)
    os.chmod(password_file, 0o644)
    with pytest.raises(ConfigError, match=f"chmod 600 {password_file}"):
        sink_options(spark_options(username="etl", passwordFile=str(password_file)))


# -- what a local Spark session shows -----------------------------------------------------------


def first_lines(error: BaseException) -> list[str]:
    return str(error).splitlines()


def refusal(error: BaseException) -> str:
    """The ConfigError's line in what Spark says, and the Python frames it shows before it:
    none but the data source's own entry points."""
    lines = first_lines(error)
    frames = [line for line in lines if line.lstrip().startswith('File "')]
    assert all("sluiceway/spark/source.py" in frame for frame in frames), lines
    return next(line for line in lines if line.startswith("sluiceway.errors.ConfigError: "))


BAD_READ: Final = {"destination": "/queue/a", "maxMessagesPerTrigger": "0"}
BAD_READ_SAYS: Final = (
    "sluiceway.errors.ConfigError: option maxMessagesPerTrigger='0' is not valid; it must be an "
    "integer from 1"
)


def test_a_bad_option_stops_a_read_at_load(spark: SparkSession) -> None:
    for reading in (spark.read, spark.readStream):
        with pytest.raises(AnalysisException) as refused:
            reading.format("sluiceway").options(**BAD_READ).load()
        assert first_lines(refused.value)[0].startswith("[PYTHON_DATA_SOURCE_ERROR]")
        assert refusal(refused.value).startswith(BAD_READ_SAYS)


def test_a_misspelt_option_or_a_mix_of_kinds_stops_a_read_at_load(spark: SparkSession) -> None:
    # Spark adds `path` (load's argument) to the options: not refused, and not named.
    typo = {"destination": "/queue/a", "maxMesagesPerTrigger": "10"}
    mixed = {"destination": "/queue/a,/topic/b"}
    for reading in ("read", "readStream"):  # a reader keeps its options: a new one each time
        with pytest.raises(AnalysisException) as refused:
            getattr(spark, reading).format("sluiceway").options(**typo).load("/somewhere")
        assert refusal(refused.value) == (
            "sluiceway.errors.ConfigError: unknown option of the sluiceway source: "
            "maxmesagespertrigger (did you mean maxMessagesPerTrigger or maxBytesPerTrigger?); "
            "its options are listed in docs/spark.md"
        )
        with pytest.raises(AnalysisException) as refused:
            getattr(spark, reading).format("sluiceway").options(**mixed).load()
        assert "names queues and topics: a source reads queues" in refusal(refused.value)


def test_a_credential_given_twice_stops_a_batch_write_at_save(spark: SparkSession) -> None:
    frame = spark.createDataFrame([("m",)], "body string")
    writer = frame.write.format("sluiceway").mode("append")
    with pytest.raises(AnalysisException) as refused:
        writer.options(password="pw", passwordEnv="PW").save()  # noqa: S106  (a test password)
    assert refusal(refused.value) == (
        "sluiceway.errors.ConfigError: password and passwordEnv were given together, but a "
        "credential comes from one source only: give one of them"
    )


@pytest.fixture
def hidden_tracebacks(spark: SparkSession) -> Iterator[None]:
    name = "spark.sql.execution.pyspark.udf.hideTraceback.enabled"
    spark.conf.set(name, "true")
    yield
    spark.conf.unset(name)


@pytest.mark.usefixtures("hidden_tracebacks")
def test_with_tracebacks_hidden_the_refusal_is_the_first_line(spark: SparkSession) -> None:
    with pytest.raises(AnalysisException) as refused:
        spark.read.format("sluiceway").options(**BAD_READ).load()
    first = first_lines(refused.value)[0]
    assert first.startswith(
        "[PYTHON_DATA_SOURCE_ERROR] Failed to create Python data source instance: " + BAD_READ_SAYS
    ), first


@pytest.mark.timeout(SPARK_WAIT + 60)
@pytest.mark.parametrize(
    ("option", "says"),
    [
        (
            ("priority", "10"),
            "option priority='10' is not valid; it must be an integer from 0 to 9",
        ),
        (
            ("maxInflght", "8"),
            "unknown option of the sluiceway sink: maxinflght (did you mean maxInflight?); its "
            "options are listed in docs/spark.md",
        ),
    ],
)
def test_a_stream_writes_bad_option_stops_the_query_at_its_first_batch(
    spark: SparkSession, tmp_path: Path, option: tuple[str, str], says: str
) -> None:
    # Spark runs nothing of a stream's sink at start(): the query starts, then stops. Spark
    # adds checkpointLocation, queryName and start's path to the sink's options: none is named.
    rows = spark.readStream.format("rate").load().selectExpr("CAST(value AS STRING) AS body")
    query = (
        rows.writeStream.format("sluiceway")
        .option(*option)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .queryName(f"bad_{option[0]}")
        .start(str(tmp_path / "path"))
    )
    try:
        with pytest.raises(StreamingQueryException) as stopped:
            query.awaitTermination(SPARK_WAIT)
    finally:
        query.stop()
    assert refusal(stopped.value) == f"sluiceway.errors.ConfigError: {says}"


@pytest.fixture
def secured_tls(tls_files: server.TlsFiles, tmp_path: Path) -> Iterator[BrokerThread]:
    """A broker serving STOMP over TLS only, with authentication on."""
    users = tmp_path / "passwd"
    UserFile(users).add("etl", PASSWORD, ())
    properties = tls_files.properties(
        {
            "imq.stomp.tcp.port": "-1",
            "imq.stomp.tls.port": "0",
            "imq.authentication.enabled": "true",
            "imq.user_repository.file.filename": str(users),
        }
    )
    with BrokerThread(properties) as broker:
        yield broker


def test_a_batch_written_and_read_over_tls_with_a_password_file(
    spark: SparkSession, secured_tls: BrokerThread, tls_files: server.TlsFiles, tmp_path: Path
) -> None:
    assert secured_tls.services is not None
    _, port = secured_tls.services.addresses()["stomp-tls"]
    password_file = tmp_path / "password"
    password_file.write_text(PASSWORD)
    os.chmod(password_file, 0o600)
    options = {
        "addresses": f"ssl://127.0.0.1:{port}",
        "tlsCaFile": str(tls_files.ca_file),
        "username": "etl",
        "passwordFile": str(password_file),
        "destination": "/queue/tls",
    }
    frame = spark.createDataFrame([(f"m{i}",) for i in range(20)], "body string")
    frame.repartition(2).write.format("sluiceway").options(**options).mode("append").save()
    read = spark.read.format("sluiceway").options(**options).load()
    assert sorted(row.text for row in read.select("text").collect()) == sorted(
        f"m{i}" for i in range(20)
    )
