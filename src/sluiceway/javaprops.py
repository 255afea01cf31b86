"""Reading configuration files written in Java-properties syntax.

The broker's configuration uses Open Message Queue's property names in the syntax of
`java.util.Properties.load(Reader)`, so an Open MQ administrator's files carry over unchanged.
The syntax supported:

* Natural lines end with LF, CR or CR LF (no other character ends a line). White space means
  space, tab and form feed only.
* A natural line that is empty or white space only is blank; one whose first non-white-space
  character is ``#`` or ``!`` is a comment. Both are ignored, and a comment never continues.
* A logical line continues over the next natural line when it ends in an odd number of
  backslashes: the last backslash, the line terminator and the next line's leading white space
  are dropped. An even number (``\\\\``) is an escaped backslash and does not continue. A
  continuation line is never a comment, and an empty continuation line ends the logical line.
* The key runs from the first non-white-space character to the first unescaped ``=``, ``:`` or
  white space. White space, at most one ``=`` or ``:``, and more white space follow; the rest
  of the logical line, trailing white space included, is the value (``a==b`` has value ``=b``;
  ``a`` alone has the empty value).
* Escapes in keys and values: ``\\t``, ``\\n``, ``\\r``, ``\\f``; ``\\uXXXX`` with exactly four
  hexadecimal digits; a backslash before any other character stands for that character
  (``\\=``, ``\\:``, ``\\ ``, ``\\#``, ``\\\\``). Separators are found before escapes are
  decoded, so ``\\u003d`` in a key is an ``=`` that does not end the key.
* A ``\\uXXXX`` escape for a high surrogate followed by one for a low surrogate stands for a
  single character, as in a Java string; an unpaired surrogate escape is an error, because the
  resulting text could not be encoded for a client or a log.

Files are read as UTF-8, the encoding Java 9 and later use for properties resource bundles; a
leading byte-order mark is ignored.
"""

from __future__ import annotations

import codecs
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sluiceway.errors import ConfigError

__all__ = ["PropertyLine", "load_properties", "parse_properties", "to_dict"]

# Java's white space for this format; str.strip() without arguments would also remove
# vertical tab, NEL and the other Unicode spaces, which Java keeps as ordinary characters.
_WHITE_SPACE = " \t\f"

# Only these three terminators end a natural line; str.splitlines() would also split on
# \v, \x1c and U+2028, which are ordinary characters in a properties file.
_LINE_END = re.compile(r"\r\n|\r|\n")

# The key is a run of escapes and characters other than key terminators; then come white space,
# at most one separator and white space; the value is the rest. Every part can match the
# empty string, so the pattern matches any logical line.
_ENTRY = re.compile(r"(?P<key>(?:\\.|[^\\=: \t\f])*)[ \t\f]*[=:]?[ \t\f]*(?P<value>.*)", re.DOTALL)

# A surrogate pair written as two escapes comes first so that it decodes to one character.
_ESCAPE = re.compile(
    r"\\(?:u(?P<high>[dD][89abAB][0-9a-fA-F]{2})\\u(?P<low>[dD][c-fC-F][0-9a-fA-F]{2})"
    r"|u(?P<hex>[0-9a-fA-F]{4})|(?P<other>.))",
    re.DOTALL,
)
_SIMPLE_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


@dataclass(frozen=True, slots=True)
class PropertyLine:
    """One key/value pair, with the natural line (1-based) where its logical line starts."""

    key: str
    value: str
    line: int


def parse_properties(text: str, source: str = "<string>") -> list[PropertyLine]:
    """Parse properties text and return every pair in order, duplicates included.

    `source` names the text in error messages (usually the file's path). Raises `ConfigError`
    for a malformed ``\\u`` escape.
    """
    result: list[PropertyLine] = []
    for line, logical in _logical_lines(text):
        if not logical:
            # Only continuation backslashes, then an empty line or the end: Java reads nothing.
            continue
        entry = _ENTRY.fullmatch(logical)
        if entry is None:  # pragma: no cover - the pattern matches every string
            raise AssertionError(logical)
        where = f"{source}:{line}"
        key = _unescape(entry["key"], where, "key")
        value = _unescape(entry["value"], where, f"value of key '{key}'")
        result.append(PropertyLine(key=key, value=value, line=line))
    return result


def load_properties(path: str | os.PathLike[str]) -> list[PropertyLine]:
    """Read a UTF-8 properties file and parse it as `parse_properties` does.

    Raises `ConfigError` (named after the path) when the file cannot be read or is not UTF-8.
    """
    name = os.fspath(path)
    try:
        data = Path(name).read_bytes()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(
            name=name, message=f"cannot read the properties file {name}: {reason}"
        ) from exc
    return parse_properties(_decode_utf8(data, name), source=name)


def to_dict(lines: Iterable[PropertyLine]) -> dict[str, str]:
    """Map each key to its value; when a key occurs more than once the last one wins, as in Java."""
    return {entry.key: entry.value for entry in lines}


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """Yield (starting natural line number, logical line) with continuations joined.

    A yielded logical line is empty (a line holding only a backslash, then an empty line) or
    starts with a non-white-space character; it never ends in an unescaped backslash, because
    a continuation backslash is always removed.
    """
    parts: list[str] = []
    start = 0
    for number, natural in enumerate(_LINE_END.split(text), start=1):
        stripped = natural.lstrip(_WHITE_SPACE)
        if not parts:
            if not stripped or stripped[0] in "#!":
                continue
            start = number
        elif not stripped:
            # Java ends the logical line at an empty continuation line rather than skipping it.
            yield start, "".join(parts)
            parts = []
            continue
        backslashes = len(stripped) - len(stripped.rstrip("\\"))
        if backslashes % 2 == 1:
            parts.append(stripped[:-1])
            continue
        parts.append(stripped)
        yield start, "".join(parts)
        parts = []
    # A continuation backslash on the last line of the text simply ends the entry.
    if parts:
        yield start, "".join(parts)


def _unescape(raw: str, where: str, part: str) -> str:
    """Decode the escapes of a raw key or value; `where` is "source:line" for errors."""
    pieces: list[str] = []
    position = 0
    for match in _ESCAPE.finditer(raw):
        pieces.append(raw[position : match.start()])
        position = match.end()
        if match["high"] is not None:
            pieces.append(chr(_combine(int(match["high"], 16), int(match["low"], 16))))
        elif match["hex"] is not None:
            pieces.append(_code_unit(int(match["hex"], 16), match[0], where, part))
        elif match["other"] == "u":
            bad = raw[match.start() : match.start() + 6]
            raise ConfigError(
                name=where,
                message=(
                    f"{where}: malformed Unicode escape '{bad}' in the {part}: \\u must be "
                    "followed by exactly four hexadecimal digits (write a literal backslash "
                    "as \\\\)"
                ),
            )
        else:
            pieces.append(_SIMPLE_ESCAPES.get(match["other"], match["other"]))
    pieces.append(raw[position:])
    return "".join(pieces)


def _code_unit(unit: int, text: str, where: str, part: str) -> str:
    """Return the character for one \\uXXXX escape that is not half of a surrogate pair."""
    if 0xD800 <= unit <= 0xDFFF:
        raise ConfigError(
            name=where,
            message=(
                f"{where}: Unicode escape '{text}' in the {part} is half of a surrogate pair "
                "without its other half; write a character above U+FFFF as a high surrogate "
                "escape followed by a low one (e.g. \\uD83D\\uDE00), or as the UTF-8 character"
            ),
        )
    return chr(unit)


def _combine(high: int, low: int) -> int:
    """Return the code point that a UTF-16 surrogate pair encodes."""
    return 0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00)


def _decode_utf8(data: bytes, name: str) -> str:
    """Decode file contents as UTF-8 without a leading BOM, or say where they are not UTF-8."""
    skipped = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[skipped:].decode("utf-8")
    except UnicodeDecodeError as exc:
        offset = skipped + exc.start
        line = len(_LINE_END.findall(data[:offset].decode("utf-8", "replace"))) + 1
        raise ConfigError(
            name=name,
            message=(
                f"{name}: byte 0x{data[offset]:02x} at byte offset {offset} (line {line}) is "
                "not valid UTF-8; the properties file must be UTF-8 encoded (as Java 9 and "
                "later read properties resource bundles); re-save it as UTF-8, or write "
                "characters as \\uXXXX escapes"
            ),
        ) from exc
