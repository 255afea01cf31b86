"""The input budget: bytes of frames being received, bounded per connection and for the broker.

A frame is held in memory until its last byte (its NUL) has arrived; without a bound, clients
that stall inside large frames would hold up to `imq.stomp.max_frame_size` each. So:

- before a CONNECT is accepted, a frame may have at most `imq.stomp.connect.max_frame_size`
  bytes (8 KiB: a CONNECT carries headers only), enforced by the decoder as the bytes arrive;
- one connection may hold at most `imq.stomp.input.max_bytes` of input (the frame being read,
  and frames received but not yet handled; over WebSocket, also the message the transport is
  still assembling); it bounds the largest frame too, so the decoder refuses a frame whose
  content-length announces more as soon as its headers arrive;
- all connections together at most `imq.stomp.input.total.max_bytes`, a share of
  `imq.memory.budget` by default. What they hold is charged to the memory ledger as it arrives
  (`MemoryLedger.input`), so the memory levels see a large body before it is complete; the
  charge is given back when the frame is complete (it is then counted as a message) or the
  connection closes.

Past a limit, the connection gets an ERROR naming the limit and its property, and is closed (the
I/O layer makes sure the client can read the ERROR before the close).
"""

from __future__ import annotations

from typing import Final

from sluiceway.config import BrokerConfig
from sluiceway.core.values.memory import MemoryLedger
from sluiceway.errors import (
    BadRequest,
    BrokerError,
    EntityTooLarge,
    FrameLimitExceeded,
    ResourceFull,
)
from sluiceway.protocol.codec import FRAME_SIZE_PROPERTY

CONNECT_FRAME_SIZE: Final = "imq.stomp.connect.max_frame_size"
INPUT_MAX: Final = "imq.stomp.input.max_bytes"
INPUT_TOTAL_MAX: Final = "imq.stomp.input.total.max_bytes"
# What a transport's own framing adds to a frame before CONNECT: a WebSocket message's header
# (at most 14 bytes) and the EOLs a client may send after the frame's NUL.
FRAMING_SLACK: Final = 1024


def connect_frame_limit(config: BrokerConfig) -> tuple[int, str]:
    """The largest frame before CONNECT, and the property that sets it: the smaller of
    imq.stomp.connect.max_frame_size and imq.stomp.max_frame_size."""
    if config.connect_max_frame_size < config.max_frame_size:
        return config.connect_max_frame_size, CONNECT_FRAME_SIZE
    return config.max_frame_size, FRAME_SIZE_PROPERTY


def frame_limit(config: BrokerConfig) -> tuple[int, str]:
    """The largest frame after CONNECT, and the property that sets it: a frame is held whole
    until it is complete, so imq.stomp.input.max_bytes bounds it too (and a frame that announces
    more in its content-length is refused as soon as its headers arrive)."""
    if 0 < config.input_max_bytes < config.max_frame_size:
        return config.input_max_bytes, INPUT_MAX
    return config.max_frame_size, FRAME_SIZE_PROPERTY


def frame_limit_error(exc: FrameLimitExceeded) -> BrokerError:
    """The ERROR for a frame the decoder refused: it names the limit and its property."""
    limit, value = exc.limit, str(exc.value)
    if limit == CONNECT_FRAME_SIZE:
        return EntityTooLarge(
            f"frame too large before CONNECT ({CONNECT_FRAME_SIZE})",
            f"{exc}: until a CONNECT is accepted a frame may have at most {value} bytes, since "
            f"a CONNECT carries headers only; send CONNECT first, or raise {CONNECT_FRAME_SIZE}",
            limit=limit,
            limit_value=value,
        )
    if limit == INPUT_MAX:
        return EntityTooLarge(
            f"connection input limit exceeded ({INPUT_MAX})",
            f"{exc}: a connection may hold at most {value} bytes of frames being received; "
            f"send smaller frames, or raise {INPUT_MAX}",
            limit=limit,
            limit_value=value,
        )
    cls = EntityTooLarge if limit == FRAME_SIZE_PROPERTY else BadRequest
    return cls("frame limit exceeded", str(exc), limit=limit, limit_value=value)


def connect_message_error(held: int, limit: int, name: str) -> BrokerError:
    """The ERROR for a message a transport is still assembling before CONNECT that is already
    larger than any frame before CONNECT may be (a WebSocket message)."""
    return EntityTooLarge(
        f"frame too large before CONNECT ({name})",
        f"a message of at least {held} bytes arrived before a CONNECT was accepted; until then "
        f"a frame may have at most {limit} bytes, since a CONNECT carries headers only; send "
        f"CONNECT first, or raise {name}",
        limit=name,
        limit_value=str(limit),
    )


class InputBudget:
    """What one connection holds of frames being received, charged to the memory ledger: what
    its session holds, and what its transport holds of a message not handed over yet (`below`:
    a WebSocket message being assembled)."""

    __slots__ = ("_allowance", "_config", "_ledger", "below", "held", "max_bytes")

    def __init__(self, ledger: MemoryLedger, config: BrokerConfig) -> None:
        self._ledger = ledger
        self._config = config
        self.max_bytes = config.input_max_bytes  # 0: no limit of its own
        self.held = 0  # bytes charged to the ledger for this connection
        self.below = 0
        self._allowance = 0  # what `below` may reach once the connection is ending

    def check(self, session_held: int, *, connected: bool) -> BrokerError | None:
        """Charge what the connection holds now (`session_held` and `below`); past a limit, the
        error that ends it. Before CONNECT, a message the transport still assembles may be no
        larger than a frame then may be (the decoder sees the session's part)."""
        if not connected:
            limit, name = connect_frame_limit(self._config)
            if self.below > limit + FRAMING_SLACK:
                return connect_message_error(self.below, limit, name)
        return self.charge(session_held + self.below)

    def most(self, *, connected: bool) -> int:
        """The most a connection may hold: a frame before CONNECT, else its budget (or, without
        one, a frame)."""
        if not connected:
            return connect_frame_limit(self._config)[0] + FRAMING_SLACK
        return self.max_bytes or self._config.max_frame_size

    def end(self, *, connected: bool) -> None:
        """The connection is ending (its ERROR is written): give the charge back, and let the
        client finish what it was sending, up to once more the most it may hold."""
        self.release()
        self._allowance = self.below + self.most(connected=connected)

    @property
    def past_allowance(self) -> bool:
        """Ending, the transport holds more than the client may still send."""
        return self.below > self._allowance

    def charge(self, held: int) -> BrokerError | None:
        """The connection now holds `held` bytes: charge the change. When it grew past its own
        limit, or took the broker past its total, the error that ends the connection (the
        charge stays until `release`)."""
        ledger = self._ledger
        grew = held - self.held
        ledger.input += grew
        self.held = held
        if grew <= 0:
            return None
        if 0 < self.max_bytes < held:
            return EntityTooLarge(
                f"connection input limit exceeded ({INPUT_MAX})",
                f"this connection holds {held} bytes of frames being received, more than "
                f"{INPUT_MAX} allows ({self.max_bytes} bytes); send smaller frames, or raise "
                f"{INPUT_MAX}",
                limit=INPUT_MAX,
                limit_value=str(self.max_bytes),
            )
        total = ledger.policy.input_max
        if 0 < total < ledger.input:
            return ResourceFull(
                f"broker input limit exceeded ({INPUT_TOTAL_MAX})",
                f"all connections together hold {ledger.input} bytes of frames being received, "
                f"more than {INPUT_TOTAL_MAX} allows ({total} bytes), and this connection's "
                f"{held} bytes took it past; send again later, or raise {INPUT_TOTAL_MAX} (by "
                "default a quarter of imq.memory.budget)",
                limit=INPUT_TOTAL_MAX,
                limit_value=str(total),
            )
        return None

    def release(self) -> None:
        """The connection holds nothing any more (it is closing): give its charge back."""
        self._ledger.input -= self.held
        self.held = 0
