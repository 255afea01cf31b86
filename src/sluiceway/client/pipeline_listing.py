"""Listing destinations over a pipeline connection (`PipelineConnection.list_destinations`):
which destinations of the broker match a name or a pattern (`/queue/orders.*`), among those
the connection's user may consume or browse. The request and its answer are described in
docs/pipelines-protocol.md, "Listing destinations".

A broker that predates listings refuses a pattern as an invalid destination name (400), and
answers a listing of a plain name with a browse: its first MESSAGE has no `list-count`, and the
connection is closed at once (its browse would go on).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final, Protocol

from sluiceway.client.pipeline_values import optional_int
from sluiceway.client.protocol import Receipts
from sluiceway.errors import BrokerError, RemoteProtocolError
from sluiceway.protocol.frames import Frame

# The most names one answer holds unless asked otherwise (the broker's own default), and the
# most it may be asked for.
DEFAULT_LIST_MAX: Final = 1000
MAX_LIST: Final = 10_000


class ListRight(enum.Enum):
    """The right the user must have on each destination listed."""

    CONSUME = "consume"  # subscribe, read a cursor or a lease
    BROWSE = "browse"  # browse, read by range


@dataclass(frozen=True, slots=True)
class Listing:
    """The destinations a listing found, in sorted order; `truncated`: more matched than the
    answer could hold."""

    pattern: str
    paths: tuple[str, ...]
    truncated: bool


class ListLink(Protocol):
    """What a listing needs of its connection: frames out and in, and its receipt ids."""

    receipt_numbers: Iterator[int]  # shared by every request on the connection

    def connect(self) -> None: ...

    def close(self) -> None: ...

    def write_frame(self, frame: Frame) -> None: ...

    def next_frame(self) -> Frame: ...

    def failed(self, frame: Frame) -> BrokerError: ...


def listing_headers(pattern: str, right: ListRight, limit: int) -> dict[str, str]:
    """The SUBSCRIBE headers (without `id` and `receipt`) of a listing."""
    if not 1 <= limit <= MAX_LIST:
        raise ValueError(f"a listing names 1 to {MAX_LIST} destinations; asked for {limit}")
    return {"destination": pattern, "browser": "true", "list": right.value, "list-max": str(limit)}


def list_once(link: ListLink, headers: dict[str, str]) -> Listing:
    """Send the listing SUBSCRIBE and wait for both its answer and its RECEIPT (in any order)."""
    link.connect()
    sub_id = f"p{next(link.receipt_numbers)}"
    receipts: Receipts[None] = Receipts(link.receipt_numbers)
    link.write_frame(receipts.ask(Frame("SUBSCRIBE", {**headers, "id": sub_id}), None, "r"))
    receipt: Frame | None = None
    answer: Frame | None = None
    while receipt is None or answer is None:
        frame = link.next_frame()
        if frame.command == "ERROR":
            raise link.failed(frame)
        replied = receipts.answer(frame)
        if replied is not None:
            if replied.error is not None:  # refused: no answer follows
                raise replied.error
            receipt = replied.receipt
        elif frame.command == "MESSAGE" and frame.headers.get("subscription") == sub_id:
            if "list-count" not in frame.headers:
                link.close()
                raise RemoteProtocolError(
                    f"the broker answered the listing of {headers['destination']} with a "
                    "browse: it predates listings (docs/pipelines-protocol.md)"
                )
            answer = frame
    return parse_answer(answer, headers["destination"])


def parse_answer(frame: Frame, pattern: str) -> Listing:
    """The destinations a listing's answer names, checked against its `list-count`."""
    count = optional_int(frame.headers, "list-count")
    try:
        paths = tuple(frame.body.decode().splitlines())
    except UnicodeDecodeError:
        raise RemoteProtocolError(
            f"the answer to the listing of {pattern} is not UTF-8 text"
        ) from None
    if count != len(paths):
        raise RemoteProtocolError(
            f"the answer to the listing of {pattern} says list-count:{count} but names "
            f"{len(paths)} destinations"
        )
    return Listing(pattern, paths, frame.headers.get("list-truncated") == "true")
