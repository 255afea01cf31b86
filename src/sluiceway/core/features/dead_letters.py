"""The dead message queue, `/queue/mq.sys.dmq`: where messages that will never be delivered go.

A message is dead when it expired before delivery, was evicted from a full destination
(REMOVE_OLDEST / REMOVE_LOW_PRIORITY), or was delivered `maxDeliveryCount` times without being
acknowledged. If its destination has `useDMQ` (the default), a copy goes to the dead message queue
with the `JMS_SUN_DMQ_*` properties as headers (reason, timestamp, comment, delivery count,
original destination), no expiration, and no body when `imq.destination.DMQ.truncateBody` is set.

`DeadLetters` owns the queue and makes messages dead into it: it is the `DeadEnd` every other
destination is given (core.model.context). The queue itself is made with a context that has no dead
end, as its own messages are never copied anywhere.

The queue itself has Open MQ's settings: 1000 messages, 10 MiB, REMOVE_OLDEST (what overflows is
discarded, never sent on), no per-message limit; it cannot be destroyed, paused, or set to
FLOW_CONTROL, so making a message dead never blocks anything.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Final

from sluiceway.config import DestinationSettings, LimitBehavior
from sluiceway.core.features.limits import Verdict, destination_verdict, make_room
from sluiceway.core.model.context import Context
from sluiceway.core.model.queue import Queue
from sluiceway.core.values.live_config import LiveConfig
from sluiceway.core.values.message import Message
from sluiceway.core.values.message_ids import MessageIds
from sluiceway.naming import DestinationKind, DestinationName

log = logging.getLogger(__name__)

DMQ_NAME: Final = DestinationName(DestinationKind.QUEUE, "mq.sys.dmq")

DMQ_SETTINGS: Final = DestinationSettings(
    max_num_msgs=1000,
    max_total_msg_bytes=10 * 1024 * 1024,
    max_bytes_per_msg=-1,
    limit_behavior=LimitBehavior.REMOVE_OLDEST,
    use_dmq=False,
    consumer_flow_limit=1000,
)

# Dead reasons (JMS_SUN_DMQ_UNDELIVERED_REASON), as Open MQ names them.
EXPIRED: Final = "EXPIRED"
OLDEST: Final = "OLDEST"
LOW_PRIORITY: Final = "LOW_PRIORITY"
UNDELIVERABLE: Final = "UNDELIVERABLE"

_PREFIX: Final = "JMS_SUN_DMQ_"


def dead_copy(
    message: Message,
    *,
    message_id: str,
    reason: str,
    comment: str,
    now_ms: int,
    broker: str,
    truncate: bool,
) -> Message:
    """The copy of `message` that goes to the dead message queue."""
    headers = tuple((k, v) for k, v in message.headers if not k.startswith(_PREFIX))
    headers += (
        (f"{_PREFIX}UNDELIVERED_REASON", reason),
        (f"{_PREFIX}UNDELIVERED_TIMESTAMP", str(now_ms)),
        (f"{_PREFIX}UNDELIVERED_COMMENT", comment),
        (f"{_PREFIX}UNDELIVERED_DESTINATION", message.destination.path),
        (f"{_PREFIX}DELIVERY_COUNT", str(message.delivery_count)),
        (f"{_PREFIX}DEAD_BROKER", broker),
        (f"{_PREFIX}BODY_TRUNCATED", "true" if truncate else "false"),
        ("original-message-id", message.id),
    )
    return dataclasses.replace(
        message,
        id=message_id,
        destination=DMQ_NAME,
        body=b"" if truncate else message.body,
        headers=headers,
        expires=0,
        seq=0,
        delivery_count=0,
        location=0,
        marks=None,
        dead=False,
    )


class DeadLetters:
    """The dead message queue, and what makes a message dead into it."""

    def __init__(self, context: Context, ids: MessageIds, config: LiveConfig) -> None:
        self._clock = context.clock
        self._store = context.store
        self._ids = ids
        self._config = config
        self.queue = Queue(DMQ_NAME, DMQ_SETTINGS, context)

    def dead(self, source: DestinationName, message: Message, reason: str, comment: str) -> None:
        """`message` of `source` will never be delivered: a copy goes to the queue."""
        config = self._config.current
        if config.log_dead_messages:
            log.info("dead message %s from %s: %s (%s)", message.id, source, reason, comment)
        copy = dead_copy(
            message,
            message_id=self._ids.new(),
            reason=reason,
            comment=comment,
            now_ms=self._clock.time_ms(),
            broker=self._ids.instance_id,
            truncate=config.dmq_truncate_body,
        )
        if not self._keep(copy):
            log.warning(
                "dead message %s from %s (%s) is larger than the dead message queue and was "
                "discarded",
                message.id,
                source,
                reason,
            )

    def _keep(self, copy: Message) -> bool:
        """Publish a dead copy: no system limits, eviction by the queue's behaviour, never
        held. False if it could not be kept."""
        queue = self.queue
        settings = queue.settings
        admission = destination_verdict(
            DMQ_NAME.path,
            copy.size,
            queue.fullness(),
            max_count=settings.max_num_msgs,
            max_bytes=settings.max_total_msg_bytes,
            behavior=settings.limit_behavior,
        )
        if admission.verdict is Verdict.REJECT:
            return False
        if admission.verdict is Verdict.ACCEPT:
            queue.publish(copy)
            return True
        with self._store.atomic():  # evictions, their dead copies and the new message
            error = make_room(queue, copy)
            if error is None:
                queue.publish(copy)
        return error is None
