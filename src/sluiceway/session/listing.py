"""Listing destinations (docs/pipelines-protocol.md, "Listing destinations"), read and answered.

A browser SUBSCRIBE with `list:consume` or `list:browse` asks which destinations of this broker
match its `destination`, a name or a pattern (`/queue/orders.*`: `*` one segment, `>` the
rest), among those the connection's user may consume (or browse) when access control is on:
the others are left out, without a refusal, as if they did not exist. The answer comes at once,
as one MESSAGE, the read's end marker, whose body names them, one path a line, in sorted order.
No subscription is made: nothing stays open, and no UNSUBSCRIBE follows.

The answer is bounded: at most `list-max` names (default DEFAULT_LIST_MAX, at most MAX_LIST),
each a path of at most 207 characters, so about 2 MiB at most. `list-count` says how many it
names, `list-truncated:true` that more matched (the first ones in sorted order are named).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from sluiceway.errors import BadRequest
from sluiceway.naming import DestinationName, DestinationPattern, parse_pattern
from sluiceway.protocol.encoder import encode_frame
from sluiceway.protocol.frames import Frame, StompVersion
from sluiceway.security.access import Operation
from sluiceway.session import headers as h
from sluiceway.session.access import SessionAccess

LIST: Final = "list"
# Names per answer: enough for every destination one reader sensibly spreads over; each name
# costs the broker a match and an access check, and the client a line.
DEFAULT_LIST_MAX: Final = 1000
MAX_LIST: Final = 10_000
_RIGHTS: Final = {"consume": Operation.CONSUME, "browse": Operation.BROWSE}
# Headers of the other reads, which ask for something a listing cannot be.
_NOT_WITH_LIST: Final = (
    "cursor",
    "lease",
    "pack",
    "selector",
    "from-sequence",
    "to-sequence",
    *h.DURABLE_NAME_HEADERS,
)


@dataclass(frozen=True, slots=True)
class ListRequest:
    """What a listing SUBSCRIBE asks: the destinations matching `pattern` that its user may
    `right`, at most `limit` of them, answered on subscription `sub_id`."""

    sub_id: str
    pattern: DestinationPattern
    right: Operation
    limit: int


def is_listing(frame: Frame) -> bool:
    return LIST in frame.headers


def list_request(frame: Frame, version: StompVersion | None) -> ListRequest:
    """The listing a SUBSCRIBE with the `list` header asks for; BadRequest names what is wrong."""
    right = _RIGHTS.get(frame.headers[LIST])
    if right is None:
        raise BadRequest(
            "invalid list header",
            f"the list header of a SUBSCRIBE must be consume or browse (the right the user "
            f"must have on each destination listed); got {frame.headers[LIST]!r}",
        )
    if not h.boolean(frame, "browser", False):
        raise BadRequest(
            "list without browser:true",
            "a listing is a browser SUBSCRIBE: add browser:true (so that a broker without "
            "listings browses, and consumes nothing)",
        )
    for header in _NOT_WITH_LIST:
        if header in frame.headers:
            raise BadRequest(
                f"{header} with a listing",
                f"a listing SUBSCRIBE names destinations and reads no message: it cannot carry "
                f"the {header} header",
            )
    text = h.required(frame, "destination")
    try:
        pattern = parse_pattern(text)
    except ValueError as exc:
        raise BadRequest("invalid destination", str(exc)) from None
    sub_id = frame.headers.get("id")
    if sub_id is None:
        if version is not StompVersion.V1_0:
            raise BadRequest("missing id header", "a SUBSCRIBE frame must carry an id header")
        sub_id = text  # STOMP 1.0: the destination identifies the subscription
    limit = h.integer(frame, "list-max", DEFAULT_LIST_MAX, minimum=1, maximum=MAX_LIST)
    return ListRequest(sub_id, pattern, right, limit)


def permitted(access: SessionAccess, right: Operation) -> Callable[[DestinationName], bool]:
    """Whether the session's user may `right` a destination, as the access rules in force
    decide (always, without access control). Checked quietly: a listing refuses nothing."""
    rules, principal = access.rules, access.principal
    if rules is None or principal is None:
        return lambda _name: True
    return lambda name: rules.decide(principal, right, name.kind, name.name).allowed


def matching(
    names: Iterable[DestinationName],
    request: ListRequest,
    allowed: Callable[[DestinationName], bool],
) -> tuple[list[str], bool]:
    """The paths of `names` the request lists, sorted, at most its limit; and whether more
    matched."""
    pattern = request.pattern
    found = sorted(name.path for name in names if pattern.matches(name) and allowed(name))
    return found[: request.limit], len(found) > request.limit


def answer(
    request: ListRequest, paths: list[str], truncated: bool, version: StompVersion | None
) -> bytes:
    """The MESSAGE that answers a listing: the read's end marker, naming `paths` in its body."""
    headers = {
        "subscription": request.sub_id,
        "message-id": f"list-{request.sub_id}",
        "destination": request.pattern.path,
        "browser": "end",
        "list-count": str(len(paths)),
        "list-truncated": "true" if truncated else "false",
        "content-type": "text/plain;charset=utf-8",
    }
    body = "".join(f"{path}\n" for path in paths).encode()
    return encode_frame(Frame("MESSAGE", headers, body), version)


def listing(
    frame: Frame,
    version: StompVersion | None,
    names: Iterable[DestinationName],
    access: SessionAccess,
) -> bytes:
    """The answer to a listing SUBSCRIBE, among the destinations `names`."""
    request = list_request(frame, version)
    paths, truncated = matching(names, request, permitted(access, request.right))
    return answer(request, paths, truncated, version)
