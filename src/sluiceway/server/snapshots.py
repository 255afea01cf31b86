"""What a listener reports of its connections: a snapshot of each (admin's connection list, the
tests), and the traffic counted per connection and, summed, per listener (the metrics)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """A snapshot of one connection, for operators and tests."""

    number: int  # the core connection number (0 before CONNECT)
    service: str  # the listener that carries it: stomp, stomp-tls, ws
    peer: str
    state: str
    version: str | None
    subscriptions: int
    outstanding: int  # messages given to its subscriptions and not consumed
    write_buffer: int  # bytes waiting in the transport to be written
    writing_paused: bool  # above the high-water mark: no more messages are given to it
    reading_paused: bool
    held_sends: int  # SENDs held until their destination can take them
    held_reason: str | None  # why the oldest waits (destination, limit, value)
    tcp_nodelay: bool
    send_buffer: int  # kernel SO_SNDBUF, bytes
    receive_buffer: int  # kernel SO_RCVBUF, bytes
    traffic: Traffic  # what it carried so far


@dataclass
class Traffic:
    """What one connection (or, summed, one listener) carried: bytes and frames each way, and
    of the frames, messages (SEND in, MESSAGE out)."""

    bytes_in: int = 0
    bytes_out: int = 0
    frames_in: int = 0
    frames_out: int = 0
    msgs_in: int = 0
    msgs_out: int = 0

    def add(self, other: Traffic) -> None:
        self.bytes_in += other.bytes_in
        self.bytes_out += other.bytes_out
        self.frames_in += other.frames_in
        self.frames_out += other.frames_out
        self.msgs_in += other.msgs_in
        self.msgs_out += other.msgs_out
