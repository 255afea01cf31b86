"""Aligned text tables and name/value listings, as imqcmd prints them, or the JSON instead.

A column reads one field of a JSON object (a dotted path such as `trend.msgs_peak`); columns
may share a group title printed above them (imqcmd's `Msgs` over `In` and `Out`). Numbers are
right-aligned, text left-aligned; a missing or empty value prints as `-`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TextIO

GAP: Final = "  "  # between columns
MISSING: Final = "-"


@dataclass(frozen=True, slots=True)
class Column:
    title: str
    key: str  # dotted path into the row's JSON object
    group: str = ""  # title shared with the neighbouring columns of the same group
    numeric: bool = True


def lookup(row: Mapping[str, Any], key: str) -> Any:
    """The value at dotted path `key` in `row`, or None where the path does not exist."""
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def cell(value: Any) -> str:
    if value is None or value == "":
        return MISSING
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.1f}"
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value) or MISSING
    return str(value)


class Table:
    """Column widths fixed from the titles and the first rows, so later rows (the samples of
    `metrics -int`) line up under the same header."""

    def __init__(self, columns: Sequence[Column], min_width: int = 0) -> None:
        self.columns = list(columns)
        self.widths = [max(len(c.title), min_width) for c in self.columns]

    def cells(self, row: Mapping[str, Any]) -> list[str]:
        return [cell(lookup(row, c.key)) for c in self.columns]

    def fit(self, rows: Iterable[Sequence[str]]) -> None:
        for row in rows:
            self.widths = [max(w, len(text)) for w, text in zip(self.widths, row, strict=True)]
        for group, first, last in self._groups():
            span = sum(self.widths[first : last + 1]) + len(GAP) * (last - first)
            if len(group) > span:
                self.widths[last] += len(group) - span

    def _groups(self) -> list[tuple[str, int, int]]:
        """(group title, first column, last column) of each run of columns with a group."""
        runs: list[tuple[str, int, int]] = []
        for index, column in enumerate(self.columns):
            if not column.group:
                continue
            if runs and runs[-1][0] == column.group and runs[-1][2] == index - 1:
                runs[-1] = (column.group, runs[-1][1], index)
            else:
                runs.append((column.group, index, index))
        return runs

    def header(self) -> list[str]:
        lines = []
        groups = self._groups()
        if groups:
            line = ""
            for group, first, last in groups:
                start = sum(w + len(GAP) for w in self.widths[:first])
                span = sum(self.widths[first : last + 1]) + len(GAP) * (last - first)
                line = line.ljust(start) + group.center(span).rstrip()
            lines.append(line)
        lines.append(self.line([c.title for c in self.columns]))
        rule = "-" * (sum(self.widths) + len(GAP) * (len(self.widths) - 1))
        return [rule, *lines, rule]

    def line(self, cells: Sequence[str]) -> str:
        parts = [
            text.rjust(width) if column.numeric else text.ljust(width)
            for column, width, text in zip(self.columns, self.widths, cells, strict=True)
        ]
        return GAP.join(parts).rstrip()


def render(columns: Sequence[Column], rows: Iterable[Mapping[str, Any]]) -> str:
    """A whole table: rule, header, rule, one line per row."""
    table = Table(columns)
    body = [table.cells(row) for row in rows]
    table.fit(body)
    return "\n".join([*table.header(), *(table.line(cells) for cells in body)]) + "\n"


def render_pairs(pairs: Iterable[tuple[str, Any]], indent: str = "") -> str:
    """Name/value lines with the values aligned (`query dst`, `query bkr`)."""
    items = [(name, cell(value)) for name, value in pairs]
    width = max((len(name) for name, _ in items), default=0)
    return "".join(f"{indent}{name.ljust(width)}{GAP}{value}\n" for name, value in items)


def json_or_text(
    out: TextIO, as_json: bool, answer: Any, text: Callable[[], str], indent: int | None = 2
) -> None:
    """Write `answer` as JSON (--json; indent None: on one line), else `text()`, made for people
    from it and called only then. Either ends with a line end; an empty text writes nothing."""
    shown = json.dumps(answer, indent=indent) if as_json else text()
    out.write(shown if not shown or shown.endswith("\n") else shown + "\n")
