"""Broker properties: everything the broker is configured with, besides destinations."""

from __future__ import annotations

from dataclasses import dataclass, field

from sluiceway.config.destination import DestinationDefinition, DestinationSettings
from sluiceway.config.properties import (
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
from sluiceway.naming import DestinationKind


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
