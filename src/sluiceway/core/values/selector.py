"""JMS message selectors: the `selector` header of a STOMP SUBSCRIBE.

A selector is a condition on a message's headers in the subset of SQL-92 that JMS 2.0 defines
(section 3.8.1). `compile_selector` parses it once into a tree of closures that
`Selector.matches` runs per message. An empty or white space only selector is no selector: it
matches every message. Grammar, loosest binding first (keywords are case-insensitive):

    condition := and_cond { OR and_cond }        and_cond := not_cond { AND not_cond }
    not_cond  := NOT not_cond | predicate
    predicate := sum [ ( = | <> | < | <= | > | >= ) sum | [NOT] BETWEEN sum AND sum
                     | [NOT] IN ( 'string' { , 'string' } ) | [NOT] LIKE 'pattern' [ESCAPE 'c']
                     | IS [NOT] NULL ]
    sum       := product { ( + | - ) product }   product := signed { ( * | / ) signed }
    signed    := ( + | - ) signed | primary       primary := literal | identifier | ( condition )

Literals are 'strings' ('' is a quote inside one), 64-bit integers (57), approximate numbers (7.5,
7., .5, 7E3, 5.7e-2), TRUE and FALSE. Identifiers (case-sensitive) start with a letter, `_` or `$`
and go on with letters, digits, `_` and `$`; NULL, TRUE, FALSE, NOT, AND, OR, BETWEEN, LIKE, IN, IS
and ESCAPE are reserved. LIKE, IN and IS NULL take an identifier on their left. In a LIKE pattern
`_` is any one character, `%` any run of them, and the ESCAPE character makes the next `_`, `%` or
escape character literal. Integer division truncates toward zero.

The JMS header fields JMSPriority, JMSTimestamp, JMSExpiration (numbers), JMSMessageID,
JMSDeliveryMode ('PERSISTENT' or 'NON_PERSISTENT'), JMSCorrelationID (the `correlation-id` header)
and JMSType (the `type` header) are typed. Any other identifier names an application header (the
first of repeated ones); an absent header is NULL. STOMP header values are untyped strings, so this
broker maps JMS's typed properties thus:

- compared with a number, or in arithmetic, BETWEEN or after a sign, a header value is read as a
  number: `[+-]digits` is an integer (a float beyond 64 bits), a decimal such as `-1.5`, `.5` or
  `7E3` a float; anything else (white space, `0x10`, `NaN`) makes the comparison UNKNOWN;
- compared with a string, it is compared as a string, case-sensitively;
- compared with TRUE or FALSE, or used as a condition (`flag AND x = 1`), 'true' and 'false' in any
  case are the booleans and any other value makes the comparison UNKNOWN;
- two headers compared are compared as numbers when both read as numbers, else as strings (with =
  and <> only; ordering two non-numbers is UNKNOWN).

Otherwise JMS's rules hold: NULL makes comparisons and arithmetic UNKNOWN, AND / OR / NOT follow
SQL's three-valued logic, and a selector matches only when TRUE. Strings and booleans take only =
and <> (other comparisons and arithmetic on them are refused at compile time); comparing unlike
types (a number with a string) is FALSE; division by zero and results that are not a number give
NULL; integer results beyond 64 bits become floats.

Errors are BadRequest (400) naming the 1-based character position and what was expected. Work per
message is bounded: text length and nesting are limited, and each LIKE pattern becomes a regular
expression that matches each piece between `%`s at its first place and never backtracks into it.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Final, NamedTuple, TypeAlias, cast

from sluiceway.core.values.message import Message
from sluiceway.errors import BadRequest

# A selector is evaluated for every message a selective consumer considers; these bound the work
# (and the Python recursion) that one selector can ask for.
MAX_SELECTOR_LENGTH: Final = 4096  # characters: room for any realistic condition
MAX_NESTING: Final = 64  # levels of parentheses, NOT and signs inside one another

_SCAN_LIMIT: Final = 8  # up to this many headers, a scan finds a header faster than a dict
_LONG_MIN: Final = -(2**63)  # integers follow Java's long
_LONG_MAX: Final = 2**63 - 1

Num: TypeAlias = int | float
Value: TypeAlias = bool | int | float | str | None
_Fn: TypeAlias = Callable[["_Context"], Value]
_NumFn: TypeAlias = Callable[["_Context"], Num | None]
_StrFn: TypeAlias = Callable[["_Context"], str | None]
_BoolFn: TypeAlias = Callable[["_Context"], bool | None]
_Compare: TypeAlias = Callable[[Any, Any], bool]


class _Context:
    """One evaluation: the message, and its application headers as a dict once one is needed."""

    __slots__ = ("_headers", "message")

    def __init__(self, message: Message) -> None:
        self.message = message
        self._headers: dict[str, str] | None = None

    def header(self, name: str) -> str | None:
        headers = self._headers
        if headers is None:
            pairs = self.message.headers
            if len(pairs) <= _SCAN_LIMIT:
                for key, value in pairs:
                    if key == name:
                        return value
                return None
            # reversed: the first occurrence of a repeated header is the one kept
            headers = self._headers = dict(reversed(pairs))
        return headers.get(name)


class Selector:
    """A compiled selector; `text` is the selector as the client wrote it."""

    __slots__ = ("_fn", "text")

    def __init__(self, text: str, fn: _Fn | None) -> None:
        self.text = text
        self._fn = fn

    def matches(self, message: Message) -> bool:
        """Whether the selector is TRUE for `message` (FALSE and UNKNOWN do not match)."""
        fn = self._fn
        return fn is None or fn(_Context(message)) is True

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"


def compile_selector(text: str) -> Selector:
    """Parse and compile `text`; raise BadRequest saying where and what is wrong."""
    if len(text) > MAX_SELECTOR_LENGTH:
        raise BadRequest(
            "invalid selector",
            f"selector of {len(text)} characters is longer than the limit of "
            f"{MAX_SELECTOR_LENGTH}; split the condition or filter in the application",
        )
    if not text.strip():
        return Selector(text, None)
    try:
        return Selector(text, _Parser(text).parse())
    except _SyntaxError as error:
        shown = text if len(text) <= 200 else text[:200] + "..."
        raise BadRequest("invalid selector", f"selector {shown!r}: {error}") from None


class _SyntaxError(Exception):
    """What is wrong, with its position; compile_selector adds the selector text."""


# --- runtime conversions and operators --------------------------------------------------------

_NUMBER_RE: Final = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_BOOLEANS: Final = {"true": True, "false": False}


def _fit(result: Num) -> Num | None:
    """`result` as a 64-bit int or a float (a bigger int becomes a float); NaN becomes NULL."""
    if result.__class__ is int:
        return result if _LONG_MIN <= result <= _LONG_MAX else float(result)
    return None if math.isnan(result) else result


def _to_number(text: str | None) -> Num | None:
    """A header value as a number (see the module docstring), or None."""
    if text is None:
        return None
    if not (text.isdigit() and text.isascii()):  # plain integers, the common case, skip the regex
        if _NUMBER_RE.fullmatch(text) is None:
            return None
        if not text.lstrip("+-").isdigit():
            return float(text)
    return _fit(int(text)) if len(text) <= 20 else float(text)


def _to_bool(text: str | None) -> bool | None:
    return None if text is None else _BOOLEANS.get(text.lower())


def _divide(a: Num, b: Num) -> Num | None:
    if b == 0:
        return None
    if a.__class__ is int and b.__class__ is int:
        quotient = abs(a) // abs(b)  # Java's long division truncates toward zero
        return _fit(quotient if (a < 0) == (b < 0) else -quotient)
    return _fit(a / b)


_ARITHMETIC: Final[dict[str, Callable[[Num, Num], Num | None]]] = {
    "+": lambda a, b: _fit(a + b),
    "-": lambda a, b: _fit(a - b),
    "*": lambda a, b: _fit(a * b),
    "/": _divide,
}
_COMPARE: Final[dict[str, _Compare]] = {
    "=": operator.eq, "<>": operator.ne, "<": operator.lt,
    "<=": operator.le, ">": operator.gt, ">=": operator.ge,
}  # fmt: skip
_MIRROR: Final = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


# --- static types and compiled expressions ----------------------------------------------------


class _Kind(Enum):
    NUM = "a number"
    STR = "a string"
    BOOL = "a condition"
    HEADER = "a header"  # an application header: an untyped string, converted by context


# How a header value is read where a number or a boolean is wanted (a string is read as it is).
_READERS: Final[dict[_Kind, Callable[[str | None], Value]]] = {
    _Kind.NUM: _to_number,
    _Kind.BOOL: _to_bool,
}


@dataclass(frozen=True, slots=True)
class _Expr:
    kind: _Kind
    fn: _Fn
    pos: int  # 1-based position of the expression's first character
    name: str | None = None  # the identifier, when the expression is a bare identifier
    constant: bool = False  # fn returns `value` for every message
    value: Value = None


def _constant(kind: _Kind, value: Value, pos: int) -> _Expr:
    return _Expr(kind, lambda _: value, pos, constant=True, value=value)


def _read_as(expr: _Expr, kind: _Kind) -> _Fn:
    """expr's function, reading a header value as `kind` where that is a number or a boolean."""
    read = _READERS.get(kind)
    if expr.kind is not _Kind.HEADER or read is None:
        return expr.fn
    header = cast("_StrFn", expr.fn)
    return lambda c: read(header(c))


def _number_fn(expr: _Expr, what: str) -> _NumFn:
    if expr.kind not in (_Kind.NUM, _Kind.HEADER):
        raise _SyntaxError(f"{what} takes numbers, found {expr.kind.value} at position {expr.pos}")
    return cast("_NumFn", _read_as(expr, _Kind.NUM))


def _condition_fn(expr: _Expr) -> _BoolFn:
    if expr.kind not in (_Kind.BOOL, _Kind.HEADER):
        raise _SyntaxError(
            f"expected a condition at position {expr.pos}, found {expr.kind.value} "
            "(compare it with something)"
        )
    return cast("_BoolFn", _read_as(expr, _Kind.BOOL))


def _not(fn: _BoolFn) -> _BoolFn:
    return lambda c: None if (value := fn(c)) is None else not value


def _junction(fns: Sequence[_BoolFn], decisive: bool) -> _BoolFn:
    """AND (decisive FALSE) or OR (decisive TRUE): decisive if an operand is, else UNKNOWN if one
    is, else the other truth value."""

    def evaluate(c: _Context) -> bool | None:
        result: bool | None = not decisive
        for fn in fns:
            value = fn(c)
            if value is decisive:
                return decisive
            if value is None:
                result = None
        return result

    return evaluate


def _arithmetic(first: _Expr, rest: Sequence[tuple[str, _Expr]]) -> _Expr:
    head = _number_fn(first, repr(rest[0][0]))
    steps = [(_ARITHMETIC[op], _number_fn(operand, f"{op!r}")) for op, operand in rest]

    def evaluate(c: _Context) -> Num | None:
        result = head(c)
        for apply, fn in steps:
            if result is None:
                return None
            operand = fn(c)
            if operand is None:
                return None
            result = apply(result, operand)
        return result

    return _Expr(_Kind.NUM, evaluate, first.pos)


def _negative(operand: _Expr) -> _Expr:
    if operand.constant and operand.kind is _Kind.NUM:
        return _constant(_Kind.NUM, _fit(-cast("Num", operand.value)), operand.pos)
    return _arithmetic(_constant(_Kind.NUM, 0, operand.pos), [("-", operand)])


def _comparison(op: str, left: _Expr, right: _Expr, pos: int) -> _Expr:
    if op not in ("=", "<>"):
        for side in (left, right):
            if side.kind in (_Kind.STR, _Kind.BOOL):
                raise _SyntaxError(
                    f"{op!r} at position {pos} compares {side.kind.value}; strings and "
                    "conditions take only = and <>"
                )
    if left.constant and not right.constant:
        left, right, op = right, left, _MIRROR[op]
    compare = _COMPARE[op]
    kinds = {left.kind, right.kind}
    if kinds == {_Kind.HEADER}:
        fn = _compare_headers(
            compare, op in ("=", "<>"), cast("_StrFn", left.fn), cast("_StrFn", right.fn)
        )
    elif len(kinds) == 1 or _Kind.HEADER in kinds:
        kind = (kinds - {_Kind.HEADER}).pop()
        if left.kind is _Kind.HEADER and left.name is not None and right.constant:
            fn = _header_vs_constant(compare, left.name, _READERS.get(kind), right.value)
        else:
            fn = _compare(compare, _read_as(left, kind), _read_as(right, kind))
    else:
        fn = _mismatch(left.fn, right.fn)  # JMS: comparing unlike types is FALSE
    return _Expr(_Kind.BOOL, fn, left.pos)


def _compare(compare: _Compare, lf: _Fn, rf: _Fn) -> _BoolFn:
    def evaluate(c: _Context) -> bool | None:
        a = lf(c)
        if a is None:
            return None
        b = rf(c)
        return None if b is None else compare(a, b)

    return evaluate


def _header_vs_constant(
    compare: _Compare, name: str, read: Callable[[str | None], Value] | None, constant: Value
) -> _BoolFn:
    """The usual comparison, `header op literal`, in one closure (it runs for every message)."""

    def evaluate(c: _Context) -> bool | None:
        raw = c.header(name)
        value = raw if read is None else read(raw)
        return None if value is None else compare(value, constant)

    return evaluate


def _compare_headers(compare: _Compare, equality: bool, lf: _StrFn, rf: _StrFn) -> _BoolFn:
    def evaluate(c: _Context) -> bool | None:
        a, b = lf(c), rf(c)
        if a is None or b is None:
            return None
        x, y = _to_number(a), _to_number(b)
        if x is not None and y is not None:
            return compare(x, y)
        return compare(a, b) if equality else None

    return evaluate


def _mismatch(lf: _Fn, rf: _Fn) -> _BoolFn:
    return lambda c: None if lf(c) is None or rf(c) is None else False


def _between(value: _Expr, low: _Expr, high: _Expr, negated: bool) -> _Expr:
    fn, low_fn, high_fn = (_number_fn(e, "BETWEEN") for e in (value, low, high))

    def evaluate(c: _Context) -> bool | None:
        x = fn(c)
        if x is None:
            return None
        a, b = low_fn(c), high_fn(c)
        if (a is not None and a > x) or (b is not None and x > b):
            return negated
        return None if a is None or b is None else not negated

    return _Expr(_Kind.BOOL, evaluate, value.pos)


def _identifier_fn(expr: _Expr, operation: str) -> _Fn:
    if expr.name is None:
        raise _SyntaxError(
            f"{operation} needs an identifier on its left, found {expr.kind.value} "
            f"at position {expr.pos}"
        )
    return expr.fn


def _string_test(left: _Expr, operation: str, test: Callable[[str], Any], negated: bool) -> _Expr:
    """IN or LIKE: `test` the identifier's string value; NULL stays UNKNOWN."""
    fn = cast("_StrFn", _identifier_fn(left, operation))
    if left.kind is _Kind.NUM:
        raise _SyntaxError(
            f"{operation} takes a string, but {left.name} at position {left.pos} is a number"
        )

    def evaluate(c: _Context) -> bool | None:
        value = fn(c)
        return None if value is None else (not test(value)) is negated

    return _Expr(_Kind.BOOL, evaluate, left.pos)


def _is_null(left: _Expr, negated: bool) -> _Expr:
    fn = _identifier_fn(left, "IS NULL")
    return _Expr(_Kind.BOOL, lambda c: (fn(c) is None) is not negated, left.pos)


def _like_pattern(pattern: str, escape: str | None, pos: int) -> re.Pattern[str]:
    """Compile a LIKE pattern once. Between `%`s the pieces have a fixed length, so matching each
    at its first place (an atomic group) is correct and keeps the work linear per piece."""
    pieces: list[str] = [""]
    chars = iter(pattern)
    for char in chars:
        if char == escape:
            following = next(chars, None)
            if following not in ("_", "%", escape):
                raise _SyntaxError(
                    f"in the LIKE pattern at position {pos}, the escape character {escape!r} "
                    "must be followed by _, % or itself"
                )
            pieces[-1] += re.escape(following)
        elif char == "%":
            pieces.append("")
        else:
            pieces[-1] += "." if char == "_" else re.escape(char)
    if len(pieces) == 1:
        return re.compile(pieces[0] + r"\Z", re.DOTALL)
    middle = "".join(f"(?>.*?{piece})" for piece in pieces[1:-1] if piece)
    return re.compile(f"{pieces[0]}{middle}.*{pieces[-1]}\\Z", re.DOTALL)


# --- tokens -----------------------------------------------------------------------------------

_KEYWORDS: Final = frozenset(
    ("NULL", "TRUE", "FALSE", "NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS", "ESCAPE")
)
_TOKEN_RE: Final = re.compile(
    r"""(?P<space>\s+)
    |(?P<number>(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[0-9]+(?:[eE][+-]?[0-9]+)?)
    |(?P<word>[^\W\d][\w$]*|\$[\w$]*)
    |(?P<string>'(?:[^']|'')*')
    |(?P<op><>|<=|>=|[=<>+\-*/(),])""",
    re.VERBOSE,
)
_JMS_FIELDS: Final[dict[str, tuple[_Kind, _Fn]]] = {
    "JMSPriority": (_Kind.NUM, lambda c: c.message.priority),
    "JMSTimestamp": (_Kind.NUM, lambda c: c.message.timestamp),
    "JMSExpiration": (_Kind.NUM, lambda c: c.message.expires),
    "JMSMessageID": (_Kind.STR, lambda c: c.message.id),
    "JMSDeliveryMode": (
        _Kind.STR,
        lambda c: "PERSISTENT" if c.message.persistent else "NON_PERSISTENT",
    ),
    "JMSCorrelationID": (_Kind.STR, lambda c: c.header("correlation-id")),
    "JMSType": (_Kind.STR, lambda c: c.header("type")),
}


class _Token(NamedTuple):
    kind: str  # number, word (an identifier), keyword, string, op or end
    value: Value  # the number, the identifier, the upper-case keyword, the string or the op
    pos: int  # 1-based
    text: str  # as written

    def describe(self) -> str:
        if self.kind == "end":
            return "end of selector"
        label = {"number": "number ", "word": "identifier ", "string": "string "}
        return label.get(self.kind, "") + (repr(self.text) if self.kind == "op" else self.text)


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    pos = 0
    while pos < len(text):
        found = _TOKEN_RE.match(text, pos)
        if found is None:
            if text[pos] == "'":
                raise _SyntaxError(f"unterminated string starting at position {pos + 1}")
            raise _SyntaxError(f"unexpected character {text[pos]!r} at position {pos + 1}")
        kind, raw, end = cast("str", found.lastgroup), found.group(), found.end()
        pos, start = end, pos + 1
        value: Value = raw
        if kind == "space":
            continue
        if kind == "number":
            value = int(raw) if raw.isdigit() else float(raw)
            if end < len(text) and (text[end].isalnum() or text[end] in "_$.'"):
                raise _SyntaxError(f"malformed number at position {start}")
            if (value > _LONG_MAX) if isinstance(value, int) else math.isinf(value):
                raise _SyntaxError(f"number {raw} at position {start} is out of range")
        elif kind == "string":
            value = raw[1:-1].replace("''", "'")
        elif kind == "word" and raw.upper() in _KEYWORDS:
            kind, value = "keyword", raw.upper()
        tokens.append(_Token(kind, value, start, raw))
    tokens.append(_Token("end", None, len(text) + 1, ""))
    return tokens


# --- parser -----------------------------------------------------------------------------------


class _Parser:
    """Recursive descent over the grammar in the module docstring, building closures."""

    def __init__(self, text: str) -> None:
        self.tokens = _tokenize(text)
        self.index = 0
        self.depth = 0

    def parse(self) -> _Fn:
        condition = _condition_fn(self.condition())
        if self.peek().kind != "end":
            raise self.expected("AND, OR or the end of the selector")
        return condition

    def peek(self) -> _Token:
        return self.tokens[self.index]

    def advance(self) -> _Token:
        token = self.tokens[self.index]
        self.index += token.kind != "end"  # the end token stays current
        return token

    def accept(self, kind: str, value: str) -> _Token | None:
        token = self.peek()
        if token.kind == kind and token.value == value:
            return self.advance()
        return None

    def expect(self, kind: str, value: str, what: str) -> _Token:
        token = self.accept(kind, value)
        if token is None:
            raise self.expected(what)
        return token

    def expected(self, what: str) -> _SyntaxError:
        token = self.peek()
        return _SyntaxError(f"expected {what} at position {token.pos}, found {token.describe()}")

    def enter(self, token: _Token) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise _SyntaxError(
                f"nesting deeper than {MAX_NESTING} levels (parentheses, NOT and signs) "
                f"at position {token.pos}"
            )

    def condition(self) -> _Expr:
        return self.chain("OR", self.and_condition)

    def and_condition(self) -> _Expr:
        return self.chain("AND", self.not_condition)

    def chain(self, keyword: str, operand: Callable[[], _Expr]) -> _Expr:
        first = operand()
        if self.peek().value != keyword or self.peek().kind != "keyword":
            return first
        fns = [_condition_fn(first)]
        while self.accept("keyword", keyword):
            fns.append(_condition_fn(operand()))
        return _Expr(_Kind.BOOL, _junction(fns, keyword == "OR"), first.pos)

    def not_condition(self) -> _Expr:
        token = self.accept("keyword", "NOT")
        if token is None:
            return self.predicate()
        self.enter(token)
        operand = _condition_fn(self.not_condition())
        self.depth -= 1
        return _Expr(_Kind.BOOL, _not(operand), token.pos)

    def predicate(self) -> _Expr:
        left = self.sum()
        token = self.peek()
        if token.kind == "op" and token.value in _COMPARE:
            self.advance()
            return _comparison(token.text, left, self.sum(), token.pos)
        negated = self.accept("keyword", "NOT") is not None
        if self.accept("keyword", "BETWEEN"):
            low = self.sum()
            self.expect("keyword", "AND", "AND of BETWEEN")
            return _between(left, low, self.sum(), negated)
        if self.accept("keyword", "IN"):
            return _string_test(left, "IN", frozenset(self.in_list()).__contains__, negated)
        if self.accept("keyword", "LIKE"):
            return _string_test(left, "LIKE", self.like_pattern().match, negated)
        if negated:
            raise self.expected("BETWEEN, IN or LIKE after NOT")
        if self.accept("keyword", "IS"):
            negated = self.accept("keyword", "NOT") is not None
            self.expect("keyword", "NULL", "NULL")
            return _is_null(left, negated)
        return left

    def in_list(self) -> list[str]:
        self.expect("op", "(", "'(' after IN")
        items = [self.string_literal("IN list takes string literals only")]
        while self.accept("op", ","):
            items.append(self.string_literal("IN list takes string literals only"))
        self.expect("op", ")", "',' or ')' in the IN list")
        return items

    def string_literal(self, rule: str) -> str:
        token = self.advance()
        if token.kind != "string":
            raise _SyntaxError(f"{rule}; found {token.describe()} at position {token.pos}")
        return cast("str", token.value)

    def like_pattern(self) -> re.Pattern[str]:
        pos = self.peek().pos
        pattern = self.string_literal("LIKE takes a string literal pattern")
        escape: str | None = None
        if self.accept("keyword", "ESCAPE"):
            escape_pos = self.peek().pos
            escape = self.string_literal("ESCAPE takes a string literal")
            if len(escape) != 1:
                raise _SyntaxError(
                    f"ESCAPE at position {escape_pos} takes one character, found {len(escape)}"
                )
        return _like_pattern(pattern, escape, pos)

    def sum(self) -> _Expr:
        return self.arithmetic(("+", "-"), self.product)

    def product(self) -> _Expr:
        return self.arithmetic(("*", "/"), self.signed)

    def arithmetic(self, ops: tuple[str, str], operand: Callable[[], _Expr]) -> _Expr:
        first = operand()
        rest: list[tuple[str, _Expr]] = []
        while self.peek().kind == "op" and self.peek().value in ops:
            op = self.advance().text
            rest.append((op, operand()))
        return _arithmetic(first, rest) if rest else first

    def signed(self) -> _Expr:
        token = self.peek()
        if token.kind != "op" or token.value not in ("+", "-"):
            return self.primary()
        self.advance()
        self.enter(token)
        operand = self.signed()
        self.depth -= 1
        if token.value == "+":
            operand = replace(operand, kind=_Kind.NUM, fn=_number_fn(operand, "a sign"))
        else:
            operand = _negative(operand)
        return replace(operand, pos=token.pos, name=None)

    def primary(self) -> _Expr:
        token = self.peek()
        if self.accept("op", "("):
            self.enter(token)
            inner = self.condition()
            self.expect("op", ")", "')'")
            self.depth -= 1
            return inner
        if token.kind == "keyword" and token.value == "NULL":
            raise _SyntaxError(f"NULL at position {token.pos} is allowed only in IS [NOT] NULL")
        operand = _operand(token)
        if operand is None:
            raise self.expected("a value, an identifier or '('")
        self.advance()
        return operand


def _operand(token: _Token) -> _Expr | None:
    """The literal or identifier `token` is, if it is one."""
    if token.kind == "number":
        return _constant(_Kind.NUM, token.value, token.pos)
    if token.kind == "string":
        return _constant(_Kind.STR, token.value, token.pos)
    if token.kind == "keyword" and token.value in ("TRUE", "FALSE"):
        return _constant(_Kind.BOOL, token.value == "TRUE", token.pos)
    if token.kind != "word":
        return None
    name = cast("str", token.value)
    kind, fn = _JMS_FIELDS.get(name) or (_Kind.HEADER, lambda c: c.header(name))
    return _Expr(kind, fn, token.pos, name)
