"""A backlog with no consumer, scaled down from `./dev bench backlog` (which runs a million).

A broker process; a pipelined producer that asks a receipt for every message and hears every
refusal; then a consumer drains. Every message is either delivered, in order, or was refused
with an error the producer saw, and the broker's resident memory stays bounded meanwhile.
"""

from __future__ import annotations

import asyncio
import tempfile

import pytest

from sluiceway.loadgen import Produced, RssSampler, drain, produce
from sluiceway.testing import BrokerProcess
from tests.admin.adminhttp import AdminHttp
from tests.e2e.support import eventually

QUEUE = "/queue/backlog"


@pytest.mark.timeout(120)
def test_reject_newest_accepts_up_to_the_limit_and_refuses_the_rest_audibly() -> None:
    limit, messages = 20_000, 60_000
    options = ("-D", f"imq.autocreate.destination.maxNumMsgs={limit}")
    with BrokerProcess(*options, data_dir=tempfile.mkdtemp()) as broker:
        sampler = RssSampler(broker.process.pid)
        sampler.start()
        produced = asyncio.run(produce(broker.port, QUEUE, messages))
        drained = asyncio.run(drain(broker.port, QUEUE, produced.accepted))
        peak = sampler.stop()
    assert produced.accepted == limit
    assert produced.refused == {"414": messages - limit}
    assert "maxNumMsgs is 20000 messages" in produced.first_refusal
    assert (drained.received, drained.out_of_order) == (limit, 0)
    # 20,000 x (1 KiB + objects) is about 30 MiB over an idle broker of about 30 MiB.
    assert peak < 120 * 2**20, f"peak RSS {peak / 2**20:.0f} MiB"


@pytest.mark.timeout(120)
def test_flow_control_holds_the_producer_and_delivers_everything_once_drained() -> None:
    limit, messages = 2_000, 30_000
    options = (
        *("-D", "imq.destination.queue.backlog.limitBehavior=FLOW_CONTROL"),
        *("-D", f"imq.destination.queue.backlog.maxNumMsgs={limit}"),
    )
    with BrokerProcess(*options, data_dir=tempfile.mkdtemp()) as broker:
        sampler = RssSampler(broker.process.pid)
        sampler.start()

        admin = AdminHttp(broker.admin_port)

        def held() -> bool:
            summary = admin.ok("GET", f"/destinations/queue/{QUEUE[7:]}")["summary"]
            return bool(summary["held_sends"])

        async def scenario() -> tuple[Produced, int]:
            progress = Produced()
            producer = asyncio.create_task(produce(broker.port, QUEUE, messages, progress=progress))
            # No consumer yet: once the queue is full the broker holds the next SEND instead of
            # accepting or refusing it, and the producer, its receipts all in, hears nothing more.
            await eventually(lambda: progress.accepted >= limit and held(), timeout=30)
            stalled_at = progress.accepted
            drained = await drain(broker.port, QUEUE, messages)
            assert (drained.received, drained.out_of_order) == (messages, 0)
            return await producer, stalled_at

        produced, stalled_at = asyncio.run(scenario())
        peak = sampler.stop()
    assert stalled_at == limit  # held exactly at maxNumMsgs, not refused
    assert (produced.accepted, produced.refused) == (messages, {})
    assert peak < 100 * 2**20, f"peak RSS {peak / 2**20:.0f} MiB"
