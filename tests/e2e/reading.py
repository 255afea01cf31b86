"""Cursor and lease frames for the raw client (docs/pipelines-protocol.md), shared by the
end-to-end and persistence tests."""

from __future__ import annotations

import itertools

from sluiceway.protocol.frames import Frame
from tests.e2e.rawclient import RawClient

_ids = itertools.count(1)


def read(client: RawClient, destination: str, **headers: str) -> tuple[list[Frame], Frame]:
    """SUBSCRIBE with `headers` (_ for -), collect the messages up to the end marker, then
    UNSUBSCRIBE; return the messages and the end marker."""
    sub_id = f"read-{next(_ids)}"
    fields = {"destination": destination, "id": sub_id}
    fields.update({k.replace("_", "-"): v for k, v in headers.items()})
    client.request("SUBSCRIBE", fields)
    messages = []
    while True:
        (message,) = client.receive(1)
        if message.headers.get("browser") == "end":
            break
        messages.append(message)
    client.request("UNSUBSCRIBE", {"id": sub_id})
    return messages, message


def read_lease(
    client: RawClient, queue: str, name: str, **headers: str
) -> tuple[list[Frame], Frame]:
    return read(client, queue, lease=name, **headers)


def read_cursor(
    client: RawClient, topic: str, group: str, **headers: str
) -> tuple[list[Frame], Frame]:
    return read(client, topic, browser="true", cursor=group, **headers)


def end_lease(client: RawClient, queue: str, name: str, command: str = "ACK") -> Frame:
    """ACK (acknowledge) or NACK (release) lease `name`; return the RECEIPT."""
    return client.request(command, {"id": "lease", "destination": queue, "lease": name})


def commit(client: RawClient, topic: str, group: str, sequence: int | str) -> Frame:
    headers = {"id": "cursor", "destination": topic, "cursor": group, "sequence": str(sequence)}
    return client.request("ACK", headers)


def send(client: RawClient, destination: str, count: int, prefix: str = "m") -> None:
    """`count` persistent messages, each confirmed by a RECEIPT: prefix0, prefix1..."""
    for i in range(count):
        body = f"{prefix}{i}".encode()
        client.request("SEND", {"destination": destination, "persistent": "true"}, body)
