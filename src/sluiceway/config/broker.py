"""Broker properties: everything the broker is configured with, besides destinations."""

from __future__ import annotations

from dataclasses import dataclass, field

from sluiceway.config.cluster import ClusterConfig
from sluiceway.config.destination import (
    DestinationDefinition,
    DestinationSettings,
    autocreated_settings,
)
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
class BrokerConfig(ClusterConfig):
    """Everything the broker is configured with. Units are in each property's documentation.

    The properties of the services around the broker (admin endpoint, TLS, WebSocket, security,
    metrics) are declared in config.service, those of a cluster and its database store in
    config.cluster, and inherited.
    """

    host: str = prop(
        "imq.hostname",
        parse_host,
        "127.0.0.1",
        "Address every service binds to. The default keeps the broker on the loopback interface.",
    )
    stomp_port: int = prop(
        "imq.stomp.tcp.port",
        int_parser(-1, 65535),
        61613,
        "TCP port of the STOMP service (0: any free port, reported in the ready log line; -1: "
        "off, e.g. to serve STOMP over TLS only). One STOMP listener at least (this one, "
        "imq.stomp.tls.port or imq.stomp.ws.port) must be on.",
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
    connect_max_frame_size: int = prop(
        "imq.stomp.connect.max_frame_size",
        size_parser(minimum=1024),
        8 * 1024,
        "Largest frame accepted before a CONNECT is accepted, in bytes (over WebSocket: the "
        "largest message). A CONNECT carries headers only (credentials, heart-beat, flow "
        "settings), so a client that has not authenticated cannot make the broker hold a large "
        "frame. A larger one gets an ERROR (status 423) and the connection is closed.",
    )
    input_max_bytes: int = prop(
        "imq.stomp.input.max_bytes",
        size_parser(),
        16 * 1024 * 1024,
        "Most bytes of frames being received one connection may hold in memory (the frame "
        "being read, and any received but not yet handled); past it the connection gets an "
        "ERROR (status 423) and is closed. It bounds the largest frame too: raise it (and "
        "imq.stomp.input.total.max_bytes) to accept messages up to imq.message.max_size. "
        "0: no limit but imq.stomp.max_frame_size.",
    )
    input_total_max: int = prop(
        "imq.stomp.input.total.max_bytes",
        size_parser(allow_unlimited=True, minus_one="a quarter of imq.memory.budget"),
        -1,
        "Most bytes of frames being received all connections together may hold in memory "
        "(they count against imq.memory.budget as they arrive); the connection whose bytes "
        "take it past this gets an ERROR (status 414) and is closed. -1: a quarter of "
        "imq.memory.budget (no limit when the budget is 0); 0: no limit.",
    )
    max_connections: int = prop(
        "imq.stomp.max_connections",
        int_parser(minimum=1),
        10_000,
        "Most STOMP connections open at a time, over TCP, TLS and WebSocket together. One more "
        "gets an ERROR (status 414) naming this limit and is closed before it can send CONNECT. "
        "Keep the process's open-files limit (ulimit -n) above it.",
    )
    max_connections_per_address: int = prop(
        "imq.stomp.max_connections_per_address",
        int_parser(minimum=1),
        1000,
        "Most STOMP connections open at a time from one client IP address, over TCP, TLS and "
        "WebSocket together; one more is refused as for imq.stomp.max_connections. A tenth of "
        "the total by default, so one host cannot take every connection.",
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
        "Most transactions one connection may have open at a time; a BEGIN beyond it is "
        "refused with status 414.",
    )
    tx_max_messages: int = prop(
        "imq.stomp.transactions.max_messages",
        int_parser(minimum=1),
        10_000,
        "Most messages one connection's open transactions may hold together (sent and not yet "
        "committed or aborted); a SEND beyond it is refused with status 414 and the "
        "transaction stays open.",
    )
    tx_max_bytes: int = prop(
        "imq.stomp.transactions.max_bytes",
        size_parser(),
        64 * 1024 * 1024,
        "Most bytes of message bodies one connection's open transactions may hold together (as "
        "imq.stomp.transactions.max_messages); a message is always accepted when they hold "
        "none, so one of imq.message.max_size fits in a transaction.",
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
        "message is refused with status 423, naming this limit. A frame is also bounded by "
        "what a connection may hold while it arrives (imq.stomp.input.max_bytes, 16m, and "
        "imq.stomp.input.total.max_bytes): raise those too for messages beyond them.",
    )
    persist_store: str = prop(
        "imq.persist.store",
        enum_text_parser("file", "jdbc", "memory"),
        "file",
        "Where persistent messages are kept: file (the journal under the data directory, "
        "imq.persist.file.directory), jdbc (a PostgreSQL database, imq.persist.jdbc.*, shared "
        "by the members of a cluster) or memory (nothing survives a restart).",
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
        "are on disk (survives a power cut; cheap under concurrency), and writes nothing waits "
        "for are fsynced within imq.persist.file.sync.delay. always: every flush is "
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
    sync_delay_ms: int = prop(
        "imq.persist.file.sync.delay",
        int_parser(0, 1000),
        5,
        "Under the group sync policy: how long, in ms, journal writes that no RECEIPT waits for "
        "(a SEND or ACK without a receipt header) may wait for their fsync, so that one fsync "
        "covers more of them. A frame that waits for its records to be durable starts an fsync "
        "at once. 0: every write starts an fsync as soon as the previous one ends.",
    )
    skip_corrupt: bool = prop(
        "imq.persist.file.skip_corrupt",
        parse_bool,
        False,
        "A corrupt record in the middle of the journal stops start-up, naming its segment and "
        "offset; true skips it (the bad bytes are saved under journal/discarded) and loses the "
        "messages it held.",
    )
    disk_free_limit: int = prop(
        "imq.persist.file.disk.free.limit",
        size_parser(),
        50 * 1024 * 1024,
        "Free space, in bytes, the file system holding the journal keeps (like RabbitMQ's disk "
        "free limit). Below it the disk is low: an alarm, logged and shown by the admin API, "
        "that holds persistent SENDs (with a reason naming the disk) before the disk is "
        "actually full, until more is free; non-persistent messages and consumers go on. "
        "Measured once a second, estimated in between from what the journal writes; the alarm "
        "clears a tenth of the limit above it. 0: no floor (a failed write still holds them).",
    )
    disk_backlog_max: int = prop(
        "imq.persist.file.disk.backlog.max_size",
        size_parser(),
        16 * 1024 * 1024,
        "While journal writes fail (a full disk), the records still being made (acknowledgements, "
        "delivery marks) wait in memory, at most this many bytes; beyond it the broker reads no "
        "client until the disk takes them (what clients send waits in their sockets).",
    )
    swap_threshold: int = prop(
        "imq.swap.threshold",
        size_parser(allow_unlimited=True, minus_one="the YELLOW level"),
        -1,
        "Bytes of queued messages (bodies plus a fixed per-message estimate) the broker keeps in "
        "memory; beyond it newly queued messages go to the swap area on disk and are read back "
        "when consumers need them. -1: the YELLOW level of imq.memory.budget; 0: never swap.",
    )
    system_max_count: int = prop(
        "imq.system.max_count",
        int_parser(minimum=-1),
        -1,
        "Most messages the broker holds in all destinations together (undelivered and "
        "unacknowledged; a topic message counts once per subscription holding it); -1: no "
        "limit. Beyond it every new message is refused with status 414, whatever the "
        "destination's limitBehavior.",
    )
    system_max_size: int = prop(
        "imq.system.max_size",
        size_parser(allow_unlimited=True),
        -1,
        "Most bytes of message bodies the broker holds in all destinations together; -1: no "
        "limit. Beyond it every new message is refused with status 414.",
    )
    throttling_server_threshold: int = prop(
        "imq.throttling.server.threshold",
        int_parser(minimum=0),
        100_000,
        "JMS IQ Manager throttling: a destination's producers are held while the broker holds "
        "more than this many messages and the destination more than "
        "imq.throttling.destination.threshold undelivered ones; 0: never throttle.",
    )
    throttling_destination_threshold: int = prop(
        "imq.throttling.destination.threshold",
        int_parser(minimum=0),
        1000,
        "Undelivered messages of one destination (for a topic: its slowest subscriber's backlog) "
        "above which it is throttled while the broker is over its threshold; 0: never throttle.",
    )
    throttling_lag: int = prop(
        "imq.throttling.lag",
        int_parser(minimum=0),
        100,
        "A throttled destination is released when its undelivered messages fall below the "
        "destination threshold minus this lag (or the broker falls below its threshold).",
    )
    memory_budget: int = prop(
        "imq.memory.budget",
        size_parser(),
        160 * 1024 * 1024,
        "Memory the broker may use for messages and buffers, as its own ledger counts them "
        "(queued, being delivered, held, and bytes waiting to be written). The memory levels "
        "are percentages of it. The default keeps the whole broker under about 200 MB of "
        "resident memory whatever the backlog: from the YELLOW level on, queued messages go "
        "to disk.",
    )
    yellow_threshold: int = prop(
        "imq.yellow.threshold",
        int_parser(0, 100),
        80,
        "Percent of imq.memory.budget at which the level turns YELLOW: queued messages go to the "
        "swap area.",
    )
    orange_threshold: int = prop(
        "imq.orange.threshold", int_parser(0, 100), 90, "Percent of the budget for ORANGE."
    )
    red_threshold: int = prop(
        "imq.red.threshold",
        int_parser(0, 100),
        98,
        "Percent of the budget for RED: new producers are refused and producers are held until "
        "memory is freed.",
    )
    green_count: int = prop(
        "imq.green.count",
        int_parser(minimum=0),
        5000,
        "Producer credit per connection at GREEN: messages a connection may send before the "
        "broker checks its memory level again.",
    )
    yellow_count: int = prop(
        "imq.yellow.count", int_parser(minimum=0), 500, "Producer credit per connection at YELLOW."
    )
    orange_count: int = prop(
        "imq.orange.count", int_parser(minimum=0), 50, "Producer credit per connection at ORANGE."
    )
    red_count: int = prop(
        "imq.red.count",
        int_parser(minimum=0),
        0,
        "Producer credit per connection at RED (0: every producer is held).",
    )
    memory_hysteresis: int = prop(
        "imq.memory.hysteresis",
        size_parser(),
        1024,
        "Bytes below a level's threshold at which the broker already counts that level, so it "
        "does not flap at the boundary.",
    )
    hold_timeout_ms: int = prop(
        "imq.producer.hold.timeout",
        int_parser(minimum=1),
        60_000,
        "Longest a SEND may be held (destination full under FLOW_CONTROL, throttled, paused, "
        "memory RED), in ms; then it is refused with an ERROR (or a failed receipt) that says "
        "why.",
    )
    hold_max_messages: int = prop(
        "imq.producer.hold.max_messages",
        int_parser(minimum=1),
        1000,
        "Most SENDs held for one connection; beyond it the broker stops reading that connection "
        "until one is released (its acknowledgements then wait too, until the hold timeout).",
    )
    hold_max_bytes: int = prop(
        "imq.producer.hold.max_bytes",
        size_parser(),
        16 * 1024 * 1024,
        "Most bytes of message bodies held for one connection (as hold.max_messages).",
    )
    cursor_max_groups: int = prop(
        "imq.cursor.max_groups",
        int_parser(minimum=1),
        100,
        "Most cursors (cursor groups) one topic may have; opening a new one beyond it is "
        "refused with status 414. Cursors the journal holds at start are kept even beyond it.",
    )
    lease_ttl_ms: int = prop(
        "imq.lease.ttl",
        int_parser(minimum=1),
        600_000,
        "How long a queue lease keeps its messages when its SUBSCRIBE gives no lease-ttl, in "
        "ms; then it expires and its messages go back to the queue, redelivered.",
    )
    lease_max_messages: int = prop(
        "imq.lease.max_messages",
        int_parser(minimum=1),
        100_000,
        "Most messages one queue lease may take (a larger lease-max-messages is cut to this).",
    )
    lease_max_bytes: int = prop(
        "imq.lease.max_bytes",
        size_parser(allow_unlimited=True),
        64 * 1024 * 1024,
        "Most bytes of message bodies one queue lease may take (a larger lease-max-bytes is cut "
        "to this); a lease always takes at least one message when the queue has one. -1: no "
        "limit.",
    )
    lease_max_open: int = prop(
        "imq.lease.max_open",
        int_parser(minimum=1),
        1000,
        "Most open (not yet acknowledged, released or expired) leases per lease group of a "
        "queue; a new lease beyond it is refused with status 414. The broker also remembers "
        "this many finished leases per group, so a repeated read or acknowledgement of one "
        "gets the same answer.",
    )
    lease_max_groups: int = prop(
        "imq.lease.max_groups",
        int_parser(minimum=1),
        1000,
        "Most lease groups one queue may have (a group is remembered once it read a lease); "
        "a lease in a new group beyond it is refused with status 414. Groups the journal "
        "holds at start are kept even beyond it.",
    )
    stage_ttl_ms: int = prop(
        "imq.stage.ttl",
        int_parser(minimum=1, maximum=2**63 - 1),
        600_000,
        "How long a stage (a batch's messages staged by one writer task) waits for its COMMIT "
        "when its SENDs give no stage-ttl, in ms, counted from its latest SEND; then it is "
        "discarded.",
    )
    stage_max_sinks: int = prop(
        "imq.stage.max_sinks",
        int_parser(minimum=1),
        100_000,
        "How many sinks' highest committed batches the broker remembers (those that committed "
        "last): a COMMIT replayed by a sink forgotten since would publish its batch again.",
    )
    dmq_truncate_body: bool = prop(
        "imq.destination.DMQ.truncateBody",
        parse_bool,
        False,
        "Drop the body of messages sent to the dead message queue (keep the headers).",
    )
    log_dead_messages: bool = prop(
        "imq.destination.logDeadMsgs",
        parse_bool,
        False,
        "Log every message that becomes dead (expired, evicted, delivered too often).",
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
    autocreate_queue_settings: DestinationSettings = field(
        default_factory=lambda: autocreated_settings(DestinationKind.QUEUE)
    )
    autocreate_topic_settings: DestinationSettings = field(
        default_factory=lambda: autocreated_settings(DestinationKind.TOPIC)
    )
    destinations: tuple[DestinationDefinition, ...] = ()

    def autocreate_settings(self, kind: DestinationKind) -> DestinationSettings:
        """The settings a destination of `kind` gets when it is created on first use."""
        if kind is DestinationKind.QUEUE:
            return self.autocreate_queue_settings
        return self.autocreate_topic_settings

    def autocreate_enabled(self, kind: DestinationKind) -> bool:
        return self.autocreate_queue if kind is DestinationKind.QUEUE else self.autocreate_topic
