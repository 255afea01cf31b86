"""The asyncio side of one client connection: socket bytes to the session and back.

It honours the transport's write watermarks (`imq.stomp.write.high_water` / `low_water`): above
the high-water mark the core stops giving this connection messages, so a client that stops
reading costs at most the watermark, never the broker's memory. Reading is paused only when
control frames (which are never held back) pile up past four times the high-water mark, which
takes a client that keeps sending receipt requests without reading the replies.

Flow metering: each turn of the pump writes pending control frames, then at most
`connection-flow-count` MESSAGE frames, then yields to the event loop, so incoming frames are read
and their RECEIPTs written before the next batch of messages.

Input is bounded (session.input_budget): after every read, what the session holds of frames being
received is charged to the memory ledger and checked against the connection's and the broker's
limits. A new connection is first counted against imq.stomp.max_connections and
imq.stomp.max_connections_per_address (core.values.connection_counts); one past them never reaches
the session.

An ERROR that ends a connection must reach the client even while the client is still sending:
closing a socket with unread input makes the kernel answer with a reset, which discards what the
client has not read yet. So after such an ERROR the write side is shut (half-close: the client
reads the ERROR, then end of stream), and whatever the client still sends is read and dropped
until it closes its side, or stays quiet for DRAIN_QUIET_S, or CLOSE_LINGER_S have passed.

A member of a cluster serves only while its lease holds (cluster.lease): the listener's `fence`
is checked before each read is handed to the session and before each write, so a broker that
was paused past its lease and resumed acts on nothing a client sent and sends nothing more but
the ERROR that ends each connection.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, cast

from sluiceway.errors import BadRequest, BrokerError, Unavailable
from sluiceway.server.snapshots import ConnectionInfo, Traffic
from sluiceway.session.input_budget import InputBudget
from sluiceway.session.render import error_frame
from sluiceway.session.session import SessionState, StompSession

if TYPE_CHECKING:
    from sluiceway.config import BrokerConfig
    from sluiceway.core.broker import Broker
    from sluiceway.security.access import Gate

log = logging.getLogger(__name__)

UNMETERED_TURN = 256  # with connection-flow-count 0, still yield to other connections this often
WRITE_CHUNK = 32  # frames taken at a time, so the high-water mark is noticed within a chunk
# A client's unwritten bytes stay under this many times imq.stomp.write.high_water: MESSAGEs
# stop at the high-water mark, and control frames (RECEIPTs...) at this multiple: then they wait
# in the session, and once MAX_WAITING_CONTROL wait the client is not read either. A closing
# session's last frames are the one exception (at most that many frames, then the socket closes).
WRITE_CAP_FACTOR = 4
CLOSE_LINGER_S = 5.0  # after an ERROR, how long a client that does not read may keep the socket
# After an ERROR and the half-close: a client this long silent has sent all it meant to, so the
# socket can close without a reset (a client that reads its ERROR and then holds the socket
# open need not keep it for the whole linger).
DRAIN_QUIET_S = 1.0
# What each client of a broker that lost its cluster lease is told.
LEASE_LOST = Unavailable(
    "this broker lost its cluster lease; reconnect to another member",
    "this broker lost its cluster lease (it could not renew it in time, or another member "
    "took its store over): it serves nothing more; reconnect to another member of the cluster",
)


class Fence(Protocol):
    """Whether this broker may still serve (a cluster member's lease; cluster.lease.Lease)."""

    def holds(self) -> bool: ...


class Serving(Protocol):
    """What serves STOMP: the broker, its configuration, and the users and access rules shared
    by every session (None: each session reads its own, or there is no authentication)."""

    @property
    def broker(self) -> Broker: ...

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def gate(self) -> Gate | None: ...


class Listening(Serving, Protocol):
    """The listener a connection was accepted by, as the connection uses it (a StompServer).

    Declared here so that the connection need not import the listener that creates it.
    """

    @property
    def name(self) -> str: ...

    @property
    def fence(self) -> Fence | None:
        """None: not a cluster member, nothing to check."""
        ...

    def admit(self, protocol: StompProtocol, address: str) -> BrokerError | None: ...

    def refused(self, limit: str | None) -> None: ...

    def connection_opened(self, protocol: StompProtocol) -> None: ...

    def connection_closed(self, protocol: StompProtocol) -> None: ...

    def flush_store(self) -> None: ...

    def wait_for_sync(self, protocol: StompProtocol) -> None: ...


class StompProtocol(asyncio.Protocol):
    """One accepted STOMP connection."""

    def __init__(self, server: Listening) -> None:
        self._server = server
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self.session: StompSession | None = None
        self._pump_scheduled = False
        self._writing_paused = False
        self._reading_paused = False
        # Not reading: the session takes no further frame for now (it holds as many SENDs, or
        # as many control frames wait to be written, as it may).
        self._input_paused = False
        self._write_cap = WRITE_CAP_FACTOR * server.config.write_high_water
        self._control_scheduled = False
        self._closed = False
        self._last_read = self._last_write = self._loop.time()
        self._timers: dict[str, asyncio.TimerHandle] = {}  # one per purpose, re-armed in place
        self.traffic = Traffic()
        # What this connection holds of frames being received, charged to the memory ledger.
        self._input = InputBudget(server.broker.ledger, server.config)
        self.address: str | None = None  # the client's IP address, once counted
        # The last frame (an ERROR) is written and the write side shut: input is dropped.
        self._ending = False

    # -- asyncio callbacks -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without deriving from it.
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        config = self._server.config
        peername = transport.get_extra_info("peername")
        peer = f"{peername[0]}:{peername[1]}" if isinstance(peername, tuple) else str(peername)
        address = str(peername[0]) if isinstance(peername, tuple) else peer
        refusal = self._server.admit(self, address)
        if refusal is not None:
            # Never a session: the ERROR, then the close, and nothing it sends is parsed.
            self._write(error_frame(refusal, None))
            self._end()
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, int(config.tcp_nodelay))
        transport.set_write_buffer_limits(high=config.write_high_water, low=config.write_low_water)
        self.session = StompSession(
            self._server.broker,
            on_ready=self._schedule_pump,
            on_control=self._schedule_control,
            peer=peer,
            gate=self._server.gate,
        )
        self._server.connection_opened(self)
        self._later("connect", config.connect_timeout_ms / 1000, self._check_connected)

    def data_received(self, data: bytes) -> None:
        if self._ending:
            self._drop(data)
            return
        try:
            self._received(data)
        except Exception:
            self._internal_failure("reading")

    def _internal_failure(self, doing: str) -> None:
        """A bug surfaced in this connection's handling: close it, keep the broker going."""
        log.exception("internal error while %s; closing this connection", doing)
        if self._transport is not None:
            self._transport.abort()

    def _received(self, data: bytes) -> None:
        session = self.session
        assert session is not None
        if self._fenced():
            return
        self._last_read = self._loop.time()
        self.traffic.bytes_in += len(data)
        was_connected = session.state is SessionState.CONNECTED
        session.receive_data(data)
        if not was_connected and session.state is SessionState.CONNECTED:
            self._start_heartbeats()
        self._check_input_budget()
        # What these frames freed may let held SENDs (of any connection) go.
        self._server.broker.settle()
        self._check_input()
        if session.waiting_for_sync:
            # A RECEIPT these frames queued asks for its fsync before the write below, so that
            # the fsync thread is woken once for both.
            self._server.broker.store.request_sync(session.waiting_lsn)
        # What these frames changed reaches the operating system now, so a killed broker loses
        # nothing it acted on (an ACK without a receipt included).
        self._server.flush_store()
        self._flush_control()
        if session.closing:
            self._close_after_flush()
        elif session.has_payload:
            self._schedule_pump()

    def input_held_below(self, held: int) -> None:
        """The transport holds `held` bytes of a message it has not handed over yet (a WebSocket
        message being assembled): they count toward this connection's input."""
        self._input.below = held
        if self._closed:
            return
        if self._ending:
            if self._input.past_allowance:
                self.abort()  # refused, and still sending what the transport would hold
            return
        self._check_input_budget()

    def _check_input_budget(self) -> None:
        """Charge what this connection holds of frames being received; end it past a limit."""
        session = self.session
        if session is None or self._ending or self._closed:
            return
        if session.closing:
            self._input.release()  # its decoder let go of everything
            return
        connected = session.state is not SessionState.AWAITING_CONNECT
        error = self._input.check(session.input_buffered, connected=connected)
        if error is not None:
            self._refuse_input(error)

    def _refuse_input(self, error: BrokerError) -> None:
        """Past an input limit: the ERROR, then the close; what was held is given back."""
        session = self.session
        assert session is not None
        session.fail(error)
        self._input.release()
        self._flush_control()
        self._close_after_flush()

    def _drop(self, data: bytes) -> None:
        """Input after the last ERROR: counted, never kept."""
        self.traffic.bytes_in += len(data)
        self._last_read = self._loop.time()

    def _check_input(self) -> None:
        """Stop reading while the session's input is blocked; go on when it is not (the frames
        already received are handled first)."""
        session, transport = self.session, self._transport
        if session is None or transport is None or self._closed or self._ending:
            return
        if session.input_blocked:
            if not self._input_paused:
                self._input_paused = True
                transport.pause_reading()
        elif self._input_paused:
            self._input_paused = False
            self._resume_reading()

    @property
    def _not_reading(self) -> bool:
        """Reading stopped by choice (either reason)."""
        return self._reading_paused or self._input_paused

    def _resume_reading(self) -> None:
        """Read again, unless another reason to stop still holds."""
        transport = self._transport
        if transport is None or self._closed:
            return
        if not self._not_reading:
            transport.resume_reading()

    def input_may_go_on(self) -> None:
        """What stopped this connection's input may have cleared (the disk took the journal's
        records): look again, and read if it has."""
        if self._input_paused:
            self._schedule_control()

    def _schedule_control(self) -> None:
        if not self._control_scheduled and not self._closed:
            self._control_scheduled = True
            self._loop.call_soon(self._control_turn)

    def _control_turn(self) -> None:
        """A held SEND was settled, or control frames were written: write what is owed, and
        handle the frames left unread and read again if the session's input was blocked."""
        self._control_scheduled = False
        session = self.session
        if session is None or self._closed:
            return
        try:
            if self._input_paused and not session.input_blocked:
                self._received(b"")  # the frames buffered while reading was stopped
            else:
                self.flush_control()
        except Exception:
            self._internal_failure("settling held SENDs")

    def pause_writing(self) -> None:
        self._writing_paused = True
        if self.session is not None:
            self.session.set_writable(False)

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._reading_paused:
            self._reading_paused = False
            self._resume_reading()
        if self.session is not None:
            self.session.set_writable(True)
            self._schedule_pump()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        if self.session is not None:
            self.session.connection_lost()
        self._input.release()
        self._server.connection_closed(self)

    # -- writing -----------------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        transport = self._transport
        if transport is None or transport.is_closing() or self._ending or self._fenced():
            return
        # No frame leaves before the journal records it depends on are written.
        self._server.flush_store()
        transport.write(data)
        self.traffic.bytes_out += len(data)
        self._last_write = self._loop.time()

    def flush_control(self) -> None:
        """Write the control frames whose records are durable; the rest wait for the sync."""
        self._flush_control()
        session = self.session
        if session is not None and session.closing and not session.waiting_for_sync:
            self._close_after_flush()

    def _flush_control(self) -> None:
        session = self.session
        assert session is not None
        if self._write_capped and not session.closing:
            # The client does not read what it was sent: its control frames wait in the
            # session (resume_writing brings them), and this connection is not read meanwhile.
            self._pause_reading()
            return
        data = session.data_to_send(self._server.broker.store.synced_lsn)
        if session.waiting_for_sync:
            self._server.wait_for_sync(self)
        if data:
            if self._input_paused and not session.input_blocked:
                self._schedule_control()  # the frames left unread while too many waited go on
            self._write(data)
            if self._write_capped:
                self._pause_reading()

    @property
    def _write_capped(self) -> bool:
        """As many bytes wait to be written as may (WRITE_CAP_FACTOR x the high-water mark)."""
        transport = self._transport
        return transport is not None and transport.get_write_buffer_size() > self._write_cap

    def _pause_reading(self) -> None:
        """Stop reading until writing resumes."""
        transport = self._transport
        if transport is not None and not self._reading_paused and not self._ending:
            self._reading_paused = True
            transport.pause_reading()

    def _schedule_pump(self) -> None:
        if not self._pump_scheduled and not self._closed:
            self._pump_scheduled = True
            self._loop.call_soon(self._pump)

    def _pump(self) -> None:
        try:
            self._pump_turn()
        except Exception:
            self._internal_failure("writing")

    def _pump_turn(self) -> None:
        """One metered turn: control frames, then at most connection-flow-count messages."""
        self._pump_scheduled = False
        session = self.session
        if session is None or self._closed or session.closing or self._fenced():
            return
        self._flush_control()
        turn = session.flow.count or UNMETERED_TURN
        written = 0
        # The turn's frames go out in one write (one system call), taken a chunk at a time until
        # they fill the write buffer to its high-water mark, as chunk-by-chunk writes would.
        transport = self._transport
        assert transport is not None
        room = self._server.config.write_high_water - transport.get_write_buffer_size()
        # The frames' parts (bodies among them, as they are kept) are joined once, here: each
        # body is copied once on its way to the socket.
        parts: list[bytes] = []
        while written < turn and not self._writing_paused:
            count, size = session.take_parts(min(WRITE_CHUNK, turn - written), max(room, 1), parts)
            if not count:
                break
            room -= size
            written += count
            if room <= 0:
                break  # the write takes the buffer to its high-water mark: writing pauses
        if parts:
            self._write(b"".join(parts))
        if written:
            self._server.broker.settle()  # auto-acknowledged messages made room
        if session.has_payload and not self._writing_paused:
            self._schedule_pump()  # after the event loop has read what arrived meanwhile

    # -- closing -----------------------------------------------------------------------------

    def _fenced(self) -> bool:
        """Whether this broker lost its cluster lease; the first time, the connection ends with
        an ERROR saying so, written past the session (whose frames are never sent now)."""
        fence = self._server.fence
        if fence is None or fence.holds():
            return False
        transport = self._transport
        if transport is not None and not self._ending and not transport.is_closing():
            transport.write(error_frame(LEASE_LOST, None))
            self._end()
        return True

    def fail(self, error: BrokerError) -> None:
        """Send an ERROR and close (heart-beat timeout, shutdown, ...)."""
        if self.session is None or self._closed:
            return
        self.session.fail(error)
        self._flush_control()
        self._close_after_flush(drain=False)  # not about its input: no need to read it out

    def _close_after_flush(self, *, drain: bool = True) -> None:
        """Close once the last frames are written; after an ERROR the session gave (`drain`),
        so that the client can read it (`_end`)."""
        transport = self._transport
        if transport is None or transport.is_closing() or self._ending:
            return
        session = self.session
        if session is not None and session.waiting_for_sync:
            return  # closed by flush_control once the last frames are durable and written
        if drain and session is not None and session.failure is not None:
            self._server.refused(session.failure.limit)  # (counts the input limits only)
            self._end()
            return
        transport.close()  # writes what is buffered, then closes
        self._later("linger", CLOSE_LINGER_S, transport.abort)

    def _end(self) -> None:
        """The ERROR is written: shut the write side and drop what the client still sends,
        until it closes its side, is quiet for DRAIN_QUIET_S, or CLOSE_LINGER_S have passed.
        (TLS and WebSocket cannot half-close: there the close waits the same way, without it.)"""
        transport = self._transport
        assert transport is not None
        self._ending = True
        session = self.session
        self._input.end(connected=session is not None and session.version is not None)
        for purpose in [p for p in self._timers if p not in ("linger", "quiet")]:
            self._timers.pop(purpose).cancel()  # heart-beats, the CONNECT timeout: over
        self._later("linger", CLOSE_LINGER_S, transport.abort)
        if transport.can_write_eof():
            try:
                transport.write_eof()  # after what is buffered, the ERROR included
            except OSError as exc:  # the peer is gone already (ENOTCONN): nothing to end
                log.debug("ending a connection whose peer is gone: %s", exc)
        self._reading_paused = self._input_paused = False
        transport.resume_reading()
        self._last_read = self._loop.time()
        self._later("quiet", DRAIN_QUIET_S, self._check_quiet)

    def _check_quiet(self) -> None:
        transport = self._transport
        if transport is None or self._closed:
            return
        quiet = self._loop.time() - self._last_read
        if quiet >= DRAIN_QUIET_S and not transport.get_write_buffer_size():
            transport.close()  # nothing unread: the close sends no reset
            return
        self._later("quiet", max(DRAIN_QUIET_S - quiet, 0.01), self._check_quiet)

    # -- timers ------------------------------------------------------------------------------

    def _later(self, purpose: str, delay: float, callback: Callable[[], object]) -> None:
        previous = self._timers.get(purpose)
        if previous is not None:
            previous.cancel()
        if not self._closed:
            self._timers[purpose] = self._loop.call_later(delay, callback)

    def _check_connected(self) -> None:
        if self.session is not None and self.session.state is SessionState.AWAITING_CONNECT:
            timeout = self._server.config.connect_timeout_ms
            self.fail(
                BadRequest(
                    "no CONNECT frame",
                    f"no CONNECT frame arrived within {timeout} ms of opening the connection "
                    "(imq.stomp.connect.timeout)",
                )
            )

    def _start_heartbeats(self) -> None:
        assert self.session is not None
        heartbeat = self.session.heartbeat
        if heartbeat.send_ms:
            self._later("send-heartbeat", heartbeat.send_ms / 2000, self._send_heartbeat)
        if heartbeat.receive_ms:
            self._later("check-heartbeat", heartbeat.receive_ms / 2000, self._check_heartbeat)

    def _send_heartbeat(self) -> None:
        """Checked every half interval, so the client never waits a full interval for a byte."""
        assert self.session is not None
        half = self.session.heartbeat.send_ms / 2000
        # Bytes still waiting to be written serve as the heart-beat (the client has unread data).
        if self._loop.time() - self._last_write >= half and not self.write_buffer_size:
            self._write(b"\n")
        self._later("send-heartbeat", half, self._send_heartbeat)

    def _check_heartbeat(self) -> None:
        assert self.session is not None
        interval = self.session.heartbeat.receive_ms / 1000
        limit = interval * self._server.config.heartbeat_grace
        if self._not_reading:
            self._last_read = self._loop.time()  # not reading by choice: the peer is not silent
        silent = self._loop.time() - self._last_read
        if silent > limit:
            self.fail(
                BadRequest(
                    "heart-beat timeout",
                    f"nothing was received for {silent:.1f} s while heart-beats were agreed every "
                    f"{interval:.1f} s (tolerance imq.stomp.heartbeat.grace x "
                    f"{self._server.config.heartbeat_grace})",
                )
            )
            return
        self._later("check-heartbeat", interval / 2, self._check_heartbeat)

    def info(self) -> ConnectionInfo:
        session, transport = self.session, self._transport
        core = session.core if session is not None else None
        sock = transport.get_extra_info("socket") if transport is not None else None
        return ConnectionInfo(
            number=core.number if core is not None else 0,
            service=self._server.name,
            peer=session.peer if session is not None else "?",
            state=session.state.value if session is not None else "opening",
            version=session.version.value if session and session.version else None,
            subscriptions=len(core.subscriptions) if core is not None else 0,
            outstanding=core.outstanding if core is not None else 0,
            write_buffer=transport.get_write_buffer_size() if transport is not None else 0,
            writing_paused=self._writing_paused,
            reading_paused=self._not_reading,
            held_sends=len(core.held) if core is not None else 0,
            held_reason=str(core.held.head().reason) if core is not None and core.held else None,
            tcp_nodelay=bool(_sockopt(sock, socket.IPPROTO_TCP, socket.TCP_NODELAY)),
            send_buffer=_sockopt(sock, socket.SOL_SOCKET, socket.SO_SNDBUF),
            receive_buffer=_sockopt(sock, socket.SOL_SOCKET, socket.SO_RCVBUF),
            traffic=self.traffic_now(),
        )

    def traffic_now(self) -> Traffic:
        """This connection's traffic so far (frames and messages as its session counted them)."""
        traffic = Traffic(self.traffic.bytes_in, self.traffic.bytes_out)
        session = self.session
        if session is not None:
            traffic.frames_in, traffic.frames_out = session.frames_in, session.frames_out
            traffic.msgs_in, traffic.msgs_out = session.sends_in, session.messages_out
        return traffic

    @property
    def closing(self) -> bool:
        """The session has ended: its last frames are being written."""
        return self.session is not None and self.session.closing

    @property
    def input_held(self) -> int:
        """Bytes of frames being received this connection holds (charged to the ledger)."""
        return self._input.held

    @property
    def write_buffer_size(self) -> int:
        transport = self._transport
        return transport.get_write_buffer_size() if transport is not None else 0

    def abort(self) -> None:
        """Drop the connection without flushing (a client that never read its last frames)."""
        if self._transport is not None:
            self._transport.abort()

    def shutdown(self) -> None:
        """The broker is stopping: tell the client why, then close (one already told why it
        ends is closed at once)."""
        if self._fenced():
            return  # told why already
        if self._ending and self._transport is not None:
            self._transport.close()
            return
        # 503: nothing was wrong with the request; a client may come back when the broker is
        # up again (or go to another member of its cluster).
        self.fail(
            Unavailable(
                "broker shutting down",
                "the broker is shutting down; connect again once it is back, or to another "
                "member of its cluster",
            )
        )


def _sockopt(sock: object, level: int, option: int) -> int:
    getsockopt = getattr(sock, "getsockopt", None)
    if getsockopt is None:
        return 0
    try:
        return int(getsockopt(level, option))
    except OSError:
        return 0
