"""Failover of the pipeline connection: operations that go on across a broker killed and started
again, a 503 refusal that names the member to go to, the deadline, and failover turned off.

The refusals a cluster member sends while it takes another's store over come from a small
scripted STOMP server: what is tested is the client's side alone.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

import pytest

from sluiceway.client.pipeline import (
    LeaseState,
    OutgoingMessage,
    PipelineConnection,
    PipelineMessage,
    PipelineSettings,
)
from sluiceway.client.producer import RetryPolicy
from sluiceway.errors import (
    ConnectFailedError,
    ConnectionClosedError,
    NotFound,
    RemoteProtocolError,
    Unavailable,
)
from sluiceway.protocol.codec import FrameDecoder, encode_frame
from sluiceway.protocol.frames import Frame, StompVersion
from sluiceway.testing import BrokerProcess, BrokerThread

WAIT: Final = 5.0  # seconds: the client's timeout for any one answer
START: Final = 20.0  # seconds for a broker process to start (journal recovery included)
FAILOVER: Final = 30.0  # seconds a restart may take before the client gives up
DEADLINE: Final = 1.0  # the failover of the tests that run out of time
MARGIN: Final = 10.0  # what a loaded machine may add to it

Address = tuple[str, int]
# A scripted server's answer to a frame: the frames to send back, DROP among them to close the
# connection there. It is told which connection (0, 1, ...) the frame came on.
DROP: Final = None
Script = Callable[[int, Frame], list[Frame | None]]


def settings(*addresses: Address, failover: float, pause: float = 0.05) -> PipelineSettings:
    return PipelineSettings(
        timeout=WAIT,
        retry=RetryPolicy(pause=pause, deadline=WAIT),
        addresses=addresses,
        failover=failover,
    )


@contextlib.contextmanager
def dead_ports(count: int) -> Iterator[list[Address]]:
    """Addresses where nobody listens: bound, never listening, so a connect is refused."""
    with contextlib.ExitStack() as stack:
        addresses = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            addresses.append(("127.0.0.1", sock.getsockname()[1]))
        yield addresses


# -- a scripted STOMP server ---------------------------------------------------------------------


class ScriptedServer:
    """Serves one connection at a time on 127.0.0.1: CONNECTED to every CONNECT, then what the
    script says to each frame."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.address: Address = ("127.0.0.1", self.listener.getsockname()[1])
        self.connections = 0
        self.frames: list[Frame] = []  # every frame received but CONNECT, in order
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        self._thread.join(WAIT)
        self.listener.close()

    def _serve(self) -> None:
        while not self._stopping.is_set():
            try:
                sock, _ = self.listener.accept()
            except TimeoutError:
                continue
            number, self.connections = self.connections, self.connections + 1
            with sock:
                sock.settimeout(0.1)
                self._converse(sock, number)

    def _converse(self, sock: socket.socket, number: int) -> None:
        decoder = FrameDecoder()
        while not self._stopping.is_set():
            while (event := decoder.next_event()) is not None:
                if not isinstance(event, Frame):
                    continue
                for reply in self._answer(number, event):
                    if reply is DROP:
                        return
                    try:
                        sock.sendall(encode_frame(reply, StompVersion.V1_2))
                    except OSError:  # the client went away: so does this connection
                        return
            try:
                data = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            decoder.receive_data(data)

    def _answer(self, number: int, frame: Frame) -> list[Frame | None]:
        if frame.command == "CONNECT":
            return [Frame("CONNECTED", {"version": "1.2"})]
        self.frames.append(frame)
        return self.script(number, frame)


def receipt(frame: Frame, **headers: str) -> Frame:
    return Frame("RECEIPT", {"receipt-id": frame.headers["receipt"], **headers})


def unavailable(frame: Frame, member: Address | None = None) -> Frame:
    """The failed RECEIPT of a member taking over what `frame` asks for."""
    headers = {"status": "503", "message": "lease being taken over"}
    if member is not None:
        headers["member"] = "b2"
        headers["member-address"] = f"{member[0]}:{member[1]}"
    return receipt(frame, **headers)


def message(subscribe: Frame, sequence: int, message_id: str) -> Frame:
    headers = {
        "subscription": subscribe.headers["id"],
        "destination": subscribe.headers["destination"],
        "message-id": message_id,
        "sequence": str(sequence),
    }
    if "lease" in subscribe.headers:
        headers["lease"] = subscribe.headers["lease"]
    return Frame("MESSAGE", headers, message_id.encode())


def end_marker(subscribe: Frame, next_sequence: int, **headers: str) -> Frame:
    marker = {
        "subscription": subscribe.headers["id"],
        "destination": subscribe.headers["destination"],
        "browser": "end",
        "next-sequence": str(next_sequence),
        "head-sequence": str(next_sequence - 1),
        **headers,
    }
    return Frame("MESSAGE", marker)


# -- the settings ----------------------------------------------------------------------------


def test_failover_is_a_plain_value_that_pickles_and_hides_the_password() -> None:
    value = PipelineSettings(password="hush", failover=12.5)  # noqa: S106  (a test password)
    assert pickle.loads(pickle.dumps(value)) == value  # noqa: S301  (bytes made just now)
    assert "failover=12.5" in repr(value)
    assert "hush" not in repr(value)
    assert PipelineSettings().failover == 0.0
    with pytest.raises(ValueError, match="failover"):
        PipelineSettings(failover=-1)


# -- address lists ---------------------------------------------------------------------------


def test_an_address_where_nobody_listens_is_passed_over(broker: BrokerThread) -> None:
    with (
        dead_ports(1) as dead,
        PipelineConnection(
            settings(*dead, ("127.0.0.1", broker.port), failover=FAILOVER)
        ) as connection,
    ):
        assert connection.send_many(OutgoingMessage("/queue/listed", b"x") for _ in range(3)) == 3
        assert [m.sequence for m in connection.read_range("/queue/listed", 0, None)] == [1, 2, 3]
        read = connection.read_lease("/queue/listed", "g/1")
        assert [m.body for m in read] == [b"x"] * 3
        assert connection.ack_lease("/queue/listed", "g/1") is LeaseState.ACKNOWLEDGED
        assert connection.head("/queue/listed").message_count == 0


# -- a broker killed and started again -------------------------------------------------------


class Restarting:
    """A broker process on a fixed port and data directory, killed (SIGKILL) and started again
    on a thread while the test's client goes on; whatever runs at the end is killed."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = str(data_dir)
        self.process = BrokerProcess(data_dir=self.data_dir, timeout=START)
        self.port = self.process.port
        self.restarts = 0
        self._starting: threading.Thread | None = None
        self._failed: BaseException | None = None

    def kill_and_restart(self) -> None:
        """Kill the broker now; start it again on a thread (the client fails over meanwhile)."""
        self.wait_started()
        self.process.kill()
        self.restarts += 1
        self._starting = threading.Thread(target=self._start, daemon=True)
        self._starting.start()

    def _start(self) -> None:
        try:
            self.process = BrokerProcess(port=self.port, data_dir=self.data_dir, timeout=START)
        except BaseException as exc:  # told by wait_started, in the test's thread
            self._failed = exc

    def wait_started(self) -> None:
        if self._starting is not None:
            self._starting.join(START + WAIT)
            assert not self._starting.is_alive(), "the broker did not start again in time"
            self._starting = None
        if self._failed is not None:
            raise self._failed

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.wait_started()
        self.process.kill()


@contextlib.contextmanager
def restarting(data_dir: Path) -> Iterator[Restarting]:
    broker = Restarting(data_dir)
    try:
        yield broker
    finally:
        broker.close()


# Large enough that a lease or a range read of BATCH messages cannot all be in the socket
# buffers when the broker is killed: the kill lands mid-read.
BATCH: Final = 1000
BODY: Final = 12 * 1024  # bytes


def number(message: PipelineMessage) -> int:
    return int(message.body[:8])


class FailoverCounts(logging.Handler):
    """How many messages a read had yielded each time the client logged a failover."""

    def __init__(self, numbers: list[int]) -> None:
        super().__init__(logging.INFO)
        self.numbers = numbers
        self.counts: list[int] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "failing over" in record.getMessage():
            self.counts.append(len(self.numbers))


def read_killing_after_the_first(
    messages: Iterator[PipelineMessage], broker: Restarting
) -> tuple[list[int], list[int]]:
    """Read slowly, the broker killed once the first message is in: the numbers read, and how
    many had been read at each failover."""
    numbers: list[int] = []
    counting = FailoverCounts(numbers)
    logger = logging.getLogger("sluiceway.client.pipeline")
    logger.addHandler(counting)
    try:
        for item in messages:
            numbers.append(number(item))
            if len(numbers) == 1:
                broker.kill_and_restart()
    finally:
        logger.removeHandler(counting)
    return numbers, counting.counts


def failovers(caplog: pytest.LogCaptureFixture, what: str) -> list[str]:
    """The failover lines logged about `what`."""
    lines = (r.getMessage() for r in caplog.records)
    return [line for line in lines if "failing over" in line and what in line]


@pytest.mark.timeout(240)
def test_operations_go_on_across_a_broker_killed_and_started_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sluiceway.client.pipeline")
    queue = "/queue/work"
    with (
        restarting(tmp_path / "data") as broker,
        PipelineConnection(settings(("127.0.0.1", broker.port), failover=FAILOVER)) as connection,
    ):
        padding = bytes(BODY - 8)
        sent = connection.send_many(
            OutgoingMessage(queue, b"%08d" % i + padding) for i in range(3 * BATCH)
        )
        assert sent == 3 * BATCH

        # A lease read interrupted by the kill: read again, each message yielded once.
        lease = connection.read_lease(queue, "g/1", max_messages=BATCH)
        first, at = read_killing_after_the_first(iter(lease), broker)
        assert first == list(range(BATCH))
        assert lease.end is not None
        assert lease.end.lease_state is LeaseState.OPEN
        assert len(at) == 1
        assert 0 < at[0] < BATCH, "the kill did not land mid-read"
        assert connection.ack_lease(queue, "g/1") is LeaseState.ACKNOWLEDGED

        # The connection is idle when the broker dies: the next requests fail over.
        broker.kill_and_restart()
        assert connection.ack_lease(queue, "g/1") is LeaseState.ACKNOWLEDGED
        assert connection.head(queue).message_count == 2 * BATCH

        # A range read interrupted by the kill goes on after the last message it yielded.
        ranged = connection.read_range(queue, 0, None)
        numbers, at = read_killing_after_the_first(iter(ranged), broker)
        assert numbers == list(range(BATCH, 3 * BATCH))
        assert len(at) == 1
        assert 0 < at[0] < 2 * BATCH, "the kill did not land mid-read"

        broker.kill_and_restart()
        second = [number(m) for m in connection.read_lease(queue, "g/2", max_messages=2 * BATCH)]
        assert second == list(range(BATCH, 3 * BATCH))
        broker.kill_and_restart()
        assert connection.ack_lease(queue, "g/2") is LeaseState.ACKNOWLEDGED
        # Nothing lost, nothing left: every message was leased once and consumed.
        assert sorted(first + second) == list(range(3 * BATCH))
        assert connection.head(queue).message_count == 0
        assert broker.restarts == 5
    # One line per failover, none per message.
    assert len(failovers(caplog, queue)) == 5


# -- 503: a member taking over ---------------------------------------------------------------


def lease_on(broker: BrokerThread, queue: str, lease: str) -> None:
    """Three messages on `broker`, taken by `lease`."""
    with PipelineConnection(settings(("127.0.0.1", broker.port), failover=0)) as direct:
        direct.send_many(OutgoingMessage(queue, b"x") for _ in range(3))
        assert len(list(direct.read_lease(queue, lease))) == 3


def test_a_503_naming_a_member_moves_the_next_attempt_there(
    broker: BrokerThread, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sluiceway.client.pipeline")
    member = ("127.0.0.1", broker.port)
    lease_on(broker, "/queue/moved", "g/1")

    def refuse_naming_the_member(_number: int, frame: Frame) -> list[Frame | None]:
        return [unavailable(frame, member)]

    with (
        ScriptedServer(refuse_naming_the_member) as other,
        PipelineConnection(settings(other.address, failover=FAILOVER)) as connection,
    ):
        assert connection.ack_lease("/queue/moved", "g/1") is LeaseState.ACKNOWLEDGED
        # Only the other member's address is listed: the ACK went where the refusal said.
        assert other.connections == 1
        assert [f.command for f in other.frames] == ["ACK"]
        assert connection.last_address == member
    lines = failovers(caplog, "ACK of lease g/1 of /queue/moved")
    assert len(lines) == 1
    assert f"failing over to 127.0.0.1:{broker.port}, 127.0.0.1:{other.address[1]}" in lines[0]
    assert "status 503" in lines[0]
    with PipelineConnection(settings(member, failover=0)) as direct:
        assert direct.head("/queue/moved").message_count == 0


def test_a_503_without_a_member_is_tried_again_until_the_deadline() -> None:
    def refuse(_number: int, frame: Frame) -> list[Frame | None]:
        return [unavailable(frame)]

    with ScriptedServer(refuse) as server:
        connection = PipelineConnection(settings(server.address, failover=DEADLINE, pause=0.1))
        started = time.monotonic()
        with pytest.raises(Unavailable) as refused:
            connection.commit_stage("sink", 3, ["0.0"])
        waited = time.monotonic() - started
        connection.close()
        attempts = server.connections
    assert DEADLINE <= waited < DEADLINE + MARGIN
    # Each attempt on a connection of its own, after a pause: a few, not a busy loop.
    assert 2 <= attempts < 20
    text = str(refused.value)
    assert "COMMIT of stage sink/3 failed: gave up after failing over for" in text
    assert f"127.0.0.1:{server.address[1]}" in text
    assert "status 503 (lease being taken over)" in text
    assert refused.value.summary == "lease being taken over"


# -- reads that go on where they were interrupted --------------------------------------------


def serve_lease(*, again: list[tuple[int, str]], state: str = "open") -> Script:
    """A lease of messages 1, 2, 3 whose first read is cut after two; read again, it returns
    `again` ((sequence, message-id) each) and an end marker with `state`."""

    def script(number: int, frame: Frame) -> list[Frame | None]:
        if frame.command != "SUBSCRIBE":
            return []
        if number == 0:
            return [receipt(frame), *(message(frame, s, f"id-{s}") for s in (1, 2)), DROP]
        count = str(len(again)) if state == "open" else "0"
        return [
            receipt(frame),
            *(message(frame, s, i) for s, i in again),
            end_marker(frame, 4, **{"lease-state": state, "lease-count": count}),
        ]

    return script


def read_lease_from(script: Script) -> tuple[list[str], LeaseState | None, ScriptedServer]:
    with (
        ScriptedServer(script) as server,
        PipelineConnection(settings(server.address, failover=FAILOVER)) as connection,
    ):
        read = connection.read_lease("/queue/a", "g/7")
        ids = [m.headers["message-id"] for m in read]
    assert read.end is not None
    return ids, read.end.lease_state, server


def test_a_lease_read_again_skips_the_messages_it_yielded() -> None:
    again = [(1, "id-1"), (2, "id-2"), (3, "id-3")]
    ids, state, server = read_lease_from(serve_lease(again=again))
    assert ids == ["id-1", "id-2", "id-3"]
    assert state is LeaseState.OPEN
    subscribes = [f for f in server.frames if f.command == "SUBSCRIBE"]
    assert [f.headers["lease"] for f in subscribes] == ["g/7", "g/7"]
    assert server.connections == 2


def test_a_lease_that_comes_back_with_other_messages_is_a_protocol_error() -> None:
    script = serve_lease(again=[(1, "id-1"), (2, "id-9"), (3, "id-3")])
    with pytest.raises(RemoteProtocolError, match="lease came back with other messages"):
        read_lease_from(script)


def test_a_lease_that_expired_meanwhile_is_not_hidden() -> None:
    ids, state, _ = read_lease_from(serve_lease(again=[], state="expired"))
    assert ids == ["id-1", "id-2"]
    assert state is LeaseState.EXPIRED  # the caller decides (onExpiredLease)


def test_a_range_read_goes_on_after_the_last_sequence_it_yielded() -> None:
    def script(number: int, frame: Frame) -> list[Frame | None]:
        if frame.command != "SUBSCRIBE":
            return []
        first = int(frame.headers["from-sequence"])
        sequences = [first, first + 1] if number == 0 else [first]
        messages = [message(frame, s, f"id-{s}") for s in sequences]
        if number == 0:
            return [receipt(frame), *messages, DROP]
        return [receipt(frame), *messages, end_marker(frame, first + 1)]

    with (
        ScriptedServer(script) as server,
        PipelineConnection(settings(server.address, failover=FAILOVER)) as connection,
    ):
        read = connection.read_range("/topic/a", 5, 8)
        assert [m.sequence for m in read] == [5, 6, 7]
    assert read.end is not None
    assert read.end.next_sequence == 8
    subscribes = [f for f in server.frames if f.command == "SUBSCRIBE"]
    assert [f.headers["from-sequence"] for f in subscribes] == ["5", "7"]
    assert [f.headers["to-sequence"] for f in subscribes] == ["8", "8"]


# -- failover off ----------------------------------------------------------------------------


def test_without_failover_an_unreachable_broker_fails_at_once() -> None:
    with dead_ports(1) as dead:
        connection = PipelineConnection(settings(*dead, failover=0))
        started = time.monotonic()
        with pytest.raises(ConnectFailedError, match=rf"127.0.0.1:{dead[0][1]}: .*refused"):
            connection.head("/queue/a")
        assert time.monotonic() - started < WAIT


def test_without_failover_a_503_is_raised_at_once(broker: BrokerThread) -> None:
    member = ("127.0.0.1", broker.port)

    def refuse_naming_the_member(_number: int, frame: Frame) -> list[Frame | None]:
        return [unavailable(frame, member)]

    with (
        ScriptedServer(refuse_naming_the_member) as other,
        PipelineConnection(settings(other.address, failover=0)) as connection,
    ):
        with pytest.raises(Unavailable) as refused:
            connection.ack_lease("/queue/a", "g/1")
        assert refused.value.member == "b2"
        assert refused.value.member_address == f"127.0.0.1:{broker.port}"
        assert other.connections == 1


def test_without_failover_only_an_idle_connections_request_is_tried_again() -> None:
    def answer_then_drop(_number: int, frame: Frame) -> list[Frame | None]:
        if frame.command == "SUBSCRIBE":  # a read: two messages, then the connection drops
            return [receipt(frame), message(frame, 1, "id-1"), message(frame, 2, "id-2"), DROP]
        return [receipt(frame, **{"lease-state": "acknowledged"}), DROP]

    with (
        ScriptedServer(answer_then_drop) as server,
        PipelineConnection(settings(server.address, failover=0)) as connection,
    ):
        assert connection.ack_lease("/queue/a", "g/1") is LeaseState.ACKNOWLEDGED
        # The connection was dropped while idle: the next request is tried once more.
        assert connection.ack_lease("/queue/a", "g/1") is LeaseState.ACKNOWLEDGED
        assert server.connections == 2
        # A read cut short is not read again.
        connection.close()
        got: list[str] = []
        with pytest.raises(ConnectionClosedError):
            got.extend(m.headers["message-id"] for m in connection.read_lease("/queue/a", "g/1"))
        assert got == ["id-1", "id-2"]
        assert server.connections == 3


def test_refusals_other_than_503_are_answers_not_failures(broker: BrokerThread) -> None:
    with PipelineConnection(settings(("127.0.0.1", broker.port), failover=FAILOVER)) as connection:
        started = time.monotonic()
        with pytest.raises(NotFound):
            connection.ack_lease("/queue/none", "g/1")  # never read: 404
        assert time.monotonic() - started < WAIT


def test_the_deadline_ends_the_attempts_naming_what_was_tried() -> None:
    with dead_ports(2) as dead:
        connection = PipelineConnection(settings(*dead, failover=DEADLINE, pause=0.1))
        started = time.monotonic()
        with pytest.raises(ConnectFailedError) as failed:
            connection.ack_lease("/queue/a", "g/1")
        waited = time.monotonic() - started
    assert DEADLINE <= waited < DEADLINE + MARGIN
    text = str(failed.value)
    assert "ACK of lease g/1 of /queue/a failed: gave up after failing over for" in text
    assert f"failover deadline {DEADLINE:g} s" in text
    for host, port in dead:
        assert f"{host}:{port}" in text
    assert "cannot connect to the broker" in text


def test_a_send_is_not_repeated_once_its_connection_is_lost() -> None:
    def drop_at_the_send(_number: int, frame: Frame) -> list[Frame | None]:
        return [DROP] if frame.command == "SEND" else []

    with (
        ScriptedServer(drop_at_the_send) as server,
        PipelineConnection(settings(server.address, failover=FAILOVER)) as connection,
    ):
        with pytest.raises(ConnectionClosedError):
            connection.send_many([OutgoingMessage("/queue/a", b"once")])
        assert server.connections == 1
        assert [f.command for f in server.frames] == ["SEND"]


def test_a_send_refused_with_503_is_sent_again() -> None:
    def refuse_the_first(_number: int, frame: Frame) -> list[Frame | None]:
        sends = [f for f in server.frames if f.command == "SEND"]
        return [unavailable(frame) if len(sends) == 1 else receipt(frame)]

    with (
        ScriptedServer(refuse_the_first) as server,
        PipelineConnection(settings(server.address, failover=0)) as connection,
    ):
        assert connection.send_many([OutgoingMessage("/queue/a", b"again")], stage="s/1/0") == 1
        assert [f.body for f in server.frames] == [b"again", b"again"]
        assert server.connections == 1
