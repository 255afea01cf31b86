"""STOMP 1.0, 1.1 and 1.2 frame decoding (and the encoder's names), free of any I/O.

The decoder is fed bytes as they arrive (`FrameDecoder.receive_data`) and hands back complete
events on request (`FrameDecoder.next_event`); the encoder (protocol.encoder, its names
imported here too) turns a `Frame` into the bytes to send.
Neither touches sockets, threads or an event loop, so the same code serves the broker, the client
and the tests. A server may ask for consecutive plain ACK frames as one `AckRun` event
(`ack_runs`): the commonest frames a consumer sends, read by a pattern match each instead of a
`Frame` each.

Wire format (STOMP 1.2, "STOMP Frames" and "Augmented BNF"):

    COMMAND EOL
    *( header-name ":" header-value EOL )
    EOL
    body NUL
    *( EOL )

* EOL is LF, optionally preceded by CR.
* The command is one or more upper-case ASCII letters. Whether the command is one the receiver
  understands is for the session to judge, not the codec.
* A header line is split at its first colon; everything after it, colons included, is the value.
  Names and values are UTF-8. When a name repeats only its first value counts ("Repeated Header
  Entries").
* Value encoding: STOMP 1.2 escapes CR, LF, colon and backslash in names and values as `\\r`,
  `\\n`, `\\c` and `\\\\`; STOMP 1.1 has the same escapes except `\\r`; STOMP 1.0 has no escapes.
  Any other backslash sequence is a fatal protocol error. CONNECT, STOMP and CONNECTED frames are
  never escaped, whatever the version, so that peers can read them before a version is agreed.
* With a `content-length` header the body is exactly that many octets (it may contain NUL) and
  must be followed by a NUL; without one the body runs up to the first NUL.
* An EOL received between frames is a heart-beat ("Heart-beating"); that includes the EOLs a peer
  may send after a frame's NUL.

Leniencies and choices:

* A CR before LF is accepted, and dropped, in every version, not only in STOMP 1.2: STOMP 1.0 and
  1.1 peers that end lines with CRLF would otherwise see every value end in CR. In return a value
  cannot end in CR in 1.0 and 1.1, so the encoder refuses to send a CR in those versions.
* A colon inside a value is accepted unescaped in every version, since the first colon of the
  line is the one that separates name and value. A CR that does not end a line, and a NUL, are
  kept as part of the name or value they appear in.
* Before the version is negotiated (`version=None`) the rules of STOMP 1.2 apply.

Limits (STOMP 1.2, "Size Limits", lets a server bound what it accepts). The decoder enforces the
frame size, the number of header lines and the length of each line, each as soon as the bytes
received prove it exceeded, so a peer can never make the decoder hold more than the limits allow.
The frame size limit may change between frames (a server admits only small frames until a
CONNECT is accepted); each limit's error names the property that sets it. A buffer that held a
large frame is given back once the frame is read, not kept for the next one.
"""

from __future__ import annotations

import re
from typing import Final

from sluiceway.errors import FrameLimitExceeded, RemoteProtocolError
from sluiceway.protocol.encoder import encode_frame, escape_value, header_lines
from sluiceway.protocol.frames import (
    HEARTBEAT,
    UNESCAPED_COMMANDS,
    AckRun,
    Frame,
    HeartBeat,
    StompVersion,
    quote,
)

# The encoder lives in protocol.encoder; importers of the codec find it here too.
__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "DEFAULT_MAX_HEADER_COUNT",
    "DEFAULT_MAX_HEADER_LENGTH",
    "FRAME_SIZE_PROPERTY",
    "HEARTBEAT_BYTES",
    "FrameDecoder",
    "encode_frame",
    "escape_value",
    "header_lines",
]

# A 70 MiB body (Open MQ's imq.message.max_size default) plus a 2 MiB header block.
DEFAULT_MAX_FRAME_SIZE: Final = 72 * 1024 * 1024
# Far more than the standard headers plus the properties real applications set on a message.
DEFAULT_MAX_HEADER_COUNT: Final = 256
# 8 KiB per line, so the header block is at most 256 x 8 KiB = 2 MiB.
DEFAULT_MAX_HEADER_LENGTH: Final = 8 * 1024

# A heart-beat is a single EOL; LF alone is valid in every version.
HEARTBEAT_BYTES: Final = b"\n"

FRAME_SIZE_PROPERTY: Final = "imq.stomp.max_frame_size"
_HEADER_COUNT: Final = "imq.stomp.max_header_count"
_HEADER_LENGTH: Final = "imq.stomp.max_header_length"

_LF: Final = 0x0A
_CR: Final = 0x0D
_NUL: Final = 0x00
_A: Final = 0x41  # the first byte of an ACK

# Once this many consumed bytes sit at the front of the buffer they are dropped; doing it per
# frame would copy the rest of the buffer once per frame.
_COMPACT_AT: Final = 64 * 1024
# A body of at least this many bytes, with a content-length, is kept as the chunks it arrives
# in and joined once when whole: one copy, where the buffer would take two (appending each
# chunk, then slicing the body out), and no copy of a growing buffer when it is reallocated.
_PART_BODY: Final = 64 * 1024

# Decoder states.
_IDLE: Final = 0  # between frames: EOLs are heart-beats, anything else starts a frame
_HEAD: Final = 1  # reading the command line and the header lines
_BODY: Final = 2  # reading the body up to its NUL

# A plain ACK frame whole, then any EOLs (heart-beats) after it; %d: the id's longest length.
# The id is printable ASCII without a backslash, so it holds no escape sequence.
_PLAIN_ACK: Final = rb"ACK\nid:([\x20-\x5b\x5d-\x7e]{1,%d})\n\n\0(?:\r?\n)*"

# Value decoding (STOMP 1.2 and 1.1, "Value Encoding"): the sequences each version defines.
_UNESCAPES_1_2: Final = {"r": "\r", "n": "\n", "c": ":", "\\": "\\"}
_UNESCAPES_1_1: Final = {"n": "\n", "c": ":", "\\": "\\"}
# A backslash and whatever follows it: one character, or nothing at the end of the text.
_ESCAPE_SEQUENCE: Final = re.compile(r"\\(.?)", re.DOTALL)


def _unescape(text: str, table: dict[str, str], command: str) -> str:
    """Decode the escape sequences of `text`; an undefined one is fatal (STOMP 1.2)."""

    def replace(match: re.Match[str]) -> str:
        decoded = table.get(match.group(1))
        if decoded is None:
            raise RemoteProtocolError(
                f"undefined escape sequence {match.group(0)!r} in header {quote(text)} of a "
                f"{command} frame; the escapes allowed here are "
                + ", ".join(repr("\\" + key) for key in table)
            )
        return decoded

    return _ESCAPE_SEQUENCE.sub(replace, text)


class FrameDecoder:
    """Turns a STOMP byte stream into `Frame` and `HeartBeat` events.

    Feed bytes with `receive_data`, then call `next_event` until it returns None. After a
    `RemoteProtocolError` the decoder is poisoned: every later `next_event` raises it again.
    `version` may be changed between events; it applies from the next frame on.
    """

    __slots__ = (
        "_acks",
        "_body_length",
        "_buf",
        "_command",
        "_error",
        "_frame_limit",
        "_frame_start",
        "_header_count",
        "_headers",
        "_max_frame_size",
        "_max_header_count",
        "_max_header_length",
        "_parts",
        "_parts_size",
        "_pos",
        "_scan",
        "_state",
        "_unescapes",
        "ack_runs",
        "version",
    )

    def __init__(
        self,
        *,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_header_count: int = DEFAULT_MAX_HEADER_COUNT,
        max_header_length: int = DEFAULT_MAX_HEADER_LENGTH,
        version: StompVersion | None = None,
        frame_limit: str = FRAME_SIZE_PROPERTY,
    ) -> None:
        self._max_frame_size = max_frame_size
        self._frame_limit = frame_limit  # the property setting max_frame_size, for errors
        self._max_header_count = max_header_count
        self._max_header_length = max_header_length
        self.version = version
        self._buf = bytearray()
        self._pos = 0  # first byte not yet parsed
        self._scan = 0  # where the search for the next LF or NUL resumes
        self._state = _IDLE
        self._frame_start = 0  # first byte of the frame being read
        self._command: str | None = None
        self._headers: dict[str, str] = {}
        self._header_count = 0
        self._unescapes: dict[str, str] | None = None
        self._body_length: int | None = None
        self._parts: list[bytes] = []  # a large body's chunks, as received (see _PART_BODY)
        self._parts_size = 0
        self._error: RemoteProtocolError | None = None
        self._acks: re.Pattern[bytes] | None = None
        self._compile_acks()
        self.ack_runs = False  # hand back a run of plain ACK frames as one AckRun

    def _compile_acks(self) -> None:
        """A plain STOMP 1.2 ACK whole: its id within the header line and frame size limits."""
        longest = min(
            self._max_header_length - len("id:"), self._max_frame_size - len(b"ACK\nid:\n\n\0")
        )
        pattern = None
        if longest > 0 and self._max_header_count > 0:
            pattern = re.compile(_PLAIN_ACK % longest)
        self._acks = pattern

    def limit_frames(self, max_frame_size: int, limit: str = FRAME_SIZE_PROPERTY) -> None:
        """Accept frames of at most `max_frame_size` bytes from the next frame on; `limit` is
        the property that sets it, named by the error a larger frame gets."""
        self._max_frame_size = max_frame_size
        self._frame_limit = limit
        self._compile_acks()

    @property
    def buffered(self) -> int:
        """Bytes received and not yet turned into events (a partial frame counts whole)."""
        start = self._pos if self._state == _IDLE else self._frame_start
        return len(self._buf) - start + self._parts_size

    def release(self) -> None:
        """Drop every byte held, for good: the stream is not parsed again (its connection is
        closing). The buffer is replaced, not cleared, so the memory a large frame took is
        freed now."""
        self._buf = bytearray()
        self._pos = self._scan = self._frame_start = 0
        self._parts = []
        self._parts_size = 0
        self._state = _IDLE
        self._headers = {}
        if self._error is None:
            self._error = RemoteProtocolError("the stream was released: nothing more is parsed")

    def receive_data(self, data: bytes) -> None:
        """Buffer `data` for later parsing. Never parses and never raises."""
        if self._error is not None or not data:
            return  # a poisoned stream is never parsed again, so its bytes need not be kept
        if self._parts:
            self._parts.append(data)
            self._parts_size += len(data)
            return
        buf = self._buf
        keep = self._pos if self._state == _IDLE else self._frame_start
        if keep == len(buf):
            buf.clear()
            self._pos = self._scan = self._frame_start = 0
        elif keep >= _COMPACT_AT:
            del buf[:keep]
            self._pos -= keep
            self._scan -= keep
            self._frame_start -= keep
        buf += data

    def next_event(self) -> Frame | HeartBeat | AckRun | None:
        """The next complete frame or heart-beat, or None when more bytes are needed."""
        if self._error is not None:
            raise self._error.with_traceback(None)
        try:
            if self._state == _IDLE:
                return self._read_idle()
            if self._state == _HEAD:
                return self._read_head()
            return self._read_body()
        except RemoteProtocolError as exc:
            self._error = exc
            raise

    def _read_idle(self) -> Frame | HeartBeat | AckRun | None:
        """Between frames: an EOL is a heart-beat, any other byte starts a frame."""
        buf = self._buf
        pos = self._pos
        if pos >= len(buf):
            return None
        first = buf[pos]
        if first == _LF:
            self._pos = pos + 1
            return HEARTBEAT
        if first == _CR:
            if pos + 1 == len(buf):
                return None  # CR alone: wait to see whether LF follows
            if buf[pos + 1] == _LF:
                self._pos = pos + 2
                return HEARTBEAT
        whole: Frame | AckRun | None = None
        if first == _A and self.ack_runs:
            whole = self._read_acks(pos)
        if whole is None:
            whole = self._read_whole(pos)
        if whole is not None:
            return whole
        self._state = _HEAD
        self._frame_start = self._scan = pos
        self._command = None
        self._headers = {}
        self._header_count = 0
        return self._read_head()

    def _read_acks(self, pos: int) -> AckRun | None:
        """The plain ACK frames from `pos` on, each whole and within every limit, or None when
        the frame at `pos` is not one (it takes the general way)."""
        pattern = self._acks
        if pattern is None:
            return None
        buf = self._buf
        ids = []
        while (found := pattern.match(buf, pos)) is not None:
            ids.append(found.group(1).decode("ascii"))
            pos = found.end()
        if not ids:
            return None
        self._pos = pos
        return AckRun(ids)

    def _read_whole(self, pos: int) -> Frame | None:
        """The frame starting at `pos` in one step, when it has arrived whole and is plain: LF
        line ends, no backslash, within every limit. None sends it (and any error it holds) the
        line-by-line way, which reports exactly what is wrong."""
        buf = self._buf
        blank = buf.find(b"\n\n", pos, pos + self._max_frame_size)
        if blank < 0:
            return None
        head = self._plain_head(buf[pos:blank])
        if head is None:
            return None
        command, headers = head
        start = blank + 2
        limit = pos + self._max_frame_size
        raw_length = headers.get("content-length")
        if raw_length is None:
            end = buf.find(b"\0", start, limit)
        elif raw_length.isascii() and raw_length.isdigit() and len(raw_length) <= 12:
            end = start + int(raw_length)
            if end >= min(len(buf), limit) or buf[end] != _NUL:
                end = -1
        else:
            end = -1
        if end < 0:
            return None
        if end - start < _PART_BODY:
            body = bytes(buf[start:end])  # two copies, but cheaper than a view's objects
        else:
            with memoryview(buf) as view:
                body = view[start:end].tobytes()  # one copy of a large body
        frame = Frame(command, headers, body)
        self._pos = end + 1
        self._give_back()
        return frame

    def _plain_head(self, head: bytearray) -> tuple[str, dict[str, str]] | None:
        """Command and headers of a head needing no unescaping and within the limits."""
        try:
            text = head.decode()
        except UnicodeDecodeError:
            return None
        # Searched in the text: `bytes in bytearray` first tries the bytes as an integer, and
        # the TypeError it formats and drops costs more than the search.
        if "\r" in text or "\\" in text:
            return None
        longest = self._max_header_length
        if len(head) > longest and max(map(len, head.split(b"\n"))) > longest:
            return None
        command, *lines = text.split("\n")
        if len(lines) > self._max_header_count or not (
            command.isascii() and command.isalpha() and command.isupper()
        ):
            return None
        headers: dict[str, str] = {}
        for line in lines:
            name, colon, value = line.partition(":")
            if not (colon and name):
                return None
            if name not in headers:  # STOMP 1.2, "Repeated Header Entries": the first counts
                headers[name] = value
        return command, headers

    def _read_head(self) -> Frame | None:
        """Parse the command line and header lines, as far as the buffered lines go."""
        buf = self._buf
        pos = self._pos
        scan = self._scan
        max_line = self._max_header_length
        # A LF at or past this index may prove the frame too large: after it come at least a NUL
        # and, unless it ends the blank line, the blank line's LF.
        too_far = self._frame_start + self._max_frame_size - 2
        while True:
            # A line within the limit has its LF at most max_line + 1 bytes after its start (room
            # for a CR), so the search never looks further than the limit allows.
            lf = buf.find(b"\n", scan, pos + max_line + 2)
            if lf < 0:
                self._pos = pos
                self._scan = len(buf)  # the bytes searched so far hold no LF
                self._check_partial_line()
                return None
            end = lf - 1 if lf > pos and buf[lf - 1] == _CR else lf
            if end - pos > max_line or lf >= too_far:
                self._check_line(pos, end, lf)
            if end == pos and self._command is not None:
                self._pos = self._scan = lf + 1
                return self._end_head()
            if self._command is None:
                self._set_command(buf[pos:end])
            else:
                self._add_header(buf[pos:end])
            pos = scan = lf + 1

    def _check_line(self, start: int, end: int, lf: int) -> None:
        """Enforce the line length and frame size limits on a complete line."""
        if end - start > self._max_header_length:
            self._raise_line_length(start)
        # The frame holds the bytes up to this LF, then at least a NUL, and a blank line first
        # unless this line is the blank one.
        blank = start == end and self._command is not None
        least = lf + (2 if blank else 3) - self._frame_start
        if least > self._max_frame_size:
            self._raise_frame_size(least, exact=False)

    def _check_partial_line(self) -> None:
        """Enforce every limit on the line still waiting for its EOL."""
        buf = self._buf
        length = len(buf) - self._pos
        if length and buf[-1] == _CR:
            length -= 1  # may be the CR of a CRLF, which the line length excludes
        if length > self._max_header_length:
            self._raise_line_length(self._pos)
        if length and self._command is not None:
            self._check_header_count()  # a non-empty line here can only be one more header
        # Everything buffered belongs to this frame, which still needs at least a NUL and the
        # LF of the blank line, plus this line's LF if the line is not the blank one.
        least = len(buf) - self._frame_start + (3 if length else 2)
        if least > self._max_frame_size:
            self._raise_frame_size(least, exact=False)

    def _raise_line_length(self, start: int) -> None:
        """Refuse the line starting at `start`, giving its length if its EOL has arrived."""
        buf = self._buf
        lf = buf.find(b"\n", start)  # the search for the LF stopped at the limit; look further
        if lf < 0:
            length = len(buf) - start - (1 if buf[-1] == _CR else 0)
            amount = f"more than {self._max_header_length} bytes ({length} received so far)"
        else:
            end = lf - 1 if lf > start and buf[lf - 1] == _CR else lf
            amount = f"{end - start} bytes"
        what = "command" if self._command is None else "header"
        raise FrameLimitExceeded(
            f"{what} line of {amount} exceeds the limit of {self._max_header_length} bytes "
            f"({_HEADER_LENGTH})",
            limit=_HEADER_LENGTH,
            value=self._max_header_length,
        )

    def _check_header_count(self) -> None:
        if self._header_count >= self._max_header_count:
            raise FrameLimitExceeded(
                f"{self._command} frame with more than {self._max_header_count} header lines "
                f"exceeds the limit of {self._max_header_count} ({_HEADER_COUNT})",
                limit=_HEADER_COUNT,
                value=self._max_header_count,
            )

    def _raise_frame_size(self, size: int, *, exact: bool) -> None:
        amount = f"{size} bytes" if exact else f"at least {size} bytes"
        raise FrameLimitExceeded(
            f"frame of {amount} exceeds the limit of {self._max_frame_size} bytes "
            f"({self._frame_limit})",
            limit=self._frame_limit,
            value=self._max_frame_size,
        )

    def _set_command(self, line: bytearray) -> None:
        """Check the command line and choose the value decoding its frame uses."""
        # STOMP 1.2, "Augmented BNF", lists upper-case commands only. Any upper-case word passes
        # here: whether the command is one this side understands is for the session to say.
        if not (line.isalpha() and line.isupper()):
            raise RemoteProtocolError(
                f"malformed command line {quote(line)}: a STOMP command is one or more "
                "upper-case letters A-Z"
            )
        command = line.decode("ascii")
        self._command = command
        version = self.version
        if command in UNESCAPED_COMMANDS or version is StompVersion.V1_0:
            self._unescapes = None
        elif version is StompVersion.V1_1:
            self._unescapes = _UNESCAPES_1_1
        else:
            self._unescapes = _UNESCAPES_1_2

    def _add_header(self, line: bytearray) -> None:
        """Parse one `name:value` line into the current frame's headers."""
        if self._header_count >= self._max_header_count:
            self._check_header_count()
        self._header_count += 1
        try:
            text = line.decode()
        except UnicodeDecodeError:
            raise self._bad_header(line, "is not valid UTF-8") from None
        # The first colon separates name and value; later ones belong to the value.
        name, colon, value = text.partition(":")
        if not (colon and name):
            raise self._bad_header(line, "has an empty name" if colon else "has no colon")
        table = self._unescapes
        if table is not None and "\\" in text:
            name = _unescape(name, table, self._command or "")
            value = _unescape(value, table, self._command or "")
        # STOMP 1.2, "Repeated Header Entries": only the first value counts.
        self._headers.setdefault(name, value)

    def _bad_header(self, line: bytearray, problem: str) -> RemoteProtocolError:
        return RemoteProtocolError(
            f"header line {quote(line)} of a {self._command} frame {problem}; "
            "a header line is name:value, in UTF-8"
        )

    def _end_head(self) -> Frame | None:
        """After the blank line: work out how the body ends, then read it."""
        raw_length = self._headers.get("content-length")
        if raw_length is None:
            self._body_length = None
        else:
            length = self._parse_content_length(raw_length)
            size = self._pos - self._frame_start + length + 1
            if size > self._max_frame_size:
                self._raise_frame_size(size, exact=True)
            self._body_length = length
        self._state = _BODY
        return self._read_body()

    def _parse_content_length(self, raw: str) -> int:
        # STOMP 1.2, "Header content-length": the octet count of the body, in decimal.
        if not (raw.isascii() and raw.isdigit()):
            raise RemoteProtocolError(
                f"content-length {quote(raw)} of a {self._command} frame is not a "
                "non-negative decimal integer"
            )
        digits = raw.lstrip("0") or "0"
        if len(digits) > len(str(self._max_frame_size)):
            # Too long to be within the limit; also keeps int() away from huge digit strings.
            raise FrameLimitExceeded(
                f"frame with a content-length of {len(digits)} digits exceeds the limit of "
                f"{self._max_frame_size} bytes ({self._frame_limit})",
                limit=self._frame_limit,
                value=self._max_frame_size,
            )
        return int(digits)

    def _read_body(self) -> Frame | None:
        """Read the body and its terminating NUL, once they have all arrived."""
        buf = self._buf
        start = self._pos
        length = self._body_length
        if length is None:
            # No content-length: the body ends at the first NUL, which must fall within the limit.
            limit = self._frame_start + self._max_frame_size
            nul = buf.find(b"\0", self._scan, limit)
            if nul < 0:
                if len(buf) >= limit:
                    self._raise_frame_size(self._max_frame_size + 1, exact=False)
                self._scan = len(buf)  # never search the same bytes twice
                return None
            end = nul
        else:
            end = start + length
            if self._parts:
                return self._read_parts(length)
            if len(buf) <= end:
                if length >= _PART_BODY:
                    # The rest of the body is kept as it arrives (receive_data), from the part
                    # already here.
                    self._parts.append(bytes(buf[start:]))
                    self._parts_size = len(buf) - start
                    del buf[start:]
                return None
            if buf[end] != _NUL:
                raise self._no_nul(length, buf[end : end + 1])
        with memoryview(buf) as view:
            body = view[start:end].tobytes()
        self._pos = end + 1
        self._state = _IDLE
        self._give_back()
        return Frame(self._command or "", self._headers, body)

    def _no_nul(self, length: int, found: bytes | bytearray) -> RemoteProtocolError:
        return RemoteProtocolError(
            f"{self._command} frame body longer than its content-length of {length} "
            f"bytes: byte {quote(found)} follows the body instead of NUL"
        )

    def _read_parts(self, length: int) -> Frame | None:
        """A large body kept as received chunks: once it and its NUL are all here, join it (one
        copy), and keep what follows in the chunk that ends it as the buffer's new start."""
        if self._parts_size <= length:
            return None
        parts = self._parts
        remaining = length + 1  # the body and its NUL
        index = 0
        while len(parts[index]) < remaining:
            remaining -= len(parts[index])
            index += 1
        last = parts[index]
        if last[remaining - 1] != _NUL:
            raise self._no_nul(length, last[remaining - 1 : remaining])
        pieces: list[bytes | memoryview] = list(parts[:index])
        pieces.append(memoryview(last)[: remaining - 1])
        body = b"".join(pieces)
        rest = bytearray(memoryview(last)[remaining:])
        for part in parts[index + 1 :]:
            rest += part
        self._parts = []
        self._parts_size = 0
        self._buf = rest
        self._pos = self._scan = self._frame_start = 0
        self._state = _IDLE
        return Frame(self._command or "", self._headers, body)

    def _give_back(self) -> None:
        """After a frame: when the buffer grew large and nothing follows the frame, replace it,
        so its memory is freed now, not when the next bytes arrive (an idle connection would
        keep it). Small buffers are reused."""
        if self._pos > _COMPACT_AT and self._pos == len(self._buf):
            self._buf = bytearray()
            self._pos = self._scan = self._frame_start = 0
