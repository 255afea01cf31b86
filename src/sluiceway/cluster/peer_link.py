"""The link from this broker to one other member: it takes messages published there for the
consumers here, publishes them here, and only then acknowledges them there.

A link holds two STOMP connections of the client (client.link): *upstream* to the member (the
messages' home broker) and *local* to this broker's own listener over loopback. For each
destination this broker's consumers want (cluster.demand; the wanted set comes from
cluster.links), it subscribes upstream with `ack:client-individual`, the selector
`sluiceway_via IS NULL` (cluster.forwarding: never a message that already crossed) and a window
of at most `imq.cluster.consumerFlowLimit` messages. One task, the pump, does everything in
order: it subscribes and unsubscribes between batches, publishes each batch of received messages
here as SENDs, each asking for a RECEIPT, and acknowledges each upstream once its RECEIPT came
(or gives it back, NACK, if this broker refused it). A queue's messages are published only
while the room its local consumers have lasts (Budget, shared by the links of this broker); the
rest wait in the link, unacknowledged, which holds the home broker at the window.

Why this order holds across failures: this broker writes a SEND's RECEIPT after accepting it
and, for a persistent message, after its store synced it (session). So an ACK upstream always
follows a message safely stored here; if this broker dies before the ACK, the home broker gives
the message again to whoever consumes there (flagged redelivered): at least once, never lost. A
message the home broker redelivers to the link after the link had published it (the ACK was
lost with the connection) is recognised by its id (forwarding.Seen) and only acknowledged.

Why the local publish goes through STOMP rather than the core directly: the SENDs meet this
broker's producer flow control, limits and access rules like any producer's. A full local
destination holds the link's SENDs, so the RECEIPT waits, so the link's ACKs upstream wait,
so the home broker stops at the window: back-pressure across brokers, without code of its own.
The price is one connection per link, and one full destination holds the link's other
destinations too (SENDs of one connection are admitted in order).

A connection lost, or refused, ends both connections; the link starts again after a back-off
that doubles from LINK_RETRY_MIN_S to LINK_RETRY_MAX_S. What it held and had not acknowledged is
redelivered upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from sluiceway.client.link import Link
from sluiceway.client.settings import ClientSettings
from sluiceway.cluster.demand import link_client_id
from sluiceway.cluster.durables import is_durable_queue
from sluiceway.cluster.forwarding import LINK_SELECTOR, Seen, forwarded
from sluiceway.cluster.peers import Peer
from sluiceway.errors import BrokerError, ClientError, ProtocolError, RemoteProtocolError, Status
from sluiceway.naming import DestinationKind, DestinationName
from sluiceway.protocol.frames import Frame

log = logging.getLogger(__name__)

LINK_RETRY_MIN_S: Final = 0.2  # first wait before a lost link connects again
LINK_RETRY_MAX_S: Final = 5.0  # the back-off doubles up to this
REFUSED_PAUSE_S: Final = 2.0  # a destination that refused a forwarded message rests this long
IDLE_CHECK_S: Final = 0.5  # an idle pump looks at its connections at least this often
# Messages published at once: a batch is what arrived while the previous one was stored, so
# this bounds only the largest (one window of every destination could arrive at once).
MAX_BATCH: Final = 1000


@dataclass(frozen=True, slots=True)
class LinkSettings:
    """What every link of one broker shares."""

    broker_id: str  # this broker's imq.brokerid: the links' client id, the messages' via
    local_host: str  # this broker's STOMP listener, which the links publish to
    local_port: int
    flow_limit: int  # imq.cluster.consumerFlowLimit: most unacknowledged per destination
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    timeout: float = 10.0  # seconds for connecting, subscribing and unsubscribing
    heartbeat_s: float = 2.0  # heart-beats both ways on the links' connections

    def client(self, host: str, port: int, client_id: str) -> ClientSettings:
        return ClientSettings(
            addresses=((host, port),),
            username=self.username,
            password=self.password,
            client_id=client_id,
            reconnect_enabled=False,
            ping_interval=self.heartbeat_s,
        )


class Budget:
    """Messages the links may still publish here, per queue, until the demand is read again:
    the room of the queue's local consumers (cluster.demand), shared by every link, so that
    what all members send together stays within it. Topics are not budgeted: a topic keeps
    nothing for a subscriber that has no room (its window bounds it)."""

    def __init__(self) -> None:
        self._left: dict[DestinationName, int] = {}

    def refresh(self, rooms: Mapping[DestinationName, int]) -> None:
        self._left = dict(rooms)

    def take(self, name: DestinationName) -> bool:
        """Whether one more message of `name` may be published now (it is counted if so)."""
        if name.kind is DestinationKind.TOPIC:
            return True
        left = self._left.get(name, 0)
        if left <= 0:
            return False
        self._left[name] = left - 1
        return True


class LinkLost(ClientError):
    """One of a link's connections is gone (the other is then closed too)."""


class Route:
    """One destination the link subscribes to upstream: what has arrived for it and what is not
    yet acknowledged. A `Subscriber` of the upstream connection (client.link)."""

    def __init__(self, link: PeerLink, name: DestinationName, sub_id: str, window: int) -> None:
        self.link = link
        self.name = name
        self.subscription_id = sub_id
        self.window = window  # messages the home broker may send before an ACK
        self.unacked = 0  # received, not yet acknowledged or given back

    def deliver(self, frame: Frame, generation: int) -> None:
        self.unacked += 1
        if self.unacked > self.window:
            raise RemoteProtocolError(
                f"member {self.link.peer.broker_id} sent {self.unacked} messages of {self.name} "
                f"to a link whose window is {self.window}"
            )
        self.link.arrived(self, frame)

    def connection_lost(self) -> None:
        self.link.wake()

    def connection_closed(self, exc: BaseException) -> None:
        self.link.wake()

    async def resubscribe(self) -> None:  # the link never reconnects by itself
        raise NotImplementedError


class PeerLink:
    """This broker's link to `peer`; `want` tells it which destinations, `start` runs it."""

    def __init__(
        self,
        peer: Peer,
        settings: LinkSettings,
        seen: Seen | None = None,
        budget: Budget | None = None,
    ) -> None:
        self.peer = peer
        self.settings = settings
        self.budget = budget if budget is not None else Budget()
        # Kept by the owner per member, so a link made again (the member moved) still knows.
        self.seen = seen if seen is not None else Seen()
        self._wanted: dict[DestinationName, int] = {}  # destination -> window to ask for
        self._routes: dict[DestinationName, Route] = {}
        self._resting: dict[DestinationName, float] = {}  # refused: not before this loop time
        self._inbox: deque[tuple[Route, Frame]] = deque()  # at most the routes' windows
        self._wake = asyncio.Event()
        self._ids = itertools.count(1)
        self._upstream: Link | None = None
        self._local: Link | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.connected = asyncio.Event()  # set while both connections are up
        self.forwarded = 0  # messages published here
        self.duplicates = 0  # redeliveries recognised as already published
        self.failures = 0  # times the link was lost or refused

    # -- what the owner calls ------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"sluiceway-link-{self.peer.broker_id}")

    async def stop(self, timeout: float | None = None) -> None:
        """Finish the batch on its way (its RECEIPT and ACKs), then close: what the link holds
        beyond it goes back to its home broker. After `timeout` (default: the settings') the
        link is closed as it stands."""
        task, self._task = self._task, None
        if task is None:
            return
        self._stopping = True
        self.wake()
        wait = self.settings.timeout if timeout is None else timeout
        asked = cancel_requests()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), wait)
        finally:  # the caller cancelled meanwhile (the links stopping): the link still closes
            await end_task(task)
            await self._close()
        if cancel_requests() > asked:
            # Python 3.11's wait_for returns the result of a task that ended just as its caller
            # was cancelled, dropping the cancellation: it is passed on here.
            raise asyncio.CancelledError

    def want(self, wanted: dict[DestinationName, int]) -> None:
        """The destinations to subscribe to now, each with the window to ask for."""
        if wanted != self._wanted:
            self._wanted = wanted
            self.wake()

    @property
    def routes(self) -> dict[DestinationName, Route]:
        return dict(self._routes)

    # -- what the routes call ------------------------------------------------------------------

    def arrived(self, route: Route, frame: Frame) -> None:
        self._inbox.append((route, frame))
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    # -- running ---------------------------------------------------------------------------------

    async def _run(self) -> None:
        pause = LINK_RETRY_MIN_S
        while not self._stopping:
            try:
                await self._connect()
                pause = LINK_RETRY_MIN_S
                await self._serve()
            except (OSError, TimeoutError, ClientError, BrokerError, ProtocolError) as exc:
                self.failures += 1
                log.warning("link to member %s lost, retrying in %.1f s: %s", self.peer, pause, exc)
            except Exception:  # a bug must not end the link for good: it starts again
                self.failures += 1
                log.exception("link to member %s failed, retrying in %.1f s", self.peer, pause)
            finally:
                await self._close()
            if not self._stopping:
                await asyncio.sleep(pause)
            pause = min(pause * 2, LINK_RETRY_MAX_S)

    def _upstream_client_id(self) -> str:
        """The client id the link connects to its peer with."""
        return link_client_id(self.settings.broker_id)

    def _subscription(self, route: Route) -> dict[str, str]:
        """The SUBSCRIBE headers of `route` at the peer (its id, ack mode and window are set)."""
        return {"destination": route.name.path, "selector": LINK_SELECTOR}

    def _may_publish(self) -> bool:
        """Whether what arrived may be published here now (beyond the room budget)."""
        return True

    def _forwarded(self, frame: Frame) -> Frame:
        """The SEND that publishes here a MESSAGE received from the peer."""
        return forwarded(frame, self.peer.broker_id)

    async def _connect(self) -> None:
        settings = self.settings
        client_id = link_client_id(settings.broker_id)
        upstream_id = self._upstream_client_id()
        self._upstream = Link(settings.client(self.peer.host, self.peer.port, upstream_id))
        self._local = Link(settings.client(settings.local_host, settings.local_port, client_id))
        async with asyncio.timeout(settings.timeout):
            await self._upstream.open()
            await self._local.open()
        self.connected.set()
        log.info("linked to member %s", self.peer)

    async def _close(self) -> None:
        self.connected.clear()
        self._routes.clear()
        self._inbox.clear()
        for link in (self._upstream, self._local):
            if link is not None:
                with contextlib.suppress(ClientError, BrokerError, OSError):
                    await link.close()
        self._upstream = self._local = None

    async def _serve(self) -> None:
        while not self._stopping:
            upstream, local = self._links()
            await self._follow_wants(upstream)
            batch = self._next_batch()
            if not batch:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(IDLE_CHECK_S):
                        await self._wake.wait()
                continue
            await self._publish(batch, upstream, local)

    def _next_batch(self) -> list[tuple[Route, Frame]]:
        """What may be published now, in arrival order; a queue's messages beyond its budget
        wait in the inbox (unacknowledged: their home broker's window holds the rest back)."""
        batch: list[tuple[Route, Frame]] = []
        waiting: deque[tuple[Route, Frame]] = deque()
        for item in self._inbox:
            if len(batch) < MAX_BATCH and self._may_publish() and self.budget.take(item[0].name):
                batch.append(item)
            else:
                waiting.append(item)
        self._inbox = waiting
        return batch

    def _links(self) -> tuple[Link, Link]:
        upstream, local = self._upstream, self._local
        if upstream is None or local is None or upstream.closed or local.closed:
            raise LinkLost("a connection of the link closed")
        return upstream, local

    # -- subscriptions ---------------------------------------------------------------------------

    async def _follow_wants(self, upstream: Link) -> None:
        """Subscribe to what is wanted and not subscribed, unsubscribe from the rest. Runs
        between batches: no message of a route is then on its way here, so an UNSUBSCRIBE
        gives back upstream only what was never published here."""
        wanted = self._wanted
        for name, route in list(self._routes.items()):
            if name not in wanted or name in self._resting:
                await self._unsubscribe(upstream, route)
        now = asyncio.get_running_loop().time()
        for name, until in list(self._resting.items()):
            if until <= now:
                del self._resting[name]
        for name, window in wanted.items():
            if name not in self._routes and name not in self._resting:
                await self._subscribe(upstream, name, window)

    async def _subscribe(self, upstream: Link, name: DestinationName, window: int) -> None:
        route = Route(self, name, f"link-{next(self._ids)}", window)
        upstream.register(route)  # before the RECEIPT: messages may follow right behind it
        headers = self._subscription(route)
        headers["id"] = route.subscription_id
        headers["ack"] = "client-individual"
        headers["consumer-flow-limit"] = str(window)
        frame = Frame("SUBSCRIBE", headers)
        try:
            await upstream.request(frame, self.settings.timeout)
        except BrokerError as exc:  # refused there (access rights, limits): try again later
            upstream.unregister(route)
            # A durable subscriber's queue exists only where one attached: not a fault.
            quiet = exc.status is Status.NOT_FOUND and is_durable_queue(name)
            why = f"member {self.peer.broker_id} refused the subscription: {exc}"
            self._rest(name, why, quiet=quiet)
            return
        self._routes[name] = route

    async def _unsubscribe(self, upstream: Link, route: Route) -> None:
        # What arrived and is not yet published goes back upstream with the subscription.
        self._inbox = deque(item for item in self._inbox if item[0] is not route)
        del self._routes[route.name]
        upstream.unregister(route)
        frame = Frame("UNSUBSCRIBE", {"id": route.subscription_id})
        await upstream.request(frame, self.settings.timeout)

    def _rest(self, name: DestinationName, why: str, *, quiet: bool = False) -> None:
        if name in self._resting:
            return  # told once per rest
        log.log(
            logging.DEBUG if quiet else logging.WARNING,
            "link to member %s leaves %s for %.0f s: %s",
            self.peer,
            name,
            REFUSED_PAUSE_S,
            why,
        )
        self._resting[name] = asyncio.get_running_loop().time() + REFUSED_PAUSE_S

    # -- forwarding ------------------------------------------------------------------------------

    async def _publish(self, batch: list[tuple[Route, Frame]], upstream: Link, local: Link) -> None:
        """Publish `batch` here, in order, then acknowledge it upstream."""
        fresh: list[tuple[Route, Frame]] = []
        for route, frame in batch:
            # Ids are unique for good (a broker run's own prefix): one seen before is a
            # redelivery, whether or not its home could still tell (a home that crashed may
            # not have recorded the first delivery).
            if frame.headers.get("message-id", "") in self.seen:
                self.duplicates += 1
                self._settle(upstream, route, frame, "ACK")
            else:
                fresh.append((route, frame))
        if not fresh:
            return
        # Every SEND asks for its own RECEIPT, so a refusal (a failed receipt: the connection
        # stays) names the one message it refuses. The requests start in order, and each
        # writes its SEND before it first waits, so the SENDs go out in arrival order.
        outcomes = await asyncio.gather(
            *(local.request(self._forwarded(frame), None) for _, frame in fresh),
            return_exceptions=True,
        )
        accepted = [
            item for item, outcome in zip(fresh, outcomes, strict=True) if not _failed(outcome)
        ]
        for _, frame in accepted:  # all of them first: an ACK below may find the link gone
            self.seen.add(frame.headers.get("message-id", ""))
        for route, frame in accepted:
            self._settle(upstream, route, frame, "ACK")
        self.forwarded += len(accepted)
        lost: BaseException | None = None
        for (route, frame), outcome in zip(fresh, outcomes, strict=True):
            if isinstance(outcome, BrokerError):  # refused here: its home broker keeps it
                self._settle(upstream, route, frame, "NACK")
                self._rest(route.name, f"this broker refused a forwarded message: {outcome}")
            elif isinstance(outcome, BaseException):
                lost = outcome  # not known to be here: left unacknowledged, its home resends
        if lost is not None:
            raise LinkLost(f"the connection to this broker was lost: {lost}") from lost

    def _settle(self, upstream: Link, route: Route, frame: Frame, verb: str) -> None:
        route.unacked -= 1
        if not upstream.send_nowait(Frame(verb, {"id": frame.headers.get("ack", "")})):
            raise LinkLost(f"the connection to member {self.peer.broker_id} closed")


def _failed(outcome: object) -> bool:
    return isinstance(outcome, BaseException)


async def end_task(task: asyncio.Task[None]) -> None:
    """Cancel `task` and wait until it has ended. Its own cancellation is not passed on; the
    caller's is: a caller cancelled while it waits here (a link stopped while the links that
    own it stop too) ends cancelled, rather than carrying on as if nothing had been asked."""
    asked = cancel_requests()
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        if cancel_requests() > asked:
            raise


def cancel_requests() -> int:
    """How many times the running task has been asked to cancel (and has not taken it back)."""
    current = asyncio.current_task()
    return 0 if current is None else current.cancelling()
