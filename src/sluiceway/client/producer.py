"""Producers: persistent by default, with an optional retry policy for refused sends.

A send waits for the broker's RECEIPT when `imqAckOnProduce` says so, or, when it is unset, when
the message is persistent (as Open MQ's client does). When the broker refuses the message
(destination full, a system limit, a message too large), the send raises the matching BrokerError
subclass (ResourceFull for 414, EntityTooLarge for 423, ...) carrying the status, the destination
and the limit with its value. "Using System-Wide Limits" advises pausing and retrying such a
send: a RetryPolicy does that, up to a deadline, and then raises the broker's last refusal.
A waiting send is bounded by the call's `timeout`, else by `imqAckTimeout`, and fails with
OperationTimeoutError when the broker does not answer in time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping

from sluiceway.client.retry import RetryPolicy
from sluiceway.client.session_state import SessionState
from sluiceway.protocol.frames import Frame

__all__ = ["Producer", "RetryPolicy"]

log = logging.getLogger(__name__)


class Producer:
    """Sends messages to one destination, or to any named at send time."""

    def __init__(
        self,
        session: SessionState,
        destination: str | None,
        *,
        persistent: bool,
        priority: int,
        time_to_live: float | None,
        retry: RetryPolicy | None,
    ) -> None:
        _check_priority(priority)
        self.session = session
        self.connection = session.connection
        self.destination = destination
        self.persistent = persistent
        self.priority = priority
        self.time_to_live = time_to_live
        self.retry = retry

    async def send(
        self,
        body: bytes | str,
        destination: str | None = None,
        *,
        persistent: bool | None = None,
        priority: int | None = None,
        time_to_live: float | None = None,
        headers: Mapping[str, str] | None = None,
        content_type: str | None = None,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        """Send one message; `time_to_live` in seconds (None: the producer's, else never)."""
        frame = self._frame(
            body,
            destination,
            persistent=self.persistent if persistent is None else persistent,
            priority=self.priority if priority is None else priority,
            time_to_live=self.time_to_live if time_to_live is None else time_to_live,
            headers=headers,
            content_type=content_type,
        )
        policy = retry or self.retry
        if policy is None:
            await self._send_once(frame, timeout)
            return
        started = time.monotonic()
        pause = policy.pause
        while True:
            try:
                await self._send_once(frame, timeout)
            except policy.retry_on as exc:
                if time.monotonic() - started + pause > policy.deadline:
                    raise
                log.info("send to %s refused (%s); retrying in %.1f s", exc.destination, exc, pause)
                await asyncio.sleep(pause)
                pause = min(pause * policy.backoff, policy.max_pause)
            else:
                return

    def _frame(
        self,
        body: bytes | str,
        destination: str | None,
        *,
        persistent: bool,
        priority: int,
        time_to_live: float | None,
        headers: Mapping[str, str] | None,
        content_type: str | None,
    ) -> Frame:
        target = destination or self.destination
        if target is None:
            raise ValueError("no destination: give one to the producer or to send()")
        _check_priority(priority)
        fields = dict(headers or {})
        if isinstance(body, str):
            body = body.encode()
            fields.setdefault("content-type", "text/plain;charset=utf-8")
        if content_type is not None:
            fields["content-type"] = content_type
        fields.update(
            {
                "destination": target,
                "persistent": str(persistent).lower(),
                "priority": str(priority),
            }
        )
        if time_to_live is not None:
            if time_to_live < 0:
                raise ValueError("time_to_live must be 0 or more seconds")
            fields["expires"] = str(time.time_ns() // 1_000_000 + round(time_to_live * 1000))
        if self.session.transacted:
            fields["transaction"] = self.session.transaction()
        return Frame("SEND", fields, body)

    async def _send_once(self, frame: Frame, timeout: float | None) -> None:
        ack_on_produce = self.connection.settings.ack_on_produce
        persistent = frame.headers["persistent"] == "true"
        if ack_on_produce if ack_on_produce is not None else persistent:
            await self.connection.request(frame, timeout)
        else:
            await self.connection.send(frame)


def _check_priority(priority: int) -> None:
    if not 0 <= priority <= 9:
        raise ValueError(f"priority must be from 0 to 9, not {priority}")
