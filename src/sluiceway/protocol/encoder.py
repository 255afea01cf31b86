"""STOMP 1.0, 1.1 and 1.2 frame encoding, free of any I/O: a `Frame` in, the bytes to send out.

The wire format, the escapes of each version and the leniencies are written out in the
docstring of protocol.codec, whose decoder reads what this writes. Lines end in LF alone;
names and values that a version cannot carry are refused (LocalProtocolError, naming the
header), never sent mangled.
"""

from __future__ import annotations

from typing import Final

from sluiceway.errors import LocalProtocolError
from sluiceway.protocol.frames import UNESCAPED_COMMANDS, Frame, StompVersion, quote

# Value encoding (STOMP 1.2 and 1.1, "Value Encoding"): every character that needs an escape.
_SPECIAL: Final = ("\\", "\n", "\r", ":")


# Backslashes are escaped first, so that those the other escapes add are not doubled again.
def _escape_1_2(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\r", "\\r").replace("\n", "\\n").replace(":", "\\c")


def _escape_1_1(text: str) -> str:
    # STOMP 1.1 has no escape for CR; _escaped_lines refuses a CR before this is called.
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace(":", "\\c")


def _has_special(text: str, specials: tuple[str, ...]) -> bool:
    # A plain loop: a generator passed to any() costs more than the searches themselves.
    for char in specials:  # noqa: SIM110  (a loop: any() over a generator costs more)
        if char in text:
            return True
    return False


def _refuse(command: str, name: str, part: str, what: str, where: str) -> LocalProtocolError:
    return LocalProtocolError(
        f"header {quote(name)} of a {command} frame cannot be sent: its {part} contains "
        f"{what}, which {where} cannot carry"
    )


def _escaped_lines(command: str, headers: dict[str, str], version: StompVersion | None) -> str:
    """The header lines of a 1.1 or 1.2 frame whose names or values need escapes."""
    escape = _escape_1_2
    if version is StompVersion.V1_1:
        escape = _escape_1_1
        for name, value in headers.items():
            if "\r" in name or "\r" in value:
                part = "name" if "\r" in name else "value"
                raise _refuse(command, name, part, "a carriage return", "STOMP 1.1")
    # Escape every name and value in one pass: NUL stands for the end of a line and SOH for the
    # colon, since escaping leaves both alone. Only when no name or value holds either of them.
    text = "\0".join(map("\1".join, headers.items()))
    if text.count("\0") == len(headers) - 1 and text.count("\1") == len(headers):
        return escape(text).replace("\1", ":").replace("\0", "\n") + "\n"
    return "".join(f"{escape(name)}:{escape(value)}\n" for name, value in headers.items())


def _check_raw(command: str, headers: dict[str, str], version: StompVersion | None) -> None:
    """Refuse names and values that an unescaped frame cannot carry."""
    where = "STOMP 1.0" if version is StompVersion.V1_0 else f"an unescaped {command} frame"
    for name, value in headers.items():
        for char, label in (("\n", "a line feed"), ("\r", "a carriage return")):
            if char in name:
                raise _refuse(command, name, "name", label, where)
            if char in value:
                raise _refuse(command, name, "value", label, where)
        if ":" in name:
            raise _refuse(command, name, "name", "a colon", where)


def header_lines(command: str, headers: dict[str, str], version: StompVersion | None) -> str:
    """All header lines of a frame, each ending in LF, escaped as `version` requires (also
    for callers that assemble a frame from parts encoded once and reused)."""
    if not headers:
        return ""
    names = "".join(headers)
    values = "".join(headers.values())
    if command in UNESCAPED_COMMANDS or version is StompVersion.V1_0:
        if _has_special(names, ("\n", "\r", ":")) or _has_special(values, ("\n", "\r")):
            _check_raw(command, headers, version)
    elif _has_special(names, _SPECIAL) or _has_special(values, _SPECIAL):
        return _escaped_lines(command, headers, version)
    return "\n".join(map(":".join, headers.items())) + "\n"


def escape_value(text: str) -> str:
    """`text` escaped as a STOMP 1.2 header name or value (of a frame that is escaped)."""
    return _escape_1_2(text) if _has_special(text, _SPECIAL) else text


def _content_length_line(frame: Frame) -> str:
    """The content-length line to add, if any; refuse a declared length that is wrong."""
    body_length = len(frame.body)
    declared = frame.headers.get("content-length")
    if declared is None:
        # Without content-length a body that contains NUL would end early on the receiving side.
        return f"content-length:{body_length}\n" if body_length else ""
    if not (declared.isascii() and declared.isdigit()) or int(declared) != body_length:
        raise LocalProtocolError(
            f"{frame.command} frame declares content-length {quote(declared)} but its body "
            f"has {body_length} bytes"
        )
    return ""


def encode_frame(frame: Frame, version: StompVersion | None = None) -> bytes:
    """The wire bytes of `frame` for a peer speaking `version` (None: STOMP 1.2).

    Lines end in LF alone. A non-empty body without a content-length header gets one, as the
    last header. Raises LocalProtocolError for anything `version` cannot carry.
    """
    command = frame.command
    if not (command.isascii() and command.isalpha() and command.isupper()):
        raise LocalProtocolError(
            f"cannot send command {quote(command)}: a STOMP command is one or more upper-case "
            "letters A-Z"
        )
    head = f"{command}\n{header_lines(command, frame.headers, version)}"
    head += _content_length_line(frame) + "\n"
    try:
        encoded = head.encode()
    except UnicodeEncodeError:
        raise _unencodable(frame) from None
    return b"".join((encoded, frame.body, b"\0"))


def _unencodable(frame: Frame) -> LocalProtocolError:
    """The error for a frame whose header names or values have no UTF-8 form (lone surrogates)."""
    for name, value in frame.headers.items():
        for part, text in (("name", name), ("value", value)):
            try:
                text.encode()
            except UnicodeEncodeError as exc:
                bad = text[exc.start : exc.end]
                return _refuse(frame.command, name, part, repr(bad), "UTF-8")
    return LocalProtocolError(f"{frame.command} frame cannot be encoded as UTF-8")
