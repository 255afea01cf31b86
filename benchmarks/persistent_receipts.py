"""Persistent throughput with a RECEIPT per SEND, under each journal sync policy.

Starts `sluiceway broker` as a separate process for each policy (a fresh data directory each
time), then runs C producer connections, each sending persistent 1 KiB messages one after the
other and waiting for every RECEIPT (so each message is on disk, per the policy, before the next
is sent). No consumer is attached. Prints a table and writes benchmarks/results/persistence.json.

    .venv/bin/python benchmarks/persistent_receipts.py [--messages N] [--connections 1,4,16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from sluiceway.protocol.codec import FrameDecoder, encode_frame
from sluiceway.protocol.frames import Frame, StompVersion
from sluiceway.testing import BrokerProcess

RESULTS = Path(__file__).parent / "results" / "persistence.json"
BODY = b"x" * 1024


async def producer(port: int, count: int, name: str) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    decoder = FrameDecoder()
    writer.write(encode_frame(Frame("CONNECT", {"accept-version": "1.2", "host": "bench"})))
    await _next(reader, decoder, "CONNECTED")
    decoder.version = StompVersion.V1_2
    for i in range(count):
        frame = Frame(
            "SEND",
            {"destination": "/queue/bench", "persistent": "true", "receipt": f"{name}-{i}"},
            BODY,
        )
        writer.write(encode_frame(frame, StompVersion.V1_2))
        await _next(reader, decoder, "RECEIPT")
    writer.close()
    await writer.wait_closed()


async def _next(reader: asyncio.StreamReader, decoder: FrameDecoder, command: str) -> Frame:
    while True:
        event = decoder.next_event()
        if isinstance(event, Frame):
            if event.command != command:
                raise RuntimeError(f"expected {command}, got {event}")
            return event
        if event is None:
            data = await reader.read(65536)
            if not data:
                raise RuntimeError("the broker closed the connection")
            decoder.receive_data(data)


async def run(port: int, connections: int, messages: int) -> float:
    per_connection = messages // connections
    started = time.perf_counter()
    await asyncio.gather(*(producer(port, per_connection, f"p{c}") for c in range(connections)))
    return per_connection * connections / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--connections", default="1,4,16")
    args = parser.parse_args()
    counts = [int(c) for c in args.connections.split(",")]
    rows = []
    for policy in ("always", "group", "os"):
        for connections in counts:
            with BrokerProcess(
                "-D", f"imq.persist.file.sync.policy={policy}", data_dir=tempfile.mkdtemp()
            ) as broker:
                rate = asyncio.run(run(broker.port, connections, args.messages))
                broker.stop()
            rows.append({"policy": policy, "connections": connections, "messages_per_s": rate})
            print(f"{policy:>6}  {connections:>3} connections  {rate:10,.0f} msgs/s", flush=True)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "benchmark": "persistent SEND with a RECEIPT each, 1 KiB bodies, no consumer",
                "messages": args.messages,
                "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
                "python": platform.python_version(),
                "results": rows,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
