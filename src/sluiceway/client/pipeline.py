"""A small blocking STOMP connection for data pipelines: range reads, cursors, leases, stages.

It speaks the extensions of [pipelines-protocol.md](../../../docs/pipelines-protocol.md) over one
socket (TLS when the settings say so: `tls`) with the broker's own codec, one operation at a
time, so a Spark task or a script can use it without an event loop:

    with PipelineConnection(PipelineSettings(port=61613)) as connection:
        head = connection.head("/topic/orders")
        read = connection.read_range("/topic/orders", head.first_sequence, head.next_sequence)
        for message in read:
            ...
        read.end.next_sequence            # where the next read starts

It connects on first use and never holds a socket when pickled: a Spark reader or writer that
owns one can be shipped to executors as it is, and each copy opens its own connection there.
Every pipeline operation is idempotent (the protocol says so), so one that fails because the
connection was lost, a connect failed, the broker did not answer in time or answered 503, is
tried again, elsewhere if need be, for up to `settings.failover` seconds (`pipeline_failover`);
with `failover` 0, only a request that finds an idle connection lost is tried again, once. A
send is not repeated once written, since a send repeated after a lost receipt could publish
twice: only connecting fails over.

Sends always ask for a receipt (the client asks for refusals as failed receipts, so the
connection stays open). Refused sends (status 414: a destination or system limit, or a send held
longer than `imq.producer.hold.timeout`; 503: a stage of a sink being taken over) are retried
with exponential back-off up to the retry policy's deadline, then raised as the broker's own
error (status, `message`, `destination`, `limit`, `limit-value`), with how long the client
tried.
"""

from __future__ import annotations

import itertools
import logging
import socket
import ssl
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Final

from sluiceway.client.pipeline_failover import (
    Address,
    LeaseResume,
    RangeResume,
    recoverable,
    with_failover,
)
from sluiceway.client.pipeline_listing import (
    DEFAULT_LIST_MAX,
    Listing,
    ListRight,
    list_once,
    listing_headers,
)
from sluiceway.client.pipeline_packs import MessagePack
from sluiceway.client.pipeline_reads import Read
from sluiceway.client.pipeline_send_packs import OutgoingPack, packed, unpacked
from sluiceway.client.pipeline_sends import SendWindow
from sluiceway.client.pipeline_values import (
    DEFAULT_MAX_INFLIGHT,
    DEFAULT_MAX_INFLIGHT_BYTES,
    DEFAULT_TIMEOUT,
    STATUS_GONE,
    EndMarker,
    LeaseState,
    OutgoingMessage,
    PipelineMessage,
    PipelineSettings,
    StageResult,
    StageState,
    optional_int,
)
from sluiceway.client.protocol import (
    CLIENT_MAX_HEADER_COUNT,
    READ_CHUNK,
    ConnectRequest,
    Receipts,
    connected_version,
    is_end_marker,
    is_failed_receipt,
    refusal,
)
from sluiceway.client.tls import client_context, handshake
from sluiceway.errors import (
    BrokerError,
    ConnectFailedError,
    ConnectionClosedError,
    OperationTimeoutError,
    RemoteProtocolError,
)
from sluiceway.protocol.codec import FrameDecoder, encode_frame
from sluiceway.protocol.frames import Frame, StompVersion

__all__ = [
    "DEFAULT_MAX_INFLIGHT",
    "DEFAULT_MAX_INFLIGHT_BYTES",
    "DEFAULT_TIMEOUT",
    "EndMarker",
    "LeaseState",
    "OutgoingMessage",
    "OutgoingPack",
    "PipelineConnection",
    "PipelineMessage",
    "PipelineSettings",
    "Read",
    "StageResult",
    "StageState",
]

log = logging.getLogger(__name__)

# Receipt ids of requests other than sends start with this.
_REQUEST_RECEIPT: Final = "r"


class PipelineConnection:
    """One blocking STOMP connection, opened on first use, for the pipeline extensions."""

    def __init__(self, settings: PipelineSettings | None = None) -> None:
        self.settings = settings or PipelineSettings()
        self._socket: socket.socket | None = None
        self.last_address: Address | None = None  # the broker it last connected to
        self._decoder: FrameDecoder | None = None
        self.receipt_numbers: Iterator[int] = itertools.count(1)  # receipt and subscription ids
        self._receipts: Receipts[None] = Receipts(self.receipt_numbers)
        self._tls_context: ssl.SSLContext | None = None  # made at the first TLS connect
        self.takes_packs = False  # the broker said it takes packed SENDs (`pack-sends`)

    # -- pickling: settings only ------------------------------------------------------------------

    def __getstate__(self) -> dict[str, object]:
        return {"settings": self.settings}

    def __setstate__(self, state: dict[str, object]) -> None:
        settings = state["settings"]
        assert isinstance(settings, PipelineSettings)
        PipelineConnection.__init__(self, settings)  # a fresh, unconnected copy

    # -- opening and closing -----------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._socket is not None

    def _open_socket(
        self, addresses: Iterable[Address], timeout: float
    ) -> tuple[socket.socket, Address]:
        """A socket to the first broker of `addresses` that answers, and its address: over TLS
        when the settings say so. A certificate the client does not accept, or an address that
        does not speak TLS, raises TlsError at once (no other address or attempt is tried:
        the settings must change)."""
        context = self._tls()
        failures: list[str] = []
        for host, port in addresses:
            try:
                sock = socket.create_connection((host, port), timeout)
                if context is not None:
                    sock = handshake(context, sock, host, port)
            except OSError as exc:
                failures.append(f"{host}:{port}: {exc}")
            else:
                return sock, (host, port)
        raise ConnectFailedError(f"cannot connect to the broker at {'; '.join(failures)}")

    def _tls(self) -> ssl.SSLContext | None:
        """The SSL context of the settings' TLS, made at the first connect (before any socket,
        so that a CA file that cannot be read is a ConfigError); None: plain TCP."""
        tls = self.settings.tls
        if tls is not None and self._tls_context is None:
            self._tls_context = client_context(tls)
        return self._tls_context

    def connect(self) -> None:
        """Open the connection now (operations do it themselves when needed)."""
        if self._socket is None:
            settings = self.settings
            request = self._connect_request()
            self._start(request, *self._open_socket(settings.targets, settings.timeout))

    def connect_to(self, address: Address, timeout: float) -> None:
        """Open a new connection to `address` alone, waiting up to `timeout` seconds for TCP
        (failover chooses where to go)."""
        self.close()
        request = self._connect_request()
        self._start(request, *self._open_socket([address], timeout))

    def _connect_request(self) -> ConnectRequest:
        """The CONNECT to send, with the credentials read now (from the environment or the
        password file when the settings name one), before any socket is opened."""
        # No heart-beats: the connection is used in short bursts by one thread, which notices
        # a dead broker by its own timeout.
        return ConnectRequest(self.settings.host, *self.settings.credentials())

    def _start(self, request: ConnectRequest, sock: socket.socket, address: Address) -> None:
        """Send `request` on the new socket `sock` to `address`."""
        settings = self.settings
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(settings.timeout)
        self._socket = sock
        self.last_address = address
        self._decoder = decoder = FrameDecoder(max_header_count=CLIENT_MAX_HEADER_COUNT)
        try:
            self.write_frame(Frame("CONNECT", request.headers()))
            connected = self.next_frame()
            version = connected_version(connected)
            self.takes_packs = connected.headers.get("pack-sends") == "true"
        except BrokerError as exc:
            self.close()
            raise request.refused(exc, address[1]) from None
        except BaseException:
            self.close()
            raise
        decoder.version = version

    def close(self) -> None:
        """Close the socket at once (there is nothing to flush: every operation waited)."""
        sock, self._socket, self._decoder = self._socket, None, None
        self._receipts.drain()  # their answers, if any, will never come
        if sock is not None:
            try:
                sock.close()
            except OSError:
                log.debug("closing the pipeline connection failed", exc_info=True)

    def __enter__(self) -> PipelineConnection:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- frames ----------------------------------------------------------------------------------

    def write_frame(self, frame: Frame) -> None:
        """Write one frame (for the send window; operations use the methods below)."""
        sock = self._socket
        if sock is None:
            raise ConnectionClosedError("the pipeline connection is closed")
        try:
            sock.sendall(encode_frame(frame, StompVersion.V1_2))
        except TimeoutError:
            self.close()
            raise OperationTimeoutError(
                f"the broker did not take a {frame.command} frame within {self.settings.timeout} s"
            ) from None
        except OSError as exc:
            self.close()
            raise ConnectionClosedError(f"the connection to the broker was lost: {exc}") from exc

    def next_frame(self) -> Frame:
        """The next frame from the broker (heart-beats skipped), waiting up to the timeout."""
        while True:
            decoder, sock = self._decoder, self._socket
            if decoder is None or sock is None:
                raise ConnectionClosedError("the pipeline connection is closed")
            while (event := decoder.next_event()) is not None:
                if isinstance(event, Frame):
                    return event
            try:
                data = sock.recv(READ_CHUNK)
            except TimeoutError:
                self.close()
                raise OperationTimeoutError(
                    f"the broker sent nothing for {self.settings.timeout} s"
                ) from None
            except OSError as exc:
                self.close()
                raise ConnectionClosedError(
                    f"the connection to the broker was lost: {exc}"
                ) from exc
            if not data:
                self.close()
                raise ConnectionClosedError("the broker closed the connection")
            decoder.receive_data(data)

    def failed(self, frame: Frame) -> BrokerError:
        """An ERROR ends the connection (STOMP says so): close, and return what it said."""
        self.close()
        return refusal(frame)

    def _request(self, frame: Frame, what: str) -> Frame:
        """Send `frame` with a receipt and return the RECEIPT, failing over as the settings
        say (every pipeline operation is idempotent). A refusal with status 503 is raised
        here, so that failover sees it; other refusals are returned, for `_check`."""

        def attempt() -> Frame:
            reply = self._request_once(frame)
            if is_failed_receipt(reply) and recoverable(error := refusal(reply)):
                raise error
            return reply

        return with_failover(self, f"{frame.command} of {what}", attempt)

    def _request_once(self, frame: Frame) -> Frame:
        self.connect()
        asked = self._receipts.ask(frame, None, _REQUEST_RECEIPT)
        self.write_frame(asked)
        while True:
            reply = self.next_frame()
            if reply.command == "ERROR":
                raise self.failed(reply)
            if self._receipts.answer(reply) is not None:
                return reply
            # Anything else belongs to no operation of ours (operations run one at a time).
            log.debug("ignoring a %s frame while waiting for %s", reply.command, asked.command)

    @staticmethod
    def _check(reply: Frame) -> Frame:
        if is_failed_receipt(reply):  # refused, the connection stays open
            raise refusal(reply)
        return reply

    # -- reads -----------------------------------------------------------------------------------

    def _read(self, headers: dict[str, str]) -> Iterator[PipelineMessage | MessagePack | EndMarker]:
        """SUBSCRIBE with `headers`, yield each MESSAGE, then the end marker; UNSUBSCRIBE."""
        self.connect()
        sub_id = f"p{next(self.receipt_numbers)}"
        subscribe = Frame("SUBSCRIBE", {**headers, "id": sub_id})
        self.write_frame(self._receipts.ask(subscribe, None, _REQUEST_RECEIPT))
        # The RECEIPT may come before, among or after the messages (the broker writes control
        # frames between runs of messages): the read is over once both are in.
        receipt: Frame | None = None
        end: Frame | None = None
        while receipt is None or end is None:
            frame = self.next_frame()
            if frame.command == "ERROR":
                raise self.failed(frame)
            if self._receipts.answer(frame) is not None:
                receipt = self._check(frame)
            elif frame.command == "MESSAGE" and frame.headers.get("subscription") == sub_id:
                if is_end_marker(frame.headers):
                    end = frame
                elif "pack-count" in frame.headers:
                    yield MessagePack.from_frame(frame.body, frame.headers)
                else:
                    yield PipelineMessage(frame.body, frame.headers)
        # Without a receipt: nothing depends on it, and an error would come as an ERROR anyway.
        self.write_frame(
            Frame("UNSUBSCRIBE", {"id": sub_id, "destination": headers["destination"]})
        )
        yield EndMarker.parse(end.headers, receipt.headers)

    def read_range(
        self,
        destination: str,
        start: int,
        end: int | None,
        *,
        cursor: str | None = None,
        cursor_start: str | None = None,
        pack: int | None = None,
    ) -> Read:
        """The retained messages with `start <= sequence < end` (None: to the head), in order.

        With `cursor`, the topic cursor GROUP is opened in the same SUBSCRIBE (created at
        `cursor_start`, earliest | latest | a sequence number, when missing). With `pack`, the
        broker sends up to that many messages per frame (`Read.packs()` takes them as columns).
        """
        headers = {
            "destination": destination,
            "browser": "true",
            "from-sequence": str(start),
        }
        if pack is not None:
            headers["pack"] = str(pack)
        if end is not None:
            headers["to-sequence"] = str(end)
        if cursor is not None:
            headers["cursor"] = cursor
            if cursor_start is not None:
                headers["cursor-start"] = cursor_start
        return Read(self, headers, RangeResume(headers, f"range read of {destination}"))

    def head(
        self, destination: str, *, cursor: str | None = None, cursor_start: str | None = None
    ) -> EndMarker:
        """The head, the oldest retained message and the limits: an empty range read."""

        def attempt() -> EndMarker:
            read = self.read_range(destination, 0, 0, cursor=cursor, cursor_start=cursor_start)
            return read.drain()

        if self.settings.failover > 0:
            return attempt()  # the read fails over by itself
        return with_failover(self, f"head of {destination}", attempt)

    # -- listing destinations ------------------------------------------------------------------

    def list_destinations(
        self, pattern: str, *, right: ListRight = ListRight.CONSUME, limit: int = DEFAULT_LIST_MAX
    ) -> Listing:
        """The destinations matching `pattern`, a name or one with wildcards (`*` one segment,
        `>` the rest), among those the user may `right` (consume or browse), sorted; at most
        `limit` of them (`truncated` says more matched). See pipeline_listing."""
        headers = listing_headers(pattern, right, limit)
        return with_failover(self, f"listing of {pattern}", lambda: list_once(self, headers))

    # -- topic cursors -----------------------------------------------------------------------------

    def open_cursor(self, topic: str, group: str, start: str = "latest") -> EndMarker:
        """Create cursor GROUP at `start` (earliest | latest | a sequence) unless it exists;
        the end marker's `cursor_sequence` is its committed position."""
        return self.head(topic, cursor=group, cursor_start=start)

    def commit_cursor(self, topic: str, group: str, sequence: int) -> None:
        """Move cursor GROUP to `sequence` (never back); the messages before it are released."""
        headers = {"id": "cursor", "destination": topic, "cursor": group, "sequence": str(sequence)}
        self._check(self._request(Frame("ACK", headers), f"cursor {group} of {topic}"))

    def delete_cursor(self, topic: str, group: str) -> None:
        headers = {"id": "cursor", "destination": topic, "cursor": group}
        self._check(self._request(Frame("UNSUBSCRIBE", headers), f"cursor {group} of {topic}"))

    # -- queue leases ------------------------------------------------------------------------------

    def read_lease(
        self,
        queue: str,
        lease: str,
        *,
        max_messages: int | None = None,
        max_bytes: int | None = None,
        ttl_ms: int | None = None,
        strict_bytes: bool = False,
        create: bool = True,
        messages: bool = True,
        pack: int | None = None,
    ) -> Read:
        """Lease `GROUP/N` of `queue`: created with these bounds when new, else the same
        messages again; the end marker says its state, size and the group's highest number.

        `strict_bytes`: a new lease takes no message at all rather than one over `max_bytes`.
        `create=False`: nothing is made (a lease never read answers `unread`). `messages=False`:
        the end marker alone (to make a lease now and read it later). `pack`: as for
        `read_range`."""
        headers = {"destination": queue, "lease": lease}
        if pack is not None:
            headers["pack"] = str(pack)
        if max_messages is not None:
            headers["lease-max-messages"] = str(max_messages)
        if max_bytes is not None:
            headers["lease-max-bytes"] = str(max_bytes)
        if ttl_ms is not None:
            headers["lease-ttl"] = str(ttl_ms)
        for name, value, default in (
            ("lease-bytes-strict", strict_bytes, False),
            ("lease-create", create, True),
            ("lease-messages", messages, True),
        ):
            if value is not default:
                headers[name] = "true" if value else "false"
        return Read(self, headers, LeaseResume(headers, f"read of lease {lease} of {queue}"))

    def ack_lease(self, queue: str, lease: str) -> LeaseState:
        """Acknowledge lease `GROUP/N`: its messages are consumed. EXPIRED when it had expired
        (or was released) before: its messages went back to the queue."""
        return self._settle_lease("ACK", queue, lease)

    def release_lease(self, queue: str, lease: str) -> LeaseState:
        """Give lease `GROUP/N` back: its messages return to the queue, redelivered."""
        return self._settle_lease("NACK", queue, lease)

    def _settle_lease(self, command: str, queue: str, lease: str) -> LeaseState:
        headers = {"id": "lease", "destination": queue, "lease": lease}
        reply = self._request(Frame(command, headers), f"lease {lease} of {queue}")
        if reply.headers.get("status") == str(STATUS_GONE):
            return LeaseState.EXPIRED
        state = self._check(reply).headers.get("lease-state")
        try:
            return LeaseState(state) if state else LeaseState.ACKNOWLEDGED
        except ValueError:
            raise RemoteProtocolError(f"the broker sent an unknown lease-state {state!r}") from None

    # -- stages ----------------------------------------------------------------------------------

    def commit_stage(
        self,
        sink: str,
        batch: int,
        tasks: Iterable[str],
        counts: Iterable[int] | None = None,
    ) -> StageResult:
        """Publish the stages of `tasks` of batch `SINK/BATCH`, atomically, once. With `counts`
        (the messages each task staged), a stage that holds another number refuses it all."""
        headers = {
            "transaction": "stage",
            "stage": f"{sink}/{batch}",
            "stage-tasks": ",".join(tasks),
        }
        if counts is not None:
            headers["stage-counts"] = ",".join(str(count) for count in counts)
        reply = self._check(self._request(Frame("COMMIT", headers), f"stage {sink}/{batch}"))
        text = reply.headers.get("stage-state", "")
        try:
            state = StageState(text)
        except ValueError:
            raise RemoteProtocolError(f"the broker sent an unknown stage-state {text!r}") from None
        return StageResult(state, optional_int(reply.headers, "stage-count") or 0)

    def abort_stage(self, sink: str, batch: int, tasks: Iterable[str] | None = None) -> None:
        """Discard the stages of batch `SINK/BATCH` (or of those tasks only)."""
        headers = {"transaction": "stage", "stage": f"{sink}/{batch}"}
        if tasks is not None:
            headers["stage-tasks"] = ",".join(tasks)
        self._check(self._request(Frame("ABORT", headers), f"stage {sink}/{batch}"))

    # -- sends -----------------------------------------------------------------------------------

    def send(self, message: OutgoingMessage, *, stage: str | None = None) -> None:
        """Send one message and wait for the broker to take it (retrying refusals)."""
        self.send_many([message], stage=stage)

    def send_many(
        self,
        messages: Iterable[OutgoingMessage],
        *,
        stage: str | None = None,
        stage_ttl_ms: int | None = None,
    ) -> int:
        """Send `messages` in order, pipelined, each confirmed by a receipt; the count sent.

        With `stage` (`SINK/BATCH/TASK`) they are staged, not published. A message refused
        with a status of the retry policy is sent again after a pause growing by `backoff`,
        until it has been refused for `deadline` seconds; then the broker's last refusal is
        raised. Order is kept except for a refused message, which lands after the messages
        that were already on their way behind it (at most `max_inflight`). Connecting fails
        over as the settings say; a connection lost once a send was written is not (the send
        might be published twice), its error is raised.
        """
        with_failover(self, "connecting to send", self.connect)
        if self.settings.pack_sends and self.takes_packs:
            return self._send_items(packed(messages), stage, stage_ttl_ms)
        return self._send_items(messages, stage, stage_ttl_ms)

    def send_packs(
        self,
        items: Iterable[OutgoingMessage | OutgoingPack],
        *,
        stage: str | None = None,
        stage_ttl_ms: int | None = None,
    ) -> int:
        """`send_many` for messages already packed (a columnar writer packs its columns
        itself): each pack is one SEND, or its messages one by one when the broker does not
        take packed SENDs (or `pack_sends` is off). The count of messages sent."""
        with_failover(self, "connecting to send", self.connect)
        if not (self.settings.pack_sends and self.takes_packs):
            items = unpacked(items)
        return self._send_items(items, stage, stage_ttl_ms)

    def _send_items(
        self,
        items: Iterable[OutgoingMessage | OutgoingPack],
        stage: str | None,
        stage_ttl_ms: int | None,
    ) -> int:
        sender = SendWindow(self, stage, stage_ttl_ms)
        for item in items:
            sender.add(item)
        sender.finish()
        return sender.sent
