"""A backlog of one million 1 KiB non-persistent messages produced to a queue with no consumer.

Starts `sluiceway broker` as a separate process per scenario (fresh data directory), samples its
resident memory every 50 ms, and runs a pipelined producer (every SEND with a receipt, at most
500 unanswered, `failed-receipts:true`, so every refusal is heard):

- `defaults`: the queue is created on first use with Open MQ's auto-create defaults
  (maxNumMsgs 100,000, REJECT_NEWEST): the first 100,000 are accepted, every later one is
  refused with status 414 naming maxNumMsgs. Then a consumer drains the queue.
- `flow-control`: the queue is defined with limitBehavior FLOW_CONTROL and maxNumMsgs 10,000.
  The producer is held once 10,000 wait; when it has made no progress for 2 s a consumer starts,
  and the producer goes on as the consumer makes room, until all are delivered.
- `swapped`: no message limit and throttling off: the whole backlog is accepted; from the YELLOW
  memory level (80 % of imq.memory.budget) new messages go to the swap area on disk.

For each: messages accepted and refused (as the producer heard), delivered afterwards (in
order), and the broker's peak RSS while filling and while draining. Prints a table and writes
benchmarks/results/backlog.json.

    .venv/bin/python benchmarks/backlog.py [--messages 1000000] [--scenarios defaults,...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from sluiceway.loadgen import Produced, RssSampler, drain, produce, rss
from sluiceway.testing import BrokerProcess

RESULTS = Path(__file__).parent / "results" / "backlog.json"
QUEUE = "/queue/backlog"
STALL_SECONDS = 2.0

SCENARIOS: dict[str, tuple[str, ...]] = {
    "defaults": (),
    "flow-control": (
        *("-D", "imq.destination.queue.backlog.limitBehavior=FLOW_CONTROL"),
        *("-D", "imq.destination.queue.backlog.maxNumMsgs=10000"),
    ),
    "swapped": (
        *("-D", "imq.autocreate.destination.maxNumMsgs=-1"),
        *("-D", "imq.throttling.server.threshold=0"),
    ),
}


async def scenario(name: str, port: int, pid: int, messages: int) -> dict[str, Any]:
    fill_sampler = RssSampler(pid)
    fill_sampler.start()
    progress = Produced()
    producer = asyncio.create_task(produce(port, QUEUE, messages, progress=progress))
    drained_early = None
    if name == "flow-control":
        # No consumer until the producer is held: then drain while it goes on.
        while not producer.done():
            await asyncio.sleep(0.2)
            idle = time.monotonic() - (progress.last_progress or time.monotonic())
            if progress.accepted and idle >= STALL_SECONDS:
                break
        held_at = progress.accepted
        fill_peak = fill_sampler.stop()
        drain_sampler = RssSampler(pid)
        drain_sampler.start()
        drained_early = await drain(port, QUEUE, messages)
        produced = await producer
        drain_peak = drain_sampler.stop()
        drained = drained_early
    else:
        produced = await producer
        held_at = produced.accepted
        fill_peak = fill_sampler.stop()
        drain_sampler = RssSampler(pid)
        drain_sampler.start()
        drained = await drain(port, QUEUE, produced.accepted)
        drain_peak = drain_sampler.stop()
    return {
        "scenario": name,
        "messages": messages,
        "accepted": produced.accepted,
        "refused": dict(produced.refused),
        "first_refusal": produced.first_refusal,
        "backlog_before_draining": held_at,
        "delivered": drained.received,
        "out_of_order": drained.out_of_order,
        "produce_seconds": round(produced.seconds, 1),
        "drain_seconds": round(drained.seconds, 1),
        "peak_rss_filling_mib": round(fill_peak / 2**20, 1),
        "peak_rss_draining_mib": round(drain_peak / 2**20, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    args = parser.parse_args()
    rows = []
    for name in args.scenarios.split(","):
        with BrokerProcess(*SCENARIOS[name], data_dir=tempfile.mkdtemp()) as broker:
            idle = rss(broker.process.pid)
            row = asyncio.run(scenario(name, broker.port, broker.process.pid, args.messages))
            row["idle_rss_mib"] = round(idle / 2**20, 1)
            broker.stop()
        rows.append(row)
        print(json.dumps(row), flush=True)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {"machine": f"{platform.machine()}, {platform.python_version()}", "runs": rows},
            indent=2,
        )
        + "\n"
    )
    print()
    print("| scenario | accepted | refused | delivered | peak RSS filling | peak RSS draining |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        refused = sum(row["refused"].values())
        print(
            f"| {row['scenario']} | {row['accepted']:,} | {refused:,} | {row['delivered']:,} | "
            f"{row['peak_rss_filling_mib']} MiB | {row['peak_rss_draining_mib']} MiB |"
        )


if __name__ == "__main__":
    main()
