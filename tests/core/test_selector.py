"""JMS message selectors: evaluation, errors, limits, and generated selectors."""

from __future__ import annotations

import time

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sluiceway.core.values.message import Message
from sluiceway.core.values.selector import (
    MAX_NESTING,
    MAX_SELECTOR_LENGTH,
    Selector,
    compile_selector,
)
from sluiceway.errors import BadRequest, Status
from sluiceway.naming import DestinationKind, DestinationName

Headers = tuple[tuple[str, str], ...]


def message(headers: Headers = (), *, persistent: bool = True) -> Message:
    return Message(
        id="m1",
        destination=DestinationName(DestinationKind.QUEUE, "q"),
        body=b"",
        headers=headers,
        priority=4,
        expires=0,
        persistent=persistent,
        timestamp=1000,
    )


def h(**values: str) -> Headers:
    return tuple(values.items())


# Headers that push a message past the size where header look-ups scan instead of using a dict.
PADDING: Headers = tuple((f"pad{i}", str(i)) for i in range(12))

CASES: list[tuple[str, Headers, bool]] = [
    # string comparison: = and <> only, case-sensitive, '' inside a literal
    ("region = 'EU'", h(region="EU"), True),
    ("region = 'EU'", h(region="US"), False),
    ("region = 'EU'", h(region="eu"), False),
    ("region = 'EU'", (), False),
    ("region <> 'EU'", h(region="US"), True),
    ("region <> 'EU'", h(region="EU"), False),
    ("region <> 'EU'", (), False),
    ("'EU' = region", h(region="EU"), True),
    ("name = 'O''Brien'", h(name="O'Brien"), True),
    ("amount = '100'", h(amount="100.0"), False),  # a string literal compares as a string
    ("amount = '100'", h(amount="100"), True),
    # numeric conversion of header strings
    ("amount > 100", h(amount="150"), True),
    ("amount > 100", h(amount="100"), False),
    ("amount > 100", h(amount="100.5"), True),
    ("amount > 100", h(amount="1e3"), True),
    ("amount > 100", h(amount="-5"), False),
    ("amount > 100", h(amount="+150"), True),
    ("amount > 100", h(amount="abc"), False),
    ("amount > 100", h(amount=" 150"), False),
    ("amount > 100", h(amount="0x200"), False),
    ("amount > 100", h(amount="NaN"), False),
    ("amount > 100", (), False),
    ("amount >= 100", h(amount="100"), True),
    ("amount < 100", h(amount="99"), True),
    ("amount < 100", h(amount="100"), False),
    ("amount <= 100", h(amount="100"), True),
    ("amount <= 100", h(amount="101"), False),
    ("amount = 100", h(amount="100.0"), True),
    ("amount = 100", h(amount="0100"), True),
    ("amount <> 100", h(amount="99"), True),
    ("amount <> 100", h(amount="abc"), False),  # not a number: UNKNOWN
    ("NOT (amount = 100)", h(amount="abc"), False),
    ("100 < amount", h(amount="150"), True),
    ("100 >= amount", h(amount="150"), False),
    ("amount = 1.5", h(amount="1.5"), True),
    ("amount = 7E3", h(amount="7000"), True),
    ("amount = 7e-1", h(amount=".7"), True),
    ("amount = .5", h(amount="0.5"), True),
    ("amount = 7.", h(amount="7"), True),
    ("big > 9223372036854775806", h(big="9223372036854775807"), True),
    ("big > 9223372036854775807", h(big="99999999999999999999"), True),
    # unlike types: FALSE, so NOT makes them TRUE (NULL stays UNKNOWN)
    ("JMSPriority = '4'", (), False),
    ("NOT (JMSPriority = '4')", (), True),
    ("JMSType = 1", h(type="1"), False),
    ("NOT (JMSType = 1)", h(type="1"), True),
    ("NOT (JMSType = 1)", (), False),
    ("(a > 1) = 1", h(a="2"), False),
    ("NOT ((a > 1) = 1)", h(a="2"), True),
    # two headers: numbers when both read as numbers, else strings (= and <> only)
    ("a = b", h(a="1", b="1.0"), True),
    ("a = b", h(a="x", b="x"), True),
    ("a = b", h(a="x", b="y"), False),
    ("a <> b", h(a="1", b="x"), True),
    ("a < b", h(a="2", b="10"), True),
    ("a < b", h(a="x", b="y"), False),
    ("NOT (a < b)", h(a="x", b="y"), False),
    ("a = b", h(a="1"), False),
    # booleans
    ("flag = TRUE", h(flag="true"), True),
    ("flag = TRUE", h(flag="TRUE"), True),
    ("flag = TRUE", h(flag="True"), True),
    ("flag = TRUE", h(flag="false"), False),
    ("flag = TRUE", h(flag="yes"), False),
    ("NOT (flag = TRUE)", h(flag="yes"), False),
    ("flag = FALSE", h(flag="False"), True),
    ("flag <> FALSE", h(flag="true"), True),
    ("flag = TRUE", (), False),
    ("flag", h(flag="true"), True),
    ("flag", h(flag="1"), False),
    ("NOT flag", h(flag="false"), True),
    ("NOT flag", (), False),
    ("flag AND a = 1", h(flag="true", a="1"), True),
    ("TRUE", (), True),
    ("FALSE", (), False),
    ("NOT FALSE", (), True),
    ("TRUE = TRUE", (), True),
    ("TRUE <> FALSE", (), True),
    ("(a > 1) = TRUE", h(a="2"), True),
    ("(a > 1) = TRUE", h(a="0"), False),
    ("(a > 1) = FALSE", (), False),
    ("(a > 1) = (b > 1)", h(a="0", b="0"), True),
    ("(a > 1) = flag", h(a="2", flag="true"), True),
    # three-valued logic with NULLs
    ("a > 1", (), False),
    ("NOT (a > 1)", (), False),
    ("a > 1 OR b = 'x'", h(b="x"), True),
    ("a > 1 OR b = 'x'", h(b="y"), False),
    ("NOT (a > 1 OR b = 'x')", h(b="y"), False),
    ("NOT (a > 1 OR b = 'x')", h(a="0", b="y"), True),
    ("a > 1 AND b = 'x'", h(b="x"), False),
    ("NOT (a > 1 AND b = 'x')", h(b="y"), True),
    ("NOT (a > 1 AND b = 'x')", h(b="x"), False),
    ("a > 1 OR b > 1 OR c = 1", h(c="1"), True),
    ("a > 1 AND b > 1 AND c = 1", h(a="2", b="2", c="1"), True),
    # precedence and associativity
    ("a = 1 OR b = 1 AND c = 1", h(a="1"), True),
    ("a = 1 OR b = 1 AND c = 1", h(b="1"), False),
    ("(a = 1 OR b = 1) AND c = 1", h(a="1"), False),
    ("NOT a = 1 AND b = 1", h(a="2", b="1"), True),
    ("NOT a = 1 AND b = 1", h(a="1", b="1"), False),
    ("a + 2 * 3 = 7", h(a="1"), True),
    ("(a + 2) * 3 = 9", h(a="1"), True),
    ("a - 2 - 3 = 0", h(a="5"), True),
    ("16 / a / 2 = 2", h(a="4"), True),
    ("-a + 5 = 3", h(a="2"), True),
    ("- -a = 2", h(a="2"), True),
    ("+a = 2", h(a="2.0"), True),  # a sign reads the header as a number
    ("a * -1 = -3", h(a="3"), True),
    ("a = 2 * -  -1", h(a="2"), True),
    # arithmetic, integer division, division by zero, overflow
    ("7 / 2 = 3", (), True),
    ("-7 / 2 = -3", (), True),
    ("7 / -2 = -3", (), True),
    ("7.0 / 2 = 3.5", (), True),
    ("a / 2 = 3.5", h(a="7.0"), True),
    ("a / 2 = 3", h(a="7"), True),
    ("a / 0 = 1", h(a="1"), False),
    ("NOT (a / 0 = 1)", h(a="1"), False),
    ("a / 0.0 <> 1", h(a="1"), False),
    ("a / b > 0", h(a="1", b="0"), False),
    ("a + 1 > 10", h(a="abc"), False),
    ("NOT (a + 1 > 10)", h(a="abc"), False),
    ("a * a > 1E30", h(a="9223372036854775807"), True),
    ("a - a = 0", h(a="1e999"), False),  # infinity minus infinity is not a number: NULL
    ("NOT (a - a = 0)", h(a="1e999"), False),
    ("a * 2 = 10", (), False),
    # BETWEEN
    ("a BETWEEN 1 AND 5", h(a="1"), True),
    ("a BETWEEN 1 AND 5", h(a="5"), True),
    ("a BETWEEN 1 AND 5", h(a="3.5"), True),
    ("a BETWEEN 1 AND 5", h(a="0"), False),
    ("a BETWEEN 1 AND 5", h(a="6"), False),
    ("a BETWEEN 1 AND 5", h(a="x"), False),
    ("a BETWEEN 1 AND 5", (), False),
    ("a NOT BETWEEN 1 AND 5", h(a="0"), True),
    ("a NOT BETWEEN 1 AND 5", h(a="6"), True),
    ("a NOT BETWEEN 1 AND 5", h(a="3"), False),
    ("a NOT BETWEEN 1 AND 5", (), False),
    ("a BETWEEN b AND 5", h(a="3"), False),
    ("a BETWEEN b AND 5", h(a="3", b="1"), True),
    ("a NOT BETWEEN b AND 5", h(a="6"), True),  # 6 > 5 decides, whatever b is
    ("a NOT BETWEEN b AND 5", h(a="3"), False),  # UNKNOWN
    ("a BETWEEN 1 + 1 AND 2 * 3", h(a="6"), True),
    ("JMSPriority BETWEEN 3 AND 5", (), True),
    # IN
    ("a IN ('x', 'y')", h(a="x"), True),
    ("a IN ('x', 'y')", h(a="y"), True),
    ("a IN ('x', 'y')", h(a="z"), False),
    ("a IN ('x', 'y')", (), False),
    ("a IN ('1')", h(a="1.0"), False),
    ("a NOT IN ('x', 'y')", h(a="z"), True),
    ("a NOT IN ('x', 'y')", h(a="x"), False),
    ("a NOT IN ('x', 'y')", (), False),
    ("JMSType IN ('order', 'refund')", h(type="order"), True),
    # LIKE
    ("a LIKE 'ab%'", h(a="abc"), True),
    ("a LIKE 'ab%'", h(a="ab"), True),
    ("a LIKE 'ab%'", h(a="xab"), False),
    ("a LIKE '%b'", h(a="ab"), True),
    ("a LIKE '%b'", h(a="ba"), False),
    ("a LIKE 'a_c'", h(a="abc"), True),
    ("a LIKE 'a_c'", h(a="ac"), False),
    ("a LIKE 'a_c'", h(a="abbc"), False),
    ("a LIKE '%'", h(a=""), True),
    ("a LIKE '%'", (), False),
    ("a LIKE ''", h(a=""), True),
    ("a LIKE '%a%b%c%'", h(a="xaybzc"), True),
    ("a LIKE '%a%b%c%'", h(a="cba"), False),
    ("a LIKE '%ab%ab'", h(a="abab"), True),
    ("a LIKE '%ab%ab'", h(a="xxabxxab"), True),
    ("a LIKE '%ab%ab'", h(a="aba"), False),
    ("a LIKE 'a%%b'", h(a="ab"), True),
    ("a LIKE '100!%' ESCAPE '!'", h(a="100%"), True),
    ("a LIKE '100!%' ESCAPE '!'", h(a="1000"), False),
    ("a LIKE '!_%' ESCAPE '!'", h(a="_x"), True),
    ("a LIKE '!_%' ESCAPE '!'", h(a="ax"), False),
    ("a LIKE 'a!!b' ESCAPE '!'", h(a="a!b"), True),
    ("a LIKE 'a\\%' ESCAPE '\\'", h(a="a%"), True),
    ("a LIKE 'a.c'", h(a="abc"), False),
    ("a LIKE 'a.c'", h(a="a.c"), True),
    ("a LIKE '.*'", h(a="abc"), False),
    ("a LIKE '(x)*+?[]{}|^$\\'", h(a="(x)*+?[]{}|^$\\"), True),
    ("a LIKE 'a%b'", h(a="a\nb"), True),
    ("a LIKE 'a_b'", h(a="a\nb"), True),
    ("a LIKE 'ab'", h(a="ab\n"), False),
    ("a NOT LIKE 'x%'", h(a="yx"), True),
    ("a NOT LIKE 'x%'", h(a="xy"), False),
    ("a NOT LIKE 'x%'", (), False),
    ("JMSMessageID LIKE 'm%'", (), True),
    # IS NULL
    ("a IS NULL", (), True),
    ("a IS NULL", h(a=""), False),
    ("a IS NOT NULL", h(a=""), True),
    ("a IS NOT NULL", (), False),
    ("NOT a IS NULL", (), False),
    ("JMSCorrelationID IS NULL", (), True),
    ("JMSCorrelationID IS NULL", (("correlation-id", "c1"),), False),
    ("JMSPriority IS NOT NULL", (), True),
    # JMS header fields, which win over application headers of the same name
    ("JMSPriority = 4", (), True),
    ("JMSPriority > 4", (), False),
    ("JMSPriority = 9", h(JMSPriority="9"), False),
    ("JMSTimestamp = 1000", (), True),
    ("JMSExpiration = 0", (), True),
    ("JMSMessageID = 'm1'", (), True),
    ("JMSDeliveryMode = 'PERSISTENT'", (), True),
    ("JMSDeliveryMode = 'NON_PERSISTENT'", (), False),
    ("JMSCorrelationID = 'c1'", (("correlation-id", "c1"),), True),
    ("JMSType = 'order'", h(type="order"), True),
    ("JMSType = 'order'", (), False),
    ("jmspriority = 4", (), False),  # identifiers are case-sensitive: an absent header
    # identifiers
    ("$a = 1", (("$a", "1"),), True),
    ("_b = 1", h(_b="1"), True),
    ("a1$_ = 1", (("a1$_", "1"),), True),
    ("été = 'x'", h(été="x"), True),
    # case-insensitive keywords
    ("a in ('x') and not b like 'y%' or c is null", h(a="x", b="z", c="1"), True),
    ("a Between 1 And 2 oR FaLsE", h(a="1"), True),
    ("flag = true", h(flag="true"), True),
    ("a is not null", h(a="1"), True),
    ("a LIKE 'x!%' escape '!'", h(a="x%"), True),
    ("a not in ('x')", h(a="y"), True),
    # white space
    ("\ta\n=\r1 ", h(a="1"), True),
    ("a=1 AND(b=2)OR(b=3)", h(a="1", b="2"), True),
]


@pytest.mark.parametrize(("text", "headers", "expected"), CASES)
def test_evaluation(text: str, headers: Headers, expected: bool) -> None:
    selector = compile_selector(text)
    assert selector.matches(message(headers)) is expected
    # the same once the message has enough headers for the look-up to build a dict
    assert selector.matches(message(headers + PADDING)) is expected


@pytest.mark.parametrize("headers", [(), PADDING])
def test_first_occurrence_of_a_repeated_header_wins(headers: Headers) -> None:
    repeated = (*headers, ("a", "1"), ("a", "2"))
    assert compile_selector("a = 1").matches(message(repeated))
    assert not compile_selector("a = 2").matches(message(repeated))


def test_delivery_mode_of_a_non_persistent_message() -> None:
    selector = compile_selector("JMSDeliveryMode = 'NON_PERSISTENT'")
    assert selector.matches(message(persistent=False))
    assert not selector.matches(message(persistent=True))


@pytest.mark.parametrize("text", ["", "   ", "\t\n"])
def test_an_empty_selector_matches_everything(text: str) -> None:
    selector = compile_selector(text)
    assert isinstance(selector, Selector)
    assert selector.text == text
    assert selector.matches(message())
    assert selector.matches(message(h(a="1")))


def test_selector_keeps_its_text() -> None:
    assert compile_selector("a = 1").text == "a = 1"
    assert repr(compile_selector("a = 1")) == "Selector('a = 1')"


ERRORS: list[tuple[str, str]] = [
    ("a = 'x", "unterminated string starting at position 5"),
    ("(a = 1", "expected ')' at position 7, found end of selector"),
    ("a IN (1)", "IN list takes string literals only; found number 1 at position 7"),
    ("a IN ()", "IN list takes string literals only; found ')' at position 7"),
    ("a IN ('x' 'y')", "expected ',' or ')' in the IN list at position 11, found string 'y'"),
    ("a IN 'x'", "expected '(' after IN at position 6"),
    ("a < 'x'", "'<' at position 3 compares a string; strings and conditions take only = and <>"),
    ("'x' >= a", "'>=' at position 5 compares a string"),
    ("flag > TRUE", "'>' at position 6 compares a condition"),
    ("JMSType <= 'x'", "'<=' at position 9 compares a string"),
    ("a = 1 b", "expected AND, OR or the end of the selector at position 7, found identifier b"),
    ("a = 1 = 1", "expected AND, OR or the end of the selector at position 7, found '='"),
    ("a = 1)", "at position 6, found ')'"),
    ("1L = a", "malformed number at position 1"),
    ("a = 1.2.3", "malformed number at position 5"),
    ("a=1AND b=2", "malformed number at position 3"),
    ("a = 99999999999999999999", "number 99999999999999999999 at position 5 is out of range"),
    ("a = 1e999", "number 1e999 at position 5 is out of range"),
    ("NOT", "expected a value, an identifier or '(' at position 4, found end of selector"),
    ("AND = 1", "expected a value, an identifier or '(' at position 1, found AND"),
    ("a = 1 AND", "at position 10, found end of selector"),
    ("a == 1", "expected a value, an identifier or '(' at position 4, found '='"),
    (")", "at position 1, found ')'"),
    ("a LIKE 'x' ESCAPE 'ab'", "ESCAPE at position 19 takes one character, found 2"),
    ("a LIKE 'x' ESCAPE ''", "ESCAPE at position 19 takes one character, found 0"),
    ("a LIKE 'x' ESCAPE 1", "ESCAPE takes a string literal; found number 1 at position 19"),
    ("a LIKE 'x!' ESCAPE '!'", "the escape character '!' must be followed by _, % or itself"),
    ("a LIKE 'x!y' ESCAPE '!'", "LIKE pattern at position 8, the escape character '!'"),
    ("a LIKE b", "LIKE takes a string literal pattern; found identifier b at position 8"),
    ("'x' LIKE 'x'", "LIKE needs an identifier on its left, found a string at position 1"),
    ("a + 1 IN ('1')", "IN needs an identifier on its left, found a number at position 1"),
    ("JMSPriority LIKE '4'", "LIKE takes a string, but JMSPriority at position 1 is a number"),
    ("JMSTimestamp IN ('4')", "IN takes a string, but JMSTimestamp at position 1 is a number"),
    ("1 IS NULL", "IS NULL needs an identifier on its left, found a number at position 1"),
    ("a + 'x' = 1", "'+' takes numbers, found a string at position 5"),
    ("'x' * a = 1", "'*' takes numbers, found a string at position 1"),
    ("TRUE + 1 = 2", "'+' takes numbers, found a condition at position 1"),
    ("-'x' = 1", "'-' takes numbers, found a string at position 2"),
    ("a BETWEEN 'x' AND 2", "BETWEEN takes numbers, found a string at position 11"),
    ("a BETWEEN 1 OR 2", "expected AND of BETWEEN at position 13, found OR"),
    ("'x'", "expected a condition at position 1, found a string"),
    ("a + 1", "expected a condition at position 1, found a number"),
    ("JMSPriority", "expected a condition at position 1, found a number"),
    ("a = 1 AND 2", "expected a condition at position 11, found a number"),
    ("NOT 'x'", "expected a condition at position 5, found a string"),
    ("a NOT IS NULL", "expected BETWEEN, IN or LIKE after NOT at position 7, found IS"),
    ("a NOT = 1", "expected BETWEEN, IN or LIKE after NOT at position 7, found '='"),
    ("a IS NOT 'x'", "expected NULL at position 10, found string 'x'"),
    ("a = NULL", "NULL at position 5 is allowed only in IS [NOT] NULL"),
    ("NULL IS NULL", "NULL at position 1 is allowed only in IS [NOT] NULL"),
    ("a # 1", "unexpected character '#' at position 3"),
    ('a = "x"', "unexpected character '\"' at position 5"),
    ("a != 1", "unexpected character '!' at position 3"),
    ("a = 0x10", "malformed number at position 5"),
    ("1a = 1", "malformed number at position 1"),
]


@pytest.mark.parametrize(("text", "fragment"), ERRORS)
def test_invalid_selector(text: str, fragment: str) -> None:
    with pytest.raises(BadRequest) as raised:
        compile_selector(text)
    assert raised.value.status is Status.BAD_REQUEST
    assert raised.value.summary == "invalid selector"
    assert str(raised.value).startswith(f"selector {text!r}: ")
    assert fragment in str(raised.value)


def test_error_quotes_a_long_selector_shortened() -> None:
    text = "a = 1 AND " * 30 + "#"
    with pytest.raises(BadRequest, match=r"unexpected character '#' at position 301") as raised:
        compile_selector(text)
    assert text[:200] + "..." in str(raised.value)


def test_length_limit() -> None:
    clause = "a = 1 OR "
    text = clause * ((MAX_SELECTOR_LENGTH - 5) // len(clause)) + "a = 1"
    text += " " * (MAX_SELECTOR_LENGTH - len(text))
    assert len(text) == MAX_SELECTOR_LENGTH
    assert compile_selector(text).matches(message(h(a="1")))
    with pytest.raises(BadRequest, match=r"selector of 4097 characters is longer than .* 4096"):
        compile_selector(text + " ")


@pytest.mark.parametrize(
    ("prefix", "core", "suffix"),
    [("(", "a = 1", ")"), ("NOT ", "flag", ""), ("- ", "a = 1", ""), ("(NOT ", "flag", ")")],
)
def test_nesting_limit(prefix: str, core: str, suffix: str) -> None:
    def nested(levels: int) -> str:
        return prefix * levels + core + suffix * levels

    levels = MAX_NESTING // 2 if prefix == "(NOT " else MAX_NESTING  # "(NOT " is two levels
    # an even number of NOTs and signs cancel out
    assert compile_selector(nested(levels)).matches(message(h(a="1", flag="true")))
    with pytest.raises(BadRequest, match=rf"nesting deeper than {MAX_NESTING} levels"):
        compile_selector(nested(levels + 1))


def test_nesting_counts_the_innermost_position() -> None:
    text = "(" * (MAX_NESTING + 1) + "a = 1" + ")" * (MAX_NESTING + 1)
    with pytest.raises(BadRequest, match=rf"at position {MAX_NESTING + 1}$"):
        compile_selector(text)


def test_long_flat_chains_evaluate_without_deep_recursion() -> None:
    ors = " OR ".join(f"a = {i}" for i in range(350))
    sums = "+".join(["a"] * 1300) + " = 1300"
    assert len(ors) < MAX_SELECTOR_LENGTH
    assert len(sums) < MAX_SELECTOR_LENGTH
    assert compile_selector(ors).matches(message(h(a="349")))
    assert compile_selector(sums).matches(message(h(a="1")))
    assert not compile_selector(sums).matches(message(h(a="2")))


def test_like_patterns_do_not_backtrack_badly() -> None:
    # A naive translation to `.*a.*a...b` backtracks with one power of the length for each `%`.
    selector = compile_selector("a LIKE '" + "%a" * 40 + "%b'")
    value = "a" * 20_000
    start = time.perf_counter()
    assert not selector.matches(message(h(a=value)))
    assert selector.matches(message(h(a=value + "b")))
    assert time.perf_counter() - start < 2.0


# --- generated selectors ----------------------------------------------------------------------

# The grammar's tokens, a few malformed ones, and spellings that differ only in case.
TOKENS = """
    a b flag JMSPriority JMSType JMSCorrelationID $x _y é
    'x' 'it''s' '%a_' '!' '' '1' 1 0 -1 2.5 1E3 .5 7. 9223372036854775807 1L
    TRUE FALSE NULL NOT AND OR BETWEEN LIKE IN IS ESCAPE and Or not
    = <> < <= > >= + - * / ( ) , ' # ! "
""".split()  # noqa: SIM905 (a table of tokens reads best as one)
HEADER_VALUES = st.sampled_from(
    ["1", "0", "-3", "+4", "2.5", ".5", "7.", "1e999", "-1e999", "true", "FALSE", "x", "NaN"]
) | st.sampled_from(["%", "'", "9223372036854775807", "9" * 25, "", " 1", "a\nb", "."])
HEADER_VALUES |= st.text(max_size=6)
HEADER_NAMES = st.sampled_from(["a", "b", "flag", "$x", "_y", "type", "correlation-id", "pad"])
HEADERS: st.SearchStrategy[Headers] = st.lists(
    st.tuples(HEADER_NAMES, HEADER_VALUES), max_size=12
).map(tuple)


@settings(max_examples=400)
@given(tokens=st.lists(st.sampled_from(TOKENS), max_size=16), sep=st.sampled_from([" ", ""]),
       headers=st.lists(HEADERS, min_size=1, max_size=3))  # fmt: skip
def test_random_token_sequences(tokens: list[str], sep: str, headers: list[Headers]) -> None:
    try:
        selector = compile_selector(sep.join(tokens))
    except BadRequest as error:
        explanation = str(error)
    else:
        explanation = ""
    if explanation:
        assert "position" in explanation
        return
    for header_set in headers:
        assert isinstance(selector.matches(message(header_set)), bool)


NUMERIC = st.recursive(
    st.sampled_from(["a", "b", "JMSPriority", "1", "0", "2.5", "1E3", "-7", "9223372036854775807"]),
    lambda inner: (
        st.tuples(inner, st.sampled_from(["+", "-", "*", "/"]), inner).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"
        )
        | inner.map(lambda e: f"-{e}")
    ),
    max_leaves=6,
)
STRINGY = st.sampled_from(["a", "b", "JMSType", "'x'", "'1'", "''", "'true'"])
ATOMS = st.one_of(
    st.tuples(NUMERIC, st.sampled_from(["=", "<>", "<", "<=", ">", ">="]), NUMERIC).map(" ".join),
    st.tuples(STRINGY, st.sampled_from(["=", "<>"]), STRINGY).map(" ".join),
    st.tuples(NUMERIC, st.sampled_from(["BETWEEN", "NOT BETWEEN"]), NUMERIC, NUMERIC).map(
        lambda t: f"{t[0]} {t[1]} {t[2]} AND {t[3]}"
    ),
    st.tuples(st.sampled_from(["a", "b", "JMSType"]), st.sampled_from(["IN", "NOT IN"])).map(
        lambda t: f"{t[0]} {t[1]} ('x', '1', '')"
    ),
    st.tuples(st.sampled_from(["a", "b", "JMSType"]), st.sampled_from(["'%'", "'x%'", "'_'"])).map(
        lambda t: f"{t[0]} LIKE {t[1]}"
    ),
    st.sampled_from(["a IS NULL", "b IS NOT NULL", "flag", "TRUE", "FALSE", "flag = TRUE"]),
)
CONDITIONS = st.recursive(
    ATOMS,
    lambda inner: (
        st.tuples(inner, st.sampled_from(["AND", "OR"]), inner).map(
            lambda t: f"({t[0]}) {t[1]} ({t[2]})"
        )
        | inner.map(lambda c: f"NOT ({c})")
    ),
    max_leaves=8,
)


@settings(max_examples=300)
@given(condition=CONDITIONS, headers=HEADERS)
def test_generated_conditions_follow_three_valued_logic(condition: str, headers: Headers) -> None:
    try:
        compile_selector(f"({condition}) OR NOT ({condition})")
    except BadRequest as error:  # NOT and parentheses can stack up past the nesting limit
        assume(f"nesting deeper than {MAX_NESTING}" not in str(error))
        raise
    msg = message(headers)
    positive = compile_selector(condition).matches(msg)
    negative = compile_selector(f"NOT ({condition})").matches(msg)
    assert not (positive and negative)  # TRUE and FALSE exclude each other; UNKNOWN is neither
    # A condition OR its negation is TRUE exactly when the condition is not UNKNOWN.
    either = compile_selector(f"({condition}) OR NOT ({condition})").matches(msg)
    assert either == (positive or negative)
    assert compile_selector(f"({condition}) AND NOT ({condition})").matches(msg) is False
