"""Tests for the Java-properties reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluiceway.errors import ConfigError
from sluiceway.javaprops import PropertyLine, load_properties, parse_properties, to_dict

Pairs = list[tuple[str, str]]

# (text, expected pairs in order). Raw strings hold the backslashes a file would contain.
CASES: dict[str, tuple[str, Pairs]] = {
    # Separators and their combinations.
    "equals": ("a=b", [("a", "b")]),
    "colon": ("a:b", [("a", "b")]),
    "space": ("a b", [("a", "b")]),
    "tab": ("a\tb", [("a", "b")]),
    "form feed": ("a\fb", [("a", "b")]),
    "spaced equals": ("a = b", [("a", "b")]),
    "spaced colon": ("a\t:\tb", [("a", "b")]),
    "several spaces": ("a    b", [("a", "b")]),
    "empty value after equals": ("a=", [("a", "")]),
    "empty value after spaced colon": ("a : ", [("a", "")]),
    "key alone": ("a", [("a", "")]),
    "key alone with trailing space": ("a   ", [("a", "")]),
    "double equals": ("a==b", [("a", "=b")]),
    "colon then equals": ("a:=b", [("a", "=b")]),
    "spaced double equals": ("a = = b", [("a", "= b")]),
    "space then words": ("a b c", [("a", "b c")]),
    "equals inside value": ("a=b=c:d", [("a", "b=c:d")]),
    "empty key": ("=b", [("", "b")]),
    "empty key with colon": (":b", [("", "b")]),
    "leading white space": (" \t\fa=b", [("a", "b")]),
    "open mq name": ("imq.system.max_count=5000", [("imq.system.max_count", "5000")]),
    # Escaped separators in keys.
    "escaped equals in key": (r"a\=b=c", [("a=b", "c")]),
    "escaped colon in key": (r"a\:b:c", [("a:b", "c")]),
    "escaped space in key": (r"a\ b c", [("a b", "c")]),
    "escaped separators only": (r"\:\= x", [(":=", "x")]),
    "escaped backslash ends before equals": (r"a\\=b", [("a\\", "b")]),
    "unicode equals is not a separator": (r"a\u003db=c", [("a=b", "c")]),
    # Escapes in values.
    "control escapes": (r"a=\t\n\r\f", [("a", "\t\n\r\f")]),
    "escaped backslash": (r"a=\\", [("a", "\\")]),
    "other escapes stand for themselves": (r"a=\#\!\=\:\ \q", [("a", "#!=: q")]),
    "escaped leading space kept": (r"a=\  b", [("a", "  b")]),
    "unicode escapes": (r"a=\u0041\u00e9\u00E9", [("a", "Aéé")]),
    "unicode escape in key": (r"\u0041=b", [("A", "b")]),
    "surrogate pair escapes": (r"a=\uD83D\uDE00!", [("a", "\U0001f600!")]),
    "raw non-ascii": ("clé=valeur €", [("clé", "valeur €")]),
    "trailing white space kept": ("a=b  \t\f", [("a", "b  \t\f")]),
    "hash inside value": ("a=b # not a comment", [("a", "b # not a comment")]),
    "value starting with hash": ("a=#b", [("a", "#b")]),
    # Continuation lines.
    "continuation": ("a=b\\\nc", [("a", "bc")]),
    "continuation drops leading white space": ("a=b\\\n \t\f c", [("a", "bc")]),
    "continuation keeps white space before backslash": ("a=b \\\n   c", [("a", "b c")]),
    "three continuations": ("a=1\\\n 2\\\n 3\\\n 4", [("a", "1234")]),
    "even backslashes do not continue": ("a=b\\\\\nc=d", [("a", "b\\"), ("c", "d")]),
    "three backslashes continue": ("a=b\\\\\\\nc", [("a", "b\\c")]),
    "four backslashes do not continue": ("a=\\\\\\\\\nc", [("a", "\\\\"), ("c", "")]),
    "continuation at end of file": ("a=b\\", [("a", "b")]),
    "continuation before final newline": ("a=b\\\n", [("a", "b")]),
    "empty continuation line ends the entry": ("a=b\\\n\nc=d", [("a", "b"), ("c", "d")]),
    "blank continuation line ends the entry": ("a=b\\\n  \nc=d", [("a", "b"), ("c", "d")]),
    "continuation line is not a comment": ("a=b\\\n  #c", [("a", "b#c")]),
    "continuation inside key": ("ke\\\n  y=v", [("key", "v")]),
    "continuation between key and value": ("a\\\n  =b", [("a", "b")]),
    "lone backslash then empty line": ("\\\n\nc=d", [("c", "d")]),
    "lone backslash at end of file": ("  \\", []),
    "lone backslash then hash line": ("\\\n  #x=1", [("#x", "1")]),
    "continuation splits an escape": ("a=\\u00\\\n  41", [("a", "A")]),
    "continuation with crlf": ("a=b\\\r\n  c", [("a", "bc")]),
    "continuation with cr": ("a=b\\\r  c", [("a", "bc")]),
    # Comments and blank lines.
    "hash comment": ("#a=b", []),
    "bang comment": ("!a=b", []),
    "indented comment": ("   # a=b\n\t! c=d", []),
    "comment ending in backslash does not continue": ("#c\\\na=b", [("a", "b")]),
    "comment ending in backslash before comment": ("! x \\\n#y\\\nz", [("z", "")]),
    "entries around comments": ("a=1\n# a=2\nb=2", [("a", "1"), ("b", "2")]),
    "empty text": ("", []),
    "blank lines": ("\n  \n\t\f\n\r\n\r", []),
    # Line terminators.
    "lf": ("a=1\nb=2\n", [("a", "1"), ("b", "2")]),
    "cr": ("a=1\rb=2\r", [("a", "1"), ("b", "2")]),
    "crlf": ("a=1\r\nb=2\r\n", [("a", "1"), ("b", "2")]),
    "mixed terminators": ("a=1\rb=2\r\nc=3\nd=4", [("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")]),
    "crlf keeps no cr in value": ("a=b \r\n", [("a", "b ")]),
    "vertical tab is not a line end": ("a=b\x0bc", [("a", "b\x0bc")]),
    "line separator is not a line end": ("a=b\u2028c\x85d", [("a", "b\u2028c\x85d")]),
    "vertical tab is not white space": ("\x0ba=b", [("\x0ba", "b")]),
    # Duplicates are all reported, in order.
    "duplicates": ("a=1\nb=2\na=3", [("a", "1"), ("b", "2"), ("a", "3")]),
}


@pytest.mark.parametrize(("text", "expected"), list(CASES.values()), ids=list(CASES))
def test_parse_pairs(text: str, expected: Pairs) -> None:
    assert [(p.key, p.value) for p in parse_properties(text)] == expected


def test_line_numbers_of_multi_line_entries() -> None:
    text = "# header\r\n\r\nfirst=1\\\r\n  2\\\n  3\nsecond=2\r\n\n   third \\\rx\nlast=\\"
    assert parse_properties(text) == [
        PropertyLine(key="first", value="123", line=3),
        PropertyLine(key="second", value="2", line=6),
        PropertyLine(key="third", value="x", line=8),
        PropertyLine(key="last", value="", line=10),
    ]


def test_line_number_after_empty_continuation() -> None:
    lines = parse_properties("a=b\\\n\nc=d")
    assert [(p.key, p.line) for p in lines] == [("a", 1), ("c", 3)]


def test_to_dict_last_occurrence_wins() -> None:
    lines = parse_properties("a=1\nb=2\na=3\n")
    assert to_dict(lines) == {"a": "3", "b": "2"}


def test_to_dict_of_nothing() -> None:
    assert to_dict([]) == {}


def test_property_line_is_immutable() -> None:
    entry = PropertyLine(key="a", value="b", line=1)
    with pytest.raises(AttributeError):
        entry.key = "c"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "bad"),
    [
        (r"a=\u12G4", r"\u12G4"),
        (r"a=\u12", r"\u12"),
        (r"a=\u", r"\u"),
        (r"a=\u 123", r"\u 123"),
        (r"a=\u+123", r"\u+123"),
        (r"a=\u1_23", r"\u1_23"),
        (r"\uZZZZ=b", r"\uZZZZ"),
    ],
    ids=["bad digit", "short at end", "bare", "space", "plus sign", "underscore", "in key"],
)
def test_malformed_unicode_escape(text: str, bad: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_properties(f"# intro\n\n{text}\n", source="broker.properties")
    assert caught.value.name == "broker.properties:3"
    message = str(caught.value)
    assert "broker.properties:3" in message
    assert f"'{bad}'" in message
    assert "four hexadecimal digits" in message


def test_malformed_escape_reports_start_of_logical_line() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_properties("x=1\na=ok\\\n  \\uXY")
    assert caught.value.name == "<string>:2"


def test_escaped_backslash_before_u_is_not_an_escape() -> None:
    assert to_dict(parse_properties(r"a=\\uZZZZ")) == {"a": "\\uZZZZ"}


@pytest.mark.parametrize("text", [r"a=\uD83D", r"a=\uDE00\uD83D", r"a=\uD83Dx"])
def test_unpaired_surrogate_escape(text: str) -> None:
    with pytest.raises(ConfigError, match="surrogate") as caught:
        parse_properties(text, source="s")
    assert caught.value.name == "s:1"


def test_load_file(tmp_path: Path) -> None:
    path = tmp_path / "config.properties"
    path.write_bytes("# c\r\nimq.a=1\r\nimq.b = x\\\r\n   y\r\nimq.nom=café\r\n".encode())
    assert load_properties(path) == [
        PropertyLine(key="imq.a", value="1", line=2),
        PropertyLine(key="imq.b", value="xy", line=3),
        PropertyLine(key="imq.nom", value="café", line=5),
    ]
    assert load_properties(str(path)) == load_properties(path)


def test_load_file_ignores_bom(tmp_path: Path) -> None:
    path = tmp_path / "bom.properties"
    path.write_bytes(b"\xef\xbb\xbfimq.a=1\n")
    assert to_dict(load_properties(path)) == {"imq.a": "1"}


def test_load_file_keeps_bom_that_is_not_leading(tmp_path: Path) -> None:
    path = tmp_path / "bom.properties"
    path.write_bytes(b"a=\xef\xbb\xbf\n")
    assert to_dict(load_properties(path)) == {"a": "\ufeff"}


def test_load_file_names_source_in_escape_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.properties"
    path.write_text("a=1\nb=\\u00g0\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_properties(path)
    assert caught.value.name == f"{path}:2"


def test_load_file_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.properties"
    path.write_bytes(b"a=1\r\nb=caf\xe9\n")
    with pytest.raises(ConfigError) as caught:
        load_properties(path)
    assert caught.value.name == str(path)
    message = str(caught.value)
    assert "byte offset 10" in message
    assert "0xe9" in message
    assert "line 2" in message
    assert "must be UTF-8" in message
    assert "\\uXXXX" in message


def test_load_file_not_utf8_offset_counts_bom(tmp_path: Path) -> None:
    path = tmp_path / "bom-latin1.properties"
    path.write_bytes(b"\xef\xbb\xbfa=\xff\n")
    with pytest.raises(ConfigError, match="byte offset 5 "):
        load_properties(path)


def test_load_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.properties"
    with pytest.raises(ConfigError) as caught:
        load_properties(path)
    assert caught.value.name == str(path)
    message = str(caught.value)
    assert str(path) in message
    assert "No such file or directory" in message
    assert isinstance(caught.value.__cause__, FileNotFoundError)


def test_load_directory_is_unreadable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_properties(tmp_path)
    assert caught.value.name == str(tmp_path)
    assert isinstance(caught.value.__cause__, IsADirectoryError)
    assert "Is a directory" in str(caught.value)


def test_many_continuations_are_handled() -> None:
    # A long value built from many continuation lines stays correct; the parse joins parts
    # once rather than re-copying the value for every line.
    count = 20_000
    text = "a=" + "".join("x\\\n  " for _ in range(count)) + "end\nb=1"
    assert to_dict(parse_properties(text)) == {"a": "x" * count + "end", "b": "1"}
