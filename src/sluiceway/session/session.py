"""One client's STOMP session, sans-IO: bytes in, frames handled by the core, bytes out.

This module never imports asyncio. The I/O layer feeds received bytes to `receive_data`, writes
`data_to_send()` (control frames: CONNECTED, RECEIPT, ERROR) at once, and pulls payload with
`take_parts` (or `take_payload`) when the socket can take more, at most `connection-flow-count`
MESSAGE frames between two flushes of control frames (Open MQ's flow metering).

Any bad input (a malformed frame, an over-long header, an unknown command, an ACK for an unknown
id, an unknown destination prefix) gets an ERROR frame with a `message` header, a `status` header
and a body that says what was wrong; the session then stops reading and the I/O layer closes the
connection once the ERROR is written. Other connections are not affected.

With imq.authentication.enabled the CONNECT's password is checked off the event loop
(session.access, security.logins): meanwhile the session is AUTHENTICATING and takes no further
frame (`input_blocked`, so the I/O layer stops reading); when the check is done, `on_control` is
called and the CONNECT is handled again with its outcome. The access rules are checked through
session.access too; control frames wait in session.control.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Mapping
from functools import partial
from types import MappingProxyType
from typing import Final

from sluiceway.core.broker import Broker
from sluiceway.core.connection import CoreConnection
from sluiceway.core.values.flow import UNLIMITED, ConnectionFlow
from sluiceway.core.values.selector import compile_selector
from sluiceway.errors import (
    BadRequest,
    BrokerError,
    FrameLimitExceeded,
    InternalError,
    RemoteProtocolError,
)
from sluiceway.naming import CLUSTER_LINK_PREFIX
from sluiceway.protocol.codec import FrameDecoder
from sluiceway.protocol.frames import (
    AckRun,
    Frame,
    StompVersion,
)
from sluiceway.security.access import (
    AccessDenied,
    AuthenticationFailed,
    Gate,
    Operation,
    Outcome,
    TooManyLogins,
)
from sluiceway.security.logins import PendingLogin
from sluiceway.security.users import Principal
from sluiceway.session import headers as h
from sluiceway.session import listing, readers, send_packs, stage_frames
from sluiceway.session.access import SessionAccess
from sluiceway.session.checks import acked, check_frame
from sluiceway.session.control import MAX_WAITING_CONTROL, ControlFrames
from sluiceway.session.input_budget import connect_frame_limit, frame_limit, frame_limit_error
from sluiceway.session.render import (
    connected_frame,
    error_frame,
    failed_receipt_frame,
    message_parts,
    parse_ack_id,
    receipt_frame,
)

log = logging.getLogger(__name__)

Extra = Mapping[str, str] | None  # headers a handler adds to its RECEIPT
# A handler's answer when the frame's RECEIPT is owed later (a held SEND).
DEFERRED: Final[Mapping[str, str]] = MappingProxyType({})
# Read on every message: a Final name is a C static when compiled (setup.py says why).
_PRODUCE: Final = Operation.PRODUCE
# take_payload's byte budget: none (the frame count alone bounds it).
NO_BYTE_LIMIT: Final = 1 << 62


class SessionState(enum.Enum):
    AWAITING_CONNECT = "awaiting CONNECT"
    AUTHENTICATING = "authenticating"  # the CONNECT's password is being checked
    CONNECTED = "connected"
    DRAINING = "draining"  # DISCONNECT arrived while SENDs were held: settling them first
    CLOSING = "closing"  # nothing more is read; the I/O layer closes after flushing


class StompSession:
    """The STOMP state machine of one connection."""

    def __init__(
        self,
        broker: Broker,
        *,
        on_ready: Callable[[], None],
        on_control: Callable[[], None] = lambda: None,
        peer: str = "?",
        gate: Gate | None = None,
    ) -> None:
        config = broker.config
        self.broker = broker
        self.peer = peer
        # With authentication: who connected, and what the access rules let them do.
        self._access = SessionAccess(config, broker.registry, peer, gate)
        # While AUTHENTICATING: the CONNECT whose password is being checked, the check
        # (cancelled if the connection goes), and once it is done, its outcome: the CONNECT is
        # then handled again with it, before any further frame is read.
        self._connecting: Frame | None = None
        self._login: PendingLogin | None = None
        self._login_outcome: Outcome | None = None
        self.state = SessionState.AWAITING_CONNECT
        self.failure: BrokerError | None = None  # the ERROR the session ended with (`fail`)
        self.version: StompVersion | None = None
        self.heartbeat = h.HeartBeat(0, 0)
        self.flow = ConnectionFlow()
        self.core: CoreConnection | None = None
        # CONNECT `failed-receipts:true`: refusals of frames that asked for a receipt come back as
        # a RECEIPT with a status, and the connection stays open (an extension of this broker).
        self.failed_receipts = False
        self._disconnect_receipt: str | None = None  # DISCONNECT waiting for held SENDs
        # A journal position the current frame's RECEIPT must also wait for (besides what the
        # frame itself wrote); set by a handler.
        self._receipt_lsn = 0
        # Whether the current frame's RECEIPT waits for the records the frame wrote: not for a
        # non-persistent SEND, which promises nothing durable (the sequence numbers it spoke for
        # are made durable by whatever later depends on them), so that such producers go on
        # while the disk cannot take the journal's records (core.features.disk).
        self._receipt_durable = True
        # A frame without a receipt left records that are not durable yet: the next RECEIPT
        # waits for them too ("a receipt confirms everything before it"; a DISCONNECT with a
        # receipt after SENDs without one is how a STOMP client makes sure of them).
        self._owed = False
        # Traffic, for the metrics: frames each way, SENDs handled and MESSAGEs written.
        self.frames_in = self.frames_out = self.sends_in = self.messages_out = 0
        self._on_ready = on_ready
        # Called when something settled outside this session's own input (a held SEND was
        # accepted or refused): control frames to write, and maybe input to read again.
        self._on_control = on_control
        # Until a CONNECT is accepted, only a frame a CONNECT fits in (session.input_budget).
        first_frame, limit = connect_frame_limit(config)
        self._decoder = FrameDecoder(
            max_frame_size=first_frame,
            max_header_count=config.max_header_count,
            max_header_length=config.max_header_length,
            frame_limit=limit,
        )
        self._control = ControlFrames(config.hold_max_messages)  # waiting to be written
        self._handlers: dict[str, Callable[[Frame], Extra]] = {
            "CONNECT": self._on_connect,
            "STOMP": self._on_connect,
            "SEND": self._on_send,
            "SUBSCRIBE": self._on_subscribe,
            "UNSUBSCRIBE": self._on_unsubscribe,
            "ACK": self._on_ack,
            "NACK": self._on_nack,
            "BEGIN": self._on_begin,
            "COMMIT": self._on_commit,
            "ABORT": self._on_abort,
            "DISCONNECT": self._on_disconnect,
        }

    @property
    def principal(self) -> Principal | None:
        """The user who connected (with authentication); the access rules' changes regroup it."""
        return self._access.principal

    @principal.setter
    def principal(self, principal: Principal | None) -> None:
        self._access.principal = principal

    # -- I/O facing ----------------------------------------------------------------------------

    @property
    def closing(self) -> bool:
        return self.state is SessionState.CLOSING

    def receive_data(self, data: bytes) -> None:
        """Handle every complete frame in the bytes received so far."""
        if self.state in (SessionState.CLOSING, SessionState.DRAINING):
            return
        self._decoder.receive_data(data)
        with self.broker.context.batch:  # the read's messages reach consumers together
            if self._login_outcome is not None and self._connecting is not None:
                self._handle(self._connecting)
            self._receive_frames()

    def _receive_frames(self) -> None:
        while not self.closing and not self.input_blocked:
            try:
                event = self._decoder.next_event()
            except FrameLimitExceeded as exc:
                self.fail(frame_limit_error(exc))
                return
            except RemoteProtocolError as exc:
                error = BadRequest("malformed frame", str(exc))
                if self.state is SessionState.AWAITING_CONNECT:
                    # The bad line may be a CONNECT's passcode: it goes back to the client only.
                    log.warning("%s: malformed CONNECT frame (status 400)", self.peer)
                    self.fail(error, logged=True)
                else:
                    self.fail(error)
                return
            if event is None:
                return
            if isinstance(event, Frame):
                self.frames_in += 1
                self._handle(event)
            elif isinstance(event, AckRun):
                self._ack_run(event.ids)

    @property
    def input_buffered(self) -> int:
        """Bytes received and not yet handled: the frame being read, and any frames left
        unread while input is blocked (the input budget counts them)."""
        return self._decoder.buffered

    @property
    def input_blocked(self) -> bool:
        """Read no further frames for now: the connection holds as many SENDs as it may, or as
        many control frames wait to be written as may (they go once the journal syncs and the
        client reads), or the journal holds as many records waiting for a full disk as it may
        (imq.persist.file.disk.backlog.max_size; a CONNECT, which writes none, is still read),
        or the CONNECT's password is being checked."""
        if self.state is SessionState.AUTHENTICATING:
            return self._login_outcome is None
        if len(self._control) >= MAX_WAITING_CONTROL:
            return True
        if self.broker.disk.reading_stopped and self.state is SessionState.CONNECTED:
            return True
        core = self.core
        return core is not None and bool(core.held) and self.broker.producers.hold_full(core)

    def data_to_send(self, synced_lsn: int = 0) -> bytes:
        """Control frames that may be written now: those whose records are durable (synced up
        to `synced_lsn`), in order. They go ahead of any further payload."""
        return self._control.ready(synced_lsn)

    @property
    def waiting_for_sync(self) -> bool:
        """Control frames are held until the journal syncs."""
        return len(self._control) > 0

    @property
    def waiting_lsn(self) -> int:
        """The journal must sync this far for every control frame held now to go."""
        return self._control.lsn

    @property
    def control_waiting(self) -> int:
        """How many control frames wait (for the journal to sync, or to be written)."""
        return len(self._control)

    def _queue(self, data: bytes, lsn: int = 0) -> None:
        if not self._control.put(data, lsn):
            # Not reached while the control frames' bound holds; were it broken, the connection
            # ends (the client sees it drop, as after a network failure) rather than grow them.
            log.error(
                "%s: %d control frames wait to be written, the most a connection may have; "
                "closing the connection",
                self.peer,
                len(self._control),
            )
            self._close()
            return
        self.frames_out += 1

    def take_payload(self, max_frames: int) -> tuple[bytes, int]:
        """Up to `max_frames` MESSAGE frames to write now, in one piece, and how many there are."""
        parts: list[bytes] = []
        count, _ = self.take_parts(max_frames, NO_BYTE_LIMIT, parts)
        return b"".join(parts), count

    def take_parts(self, max_frames: int, max_bytes: int, out: list[bytes]) -> tuple[int, int]:
        """Append up to `max_frames` MESSAGE frames to write now to `out`, in parts (bodies
        uncopied, so the writer joins everything once), stopping after the one whose body
        reaches `max_bytes` of bodies; return how many frames and bytes."""
        core = self.core
        if core is None or self.state is not SessionState.CONNECTED:
            return 0, 0
        deliveries = core.take(max_frames, max_bytes)
        if not deliveries:
            return 0, 0
        version = self.version
        assert version is not None
        self.frames_out += len(deliveries)
        self.messages_out += len(deliveries)
        size = 0
        for delivery in deliveries:
            size += message_parts(delivery, version, out)
        return len(deliveries), size

    @property
    def has_payload(self) -> bool:
        core = self.core
        return core is not None and core.writable and core.has_pending_output

    def set_writable(self, writable: bool) -> None:
        if self.core is not None:
            self.core.set_writable(writable)

    def fail(self, error: BrokerError, receipt: str | None = None, *, logged: bool = False) -> None:
        """Queue an ERROR and stop: the connection is closed once it is written. `logged`: the
        caller logged the failure already (security refusals log what they need to)."""
        if self.state is SessionState.CLOSING:
            return
        self.failure = error
        if not (logged or isinstance(error, AuthenticationFailed | AccessDenied | TooManyLogins)):
            log.warning("%s: %s: %s (status %d)", self.peer, error.summary, error, error.status)
        extra = {"version": "1.0,1.1,1.2"} if isinstance(error, h.UnsupportedVersion) else None
        self._queue(error_frame(error, self.version, receipt, extra))
        self._close()

    def revoke(self, error: BrokerError) -> None:
        """Close with `error` for a reason outside this connection's own frames (its user was
        deleted or lost the right to connect, an administrator destroyed it), logged by the
        caller: the ERROR is written, then the connection closes."""
        self.fail(error, logged=True)
        self._on_control()

    def connection_lost(self) -> None:
        """The socket is gone: unconsumed messages go back, open transactions are aborted."""
        self._close()

    def _close(self) -> None:
        self.state = SessionState.CLOSING
        self._decoder.release()  # nothing more is parsed: its bytes, however many, go now
        login, self._login = self._login, None
        if login is not None:
            login.cancel()  # a check waiting, running or held back: nothing of it is kept
        self._connecting = self._login_outcome = None
        if self.core is not None:
            self.core.close()

    # -- frames --------------------------------------------------------------------------------

    def _handle(self, frame: Frame) -> None:
        receipt = frame.headers.get("receipt")
        try:
            handler = self._check(frame)
        except BrokerError as exc:
            self.fail(exc, receipt)
            return
        store = self.broker.store
        before = store.last_lsn if receipt is not None else 0  # (only a RECEIPT needs it)
        changes = store.changes
        self._receipt_lsn = 0
        self._receipt_durable = True
        try:
            extra = handler(frame)
        except BrokerError as exc:
            _drop_tracebacks(exc)
            if receipt is not None and self.failed_receipts:
                # The client understands failed receipts: refuse this frame, keep the session.
                log.debug("%s: refused %s: %s", self.peer, frame.command, exc)
                self._queue(failed_receipt_frame(receipt, exc, self.version))
                return
            self.fail(exc, receipt)
            return
        except Exception:
            log.exception("%s: internal error handling a %s frame", self.peer, frame.command)
            self.fail(
                InternalError(
                    "internal error",
                    "the broker failed to handle this frame; the failure is in the broker's log",
                ),
                receipt,
            )
            return
        if extra is DEFERRED:
            return  # the RECEIPT (or the refusal) comes when the held SEND is settled
        if receipt is None:
            if self._receipt_durable and store.changes != changes:
                self._owed = True
        elif frame.command not in ("CONNECT", "STOMP"):
            # A frame that wrote to the journal is confirmed once those records are durable,
            # and so is every earlier frame of this connection.
            owed, self._owed = self._owed, False
            after = store.last_lsn if self._receipt_durable or owed else 0
            lsn = max(after if after > before or owed else 0, self._receipt_lsn)
            self._queue(receipt_frame(receipt, self.version, extra), lsn)
        if frame.command == "DISCONNECT":
            self._close()

    def _check(self, frame: Frame) -> Callable[[Frame], Extra]:
        handler = self._handlers.get(frame.command)
        check_frame(
            frame,
            self.version,
            known=handler is not None,
            awaiting_connect=self.state is SessionState.AWAITING_CONNECT,
            connected=self.state is SessionState.CONNECTED,
        )
        assert handler is not None  # (check_frame refuses an unknown command)
        return handler

    def _connection(self) -> CoreConnection:
        assert self.core is not None
        return self.core

    def _on_connect(self, frame: Frame) -> Extra:
        version = h.agreed_version(frame)
        principal = None
        if self.broker.config.authentication:
            outcome, self._login_outcome, self._connecting = self._login_outcome, None, None
            if outcome is None:
                started = self._access.login(frame, self._login_done)
                if isinstance(started, PendingLogin):
                    self.state = SessionState.AUTHENTICATING
                    self._connecting, self._login = frame, started
                    return DEFERRED  # handled again once the password is checked
                outcome = started
            principal = self._access.admit(outcome)
        config = self.broker.config
        heartbeat = h.HeartBeat(0, 0)
        if version is not StompVersion.V1_0:
            heartbeat = h.negotiate_heartbeat(
                frame, config.heartbeat_send_ms, config.heartbeat_receive_ms
            )
        flow = h.connection_flow(frame)
        self.failed_receipts = h.boolean(frame, "failed-receipts", False)
        self.core = self.broker.open_connection(flow=flow, on_ready=self._on_ready)
        self.core.client_id = client_id = frame.headers.get("client-id") or None
        self.core.moves = client_id is not None and client_id.startswith(CLUSTER_LINK_PREFIX)
        self.core.user = principal.user if principal is not None else None
        self.version, self.heartbeat, self.flow = version, heartbeat, flow
        self._decoder.version = version
        self._decoder.limit_frames(*frame_limit(config))
        # STOMP 1.2 ACKs name their delivery by one id: a run of them is acknowledged at once.
        self._decoder.ack_runs = version is StompVersion.V1_2
        self.state = SessionState.CONNECTED
        heart_beat = (config.heartbeat_send_ms, config.heartbeat_receive_ms)
        session = f"{self.broker.instance_id}-{self.core.number}"
        self._queue(connected_frame(version, session, flow, self.failed_receipts, heart_beat))
        log.debug("%s: connected with STOMP %s, heart-beat %s", self.peer, version.value, heartbeat)
        return None

    # -- authentication and access control -----------------------------------------------------

    def _login_done(self, outcome: Outcome) -> None:
        """The password check is done (on the event loop): the CONNECT is handled again with its
        outcome at the I/O layer's next turn (`receive_data`), before the frames that waited."""
        self._login = None
        if self.state is not SessionState.AUTHENTICATING:
            return
        self._login_outcome = outcome
        self._on_control()

    def _on_send(self, frame: Frame) -> Extra:
        if "pack-count" in frame.headers:
            return self._on_send_pack(frame)
        self.sends_in += 1
        request = h.send_request(frame, self.broker.config.max_header_count)
        self._access.authorize_use(_PRODUCE, request.destination)
        receipt = frame.headers.get("receipt")
        stage = None
        if "stage" in frame.headers:  # most SENDs name none: no call for those
            stage = stage_frames.staged_send(frame, self.broker.config.stage_ttl_ms)
        sent = self._connection().send(
            request.destination,
            frame.body,
            request.headers,
            priority=request.priority,
            expires=request.expires,
            persistent=request.persistent,
            transaction=request.transaction,
            report=receipt is not None or request.persistent,
            stage=stage,
        )
        # A staged message is in the journal whatever its persistence: its RECEIPT waits for it.
        durable = request.persistent or stage is not None
        if sent.held is None:
            self._receipt_durable = durable
            return None
        sent.held.on_done = partial(self._send_settled, receipt, durable)
        return DEFERRED

    def _on_send_pack(self, frame: Frame) -> Extra:
        """A packed SEND: all its messages taken at once, or none (session.send_packs)."""
        self.sends_in += 1
        name = h.destination(frame)
        self._access.authorize_use(_PRODUCE, name)
        stage = None
        if "stage" in frame.headers:
            stage = stage_frames.staged_send(frame, self.broker.config.stage_ttl_ms)
        pack = send_packs.packed_send(frame, self.broker.config.max_header_count)
        self._connection().send_pack(name, pack, stage)
        self._receipt_durable = stage is not None or any(message[4] for message in pack)
        return None

    def _send_settled(
        self, receipt: str | None, persistent: bool, error: BrokerError | None
    ) -> None:
        """A held SEND was accepted (its RECEIPT is due) or refused (deadline, limit)."""
        if self.closing:
            return
        if error is None:
            if receipt is not None:
                lsn = self.broker.store.last_lsn if persistent else 0
                self._queue(receipt_frame(receipt, self.version, None), lsn)
        elif receipt is not None and self.failed_receipts:
            log.debug("%s: refused a held SEND: %s", self.peer, error)
            self._queue(failed_receipt_frame(receipt, error, self.version))
        else:
            self.fail(error, receipt)
        if self.state is SessionState.DRAINING and not self._connection().held:
            if self._disconnect_receipt is not None:
                receipt_data = receipt_frame(self._disconnect_receipt, self.version, None)
                self._queue(receipt_data, self.broker.store.last_lsn)
            self._close()
        self._on_control()

    def _on_subscribe(self, frame: Frame) -> Extra:
        if listing.is_listing(frame):
            return self._on_list(frame)
        destination = h.destination(frame)
        sub_id = frame.headers.get("id")
        if sub_id is None:
            if self.version is not StompVersion.V1_0:
                raise BadRequest("missing id header", "a SUBSCRIBE frame must carry an id header")
            sub_id = destination.path  # STOMP 1.0: the destination identifies the subscription
        text = frame.headers.get("selector", "")
        request = h.flow_request(frame)
        browser = h.boolean(frame, "browser", False)
        cursor, lease = readers.read_request(frame)
        # A durable subscription, a cursor and a lease consume too; browsing is its own right.
        plain_browse = browser and cursor is None and lease is None
        self._access.authorize_use(
            Operation.BROWSE if plain_browse else Operation.CONSUME, destination
        )
        subscription = self._connection().subscribe(
            sub_id,
            destination,
            h.ack_mode(frame),
            requested_limit=request.limit,
            threshold=request.threshold,
            prefetch=request.prefetch,
            pool=request.pool,
            selector=compile_selector(text) if text.strip() else None,
            browser=browser,
            browse_range=h.sequence_range(frame),
            durable_name=h.durable_name(frame),
            cursor=cursor,
            lease=lease,
            pack=readers.pack_size(frame, browser or cursor is not None or lease is not None),
        )
        flow = subscription.flow
        granted = {
            "consumer-flow-limit": str(flow.limit if flow.limit > 0 else UNLIMITED),
            "consumer-flow-threshold": str(flow.threshold),
            "consumer-flow-prefetch": "true" if flow.prefetch else "false",
        }
        if flow.auto:
            granted["consumer-flow-auto"] = "true"  # the limit above is the most it grows to
        return granted

    def _on_list(self, frame: Frame) -> Extra:
        """Name the destinations a listing asks for (session.listing): one MESSAGE, at once."""
        names = (destination.name for destination in self.broker.registry)
        self._queue(listing.listing(frame, self.version, names, self._access))
        return None

    def _on_unsubscribe(self, frame: Frame) -> Extra:
        core = self._connection()
        durable = h.durable_name(frame)
        sub_id = frame.headers.get("id")
        if sub_id is None and self.version is StompVersion.V1_0:
            sub_id = frame.headers.get("destination")
        if readers.CURSOR in frame.headers:
            # Delete the cursor (and end the read subscription `id` names, if it is open).
            self._authorize_position(frame)
            if sub_id is not None and core.subscription(sub_id) is not None:
                core.unsubscribe(sub_id)
            readers.delete_cursor(self.broker, frame)
            return None
        if durable is not None:
            # With the durable name: end the durable subscription itself, not just detach.
            if sub_id is not None and core.subscription(sub_id) is not None:
                core.unsubscribe(sub_id)
            core.remove_durable(durable)
            return None
        if sub_id is None:
            raise BadRequest(
                "missing id header", "an UNSUBSCRIBE frame must carry the subscription's id header"
            )
        core.unsubscribe(sub_id)
        return None

    def _on_ack(self, frame: Frame) -> Extra:
        if readers.is_position_ack(frame):
            return self._position_ack(frame, release=False)
        subscription, message_id = acked(self._connection(), self.version, frame)
        self._connection().ack(subscription, message_id, frame.headers.get("transaction"))
        return None

    def _ack_run(self, ids: list[str]) -> None:
        """Plain STOMP 1.2 ACKs, in order: a stretch of them naming messages awaiting
        acknowledgement is acknowledged at once; any other takes the general way, which refuses
        it as it would any ACK."""
        self.frames_in += len(ids)
        core = self._connection()
        named = [parse_ack_id(text) for text in ids]
        index = 0
        while index < len(ids) and not self.closing:
            index = core.ack_each(named, index)
            if index < len(ids):
                self._handle(Frame("ACK", {"id": ids[index]}))
                index += 1

    def _on_nack(self, frame: Frame) -> Extra:
        if readers.is_position_ack(frame):
            return self._position_ack(frame, release=True)
        subscription, message_id = acked(self._connection(), self.version, frame)
        self._connection().nack(subscription, message_id, frame.headers.get("transaction"))
        return None

    def _position_ack(self, frame: Frame, *, release: bool) -> Extra:
        """Commit a cursor, or acknowledge or release a lease (docs/pipelines-protocol.md)."""
        self._authorize_position(frame)
        extra = readers.position_ack(self.broker, frame, release=release)
        # A repeated answer (a lease acknowledged before, a commit behind the cursor) may rest on
        # records another connection wrote that are not durable yet: the RECEIPT waits for them.
        self._receipt_lsn = self.broker.store.last_lsn
        return extra

    def _authorize_position(self, frame: Frame) -> None:
        """Moving a cursor or ending a lease consumes from its destination."""
        destination = h.destination(frame)
        self._access.authorize(Operation.CONSUME, destination.kind, destination.name)

    def _on_begin(self, frame: Frame) -> Extra:
        self._connection().begin(h.required(frame, "transaction"))
        return None

    def _on_commit(self, frame: Frame) -> Extra:
        if stage_frames.is_stage_frame(frame):
            return self._on_stage(frame)
        self._connection().commit(h.required(frame, "transaction"))
        return None

    def _on_abort(self, frame: Frame) -> Extra:
        if stage_frames.is_stage_frame(frame):
            return self._on_stage(frame)
        self._connection().abort(h.required(frame, "transaction"))
        return None

    def _on_stage(self, frame: Frame) -> Extra:
        """COMMIT or ABORT of a stage (docs/pipelines-protocol.md)."""
        outcome = stage_frames.handle(self.broker.stages, frame)
        # "committed-before" may rest on a COMMIT another connection made that is not synced yet.
        self._receipt_lsn = outcome.lsn
        return stage_frames.receipt_headers(outcome)

    def _on_disconnect(self, frame: Frame) -> Extra:
        core = self._connection()
        if not core.held:
            return None  # the RECEIPT is written, then the session closes (see _handle)
        # SENDs are held: the client is owed their outcome before the DISCONNECT's RECEIPT.
        # Its consumers stop now (their messages go back); the session waits for the held SENDs
        # to be accepted (then RECEIPT and close) or refused (then ERROR), at most the deadline.
        self.state = SessionState.DRAINING
        self._disconnect_receipt = frame.headers.get("receipt")
        core.stop_consuming()
        return DEFERRED


def _drop_tracebacks(error: BaseException) -> None:
    """A refusal's traceback holds the frames that raised it, and they hold the refused message
    and often the error itself: a reference cycle that only the garbage collector frees, which
    under a large backlog runs rarely. Nothing reads these tracebacks, so drop them now."""
    seen: BaseException | None = error
    while seen is not None:
        seen.__traceback__ = None
        seen = seen.__cause__ or seen.__context__
