"""Everything a running broker serves, started and stopped together, and its periodic tick.

- STOMP over TCP (`imq.stomp.tcp.port`), unless -1;
- STOMP over TLS (`imq.stomp.tls.port`), when set;
- STOMP over WebSocket (`imq.stomp.ws.port`, wss with `imq.stomp.ws.tls`), when set;
- the admin endpoint (`imq.admin.http.port`): the HTTP JSON API, the web console, /metrics.

At least one of the three STOMP listeners is on (the configuration refuses otherwise). The TLS
services share one SSL context, loaded (and its certificate's dates checked) once at start.

The tick (once a second) runs the core's periodic work (which also retries journal writes that
wait for a full disk, and measures its free space), feeds it the bytes waiting in write buffers
(they count against the memory budget), reads again the clients it stopped reading while the
disk could not take the journal's records, and samples the metrics.

With imq.cluster.ha the broker is a cluster member (cluster.member). `join_cluster` joins
before the store is opened (a broker that may not join touches nothing, and the store's fence
needs the epoch it joined with); the member it returns is given to Services, and left after the
store is closed. Services given none joins itself before any listener is bound, and leaves when
it stops. Services records the listeners' addresses once they are bound, and hands the lease to
every listener as their fence. When the lease is lost the broker stops serving: one ERROR line
says why, every client gets an ERROR saying so, the tick does no more work, the services stop,
and `when_fenced` callbacks run (the command line then exits with a failure status).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import ssl
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Final, Protocol

from sluiceway.admin.history import HistoryWriter
from sluiceway.admin.http import AdminServer
from sluiceway.admin.metrics import MetricsSampler
from sluiceway.cluster.adoption import OnLoop, loop_caller
from sluiceway.cluster.lease import FencedError
from sluiceway.cluster.links import Links, cluster_links
from sluiceway.cluster.member import ClusterMember
from sluiceway.cluster.positions import own_positions
from sluiceway.cluster.shared_counts import SharedCounts
from sluiceway.cluster.store_takeover import takeover_for
from sluiceway.config import BrokerConfig
from sluiceway.core.broker import Broker
from sluiceway.errors import ConfigError
from sluiceway.security.access import Gate, check_security_files
from sluiceway.security.watch import AccessWatcher
from sluiceway.server.snapshots import ConnectionInfo, Traffic
from sluiceway.server.stomp_server import StompServer, open_sessions
from sluiceway.server.tls import needs_tls, server_context
from sluiceway.server.websocket import WebSocketServer

log = logging.getLogger(__name__)

TICK_INTERVAL_S: Final = 1.0  # expiry sweeps, deadlines, memory and metrics at most this often


class Listener(Protocol):
    """A service that carries STOMP connections (TCP, TLS, WebSocket)."""

    name: str

    @property
    def address(self) -> tuple[str, int]: ...

    @property
    def write_buffered(self) -> int: ...

    def connections(self) -> list[ConnectionInfo]: ...

    def traffic(self) -> Traffic: ...

    def synced(self) -> None: ...

    def flush_store(self) -> None: ...

    def resume_input(self) -> None: ...

    async def stop(self) -> None: ...


class Services:
    """The listeners, the admin endpoint and the tick of one broker."""

    def __init__(self, broker: Broker, cluster: ClusterMember | None = None) -> None:
        """`cluster`: this broker's membership, joined by `join_cluster` (its owner leaves);
        None with imq.cluster.ha: Services joins and leaves itself."""
        self.broker = broker
        self.config: BrokerConfig = broker.config
        self.gate = Gate(self.config) if self.config.authentication else None
        self._owns_cluster = cluster is None and self.config.cluster_ha
        if self._owns_cluster:
            cluster = ClusterMember(self.config)
        self.cluster = cluster
        if cluster is not None:
            cluster.count_messages(lambda: broker.context.system.count)
        self.fence = self.cluster.lease if self.cluster is not None else None
        self.fenced: str | None = None  # why the cluster lease was lost; None while it holds
        self._on_fenced: list[Callable[[], None]] = []
        self._stopped: asyncio.Future[None] | None = None
        # The plain STOMP listener; None when imq.stomp.tcp.port is -1.
        self.stomp = (
            StompServer(broker, "stomp", self.gate, self.fence)
            if self.config.stomp_port >= 0
            else None
        )
        self.listeners: list[Listener] = [self.stomp] if self.stomp is not None else []
        self.admin: AdminServer | None = None
        self.metrics = MetricsSampler(broker, self)
        self.started = time.time()
        self.history: HistoryWriter | None = None
        self._tick: asyncio.TimerHandle | None = None
        self._on_tick: list[Callable[[], None]] = []  # extra periodic work (metrics history)
        self.links: Links | None = None  # to the other members of a cluster (cluster.links)
        self.counts: SharedCounts | None = None  # queue counts shared with the other members

    async def start(self) -> None:
        config = self.config
        check_exposure(config)
        check_security_files(config)
        # The certificate is loaded before anything binds: a broker that cannot serve every
        # service it was asked for refuses to start, and leaves no port open behind it.
        tls = server_context(config) if needs_tls(config) else None
        if self.cluster is None:
            await self._start_services(tls)
        else:
            await self._start_member(self.cluster, tls)
        self._tick = asyncio.get_running_loop().call_later(TICK_INTERVAL_S, self._run_tick)

    async def _start_member(self, cluster: ClusterMember, tls: ssl.SSLContext | None) -> None:
        """Join (unless joined already), serve, and record where; leave again if that fails."""
        loop = asyncio.get_running_loop()

        def lost(reason: str) -> None:  # called from the cluster's threads too
            loop.call_soon_threadsafe(self._lease_lost, reason)

        cluster.lease.set_on_lost(lost)
        if self._owns_cluster:
            await asyncio.to_thread(cluster.join)
        try:
            await self._start_services(tls)
            self._start_cluster_work(cluster, loop_caller(loop))
            shown = {name: f"{host}:{port}" for name, (host, port) in self.addresses().items()}
            stomp = next((shown[n] for n in ("stomp", "stomp-tls", "ws") if n in shown), "")
            await asyncio.to_thread(cluster.start, stomp, shown.get("admin", ""))
        except BaseException:
            if self._owns_cluster:
                await asyncio.to_thread(cluster.stop)  # leaves: it never served
            raise
        if self.fenced is not None:
            raise FencedError(f"this broker lost its cluster lease while starting: {self.fenced}")

    def _start_cluster_work(self, cluster: ClusterMember, on_loop: OnLoop) -> None:
        """Before the monitor starts: what takes failed members' stores over (with the jdbc
        store), and the exchange of queue counts that makes limits hold for the cluster."""
        config, broker = self.config, self.broker
        if config.persist_store == "jdbc":
            root = Path(config.data_directory).resolve()
            links = self.links
            cluster.monitor.takeover = takeover_for(
                config,
                broker,
                root,
                cluster.database,
                on_loop,
                forwarded=links.forwarded_from if links is not None else None,
            )
        self.counts = SharedCounts(
            cluster.database,
            config.cluster_id,
            config.broker_id,
            broker,
            on_loop,
            interval=config.heartbeat_interval,
        )
        self.counts.start()

    async def _start_services(self, tls: ssl.SSLContext | None) -> None:
        config = self.config
        if self.stomp is not None:
            await self.stomp.start()
        if config.stomp_tls_port >= 0:
            stomp_tls = StompServer(self.broker, "stomp-tls", self.gate, self.fence)
            await stomp_tls.start(port=config.stomp_tls_port, tls=tls)
            self.listeners.append(stomp_tls)
        if config.ws_port >= 0:
            ws = WebSocketServer(self.broker, "ws", self.gate, self.fence)
            await ws.start(tls=tls if config.ws_tls else None)
            self.listeners.append(ws)
        if config.admin_port >= 0:
            self.admin = AdminServer(self)
            await self.admin.start(tls if config.admin_tls else None)
        if config.metrics_enabled and config.metrics_retention_h and config.persist_store == "file":
            self.history = HistoryWriter(self, Path(config.data_directory) / "metrics")
            self.every_tick(self.history.tick)
        if config.cluster_ha:
            broker = self.broker
            positions = partial(own_positions, broker.leases, broker.stages)
            self.links = cluster_links(broker, config, self.addresses().get("stomp"), positions)
            # Subscribers here of durable subscriptions living on other members (cluster.durables).
            broker.durable_homes = self.links.directory
            # Pipeline lease groups and sinks living on other members (cluster.positions).
            if self.links.positions is not None:
                broker.leases.homes = broker.stages.homes = self.links.positions.directory
            self.links.start()
        if self.gate is not None:  # deleted users and revoked rights reach open connections
            watcher = AccessWatcher(self.gate, lambda: open_sessions(self.listeners))
            self.every_tick(watcher.tick)

    def every_tick(self, work: Callable[[], None]) -> None:
        self._on_tick.append(work)

    def when_fenced(self, callback: Callable[[], None]) -> None:
        """Call `callback` on the event loop when the cluster lease is lost (at once when it
        was lost already)."""
        self._on_fenced.append(callback)
        if self.fenced is not None:
            callback()

    def _lease_lost(self, reason: str) -> None:
        if self.fenced is not None:
            return
        self.fenced = reason
        if self._tick is None:
            return  # still starting: start() refuses to go on
        log.error("stopping: this broker lost its cluster lease: %s", reason)
        # Every client is told at once, idle ones included; the listeners and the admin
        # endpoint close with them.
        self._stopped = asyncio.ensure_future(self._stop())
        for callback in self._on_fenced:
            callback()

    def _run_tick(self) -> None:
        if self.fence is not None and not self.fence.holds():
            # Fenced: nothing expires, is redelivered or sampled any more.
            self._tick = asyncio.get_running_loop().call_later(TICK_INTERVAL_S, self._run_tick)
            return
        try:
            # The bytes waiting in write buffers count against the memory budget too.
            self.broker.ledger.external = sum(s.write_buffered for s in self.listeners)
            disk = self.broker.disk
            reading_stopped = disk.reading_stopped
            self.broker.tick()  # (retries the journal's writes that wait for the disk)
            if reading_stopped and not disk.reading_stopped:
                for listener in self.listeners:
                    listener.resume_input()
            if self.config.metrics_enabled:
                self.metrics.sample()
            for work in self._on_tick:
                work()
            store = self.broker.store  # hand the journal's appended records to the OS
            if store.buffered:
                store.flush()
        except Exception:  # the tick must survive a bug in one sweep
            log.exception("periodic broker work failed")
        self._tick = asyncio.get_running_loop().call_later(TICK_INTERVAL_S, self._run_tick)

    def synced(self) -> None:
        """The journal synced further: release the frames that waited for it, everywhere."""
        for listener in self.listeners:
            listener.synced()

    def addresses(self) -> dict[str, tuple[str, int]]:
        """Service name -> the host and port it is bound to (ports chosen by the OS included)."""
        found = {listener.name: listener.address for listener in self.listeners}
        if self.admin is not None:
            found["admin"] = self.admin.address
        return found

    def ready_line(self) -> str:
        """What listens, and where: `STOMP on 127.0.0.1:61613, admin on 127.0.0.1:61680`."""
        addresses = self.addresses()
        labels = {
            "stomp": "STOMP",
            "stomp-tls": "STOMP+TLS",
            "ws": "STOMP over WebSocket",
            "admin": "admin",
        }
        return ", ".join(
            f"{label} on {addresses[name][0]}:{addresses[name][1]}"
            for name, label in labels.items()
            if name in addresses
        )

    def connections(self) -> list[ConnectionInfo]:
        """A snapshot of every open STOMP connection, whatever carries it."""
        return [info for listener in self.listeners for info in listener.connections()]

    @property
    def connection_count(self) -> int:
        return sum(len(listener.connections()) for listener in self.listeners)

    async def stop(self) -> None:
        """Stop the tick and the admin endpoint, tell every client the broker is going, close.
        Called again (the broker was fenced and stops itself), waits for the same stop."""
        if self._stopped is None:
            self._stopped = asyncio.ensure_future(self._stop())
        await self._stopped

    async def _stop(self) -> None:
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        if self.links is not None:  # first: what crosses now is finished while STOMP still runs
            await self.links.stop()
        if self.counts is not None:
            await asyncio.to_thread(self.counts.stop)
        if self.admin is not None:
            await self.admin.stop()
        if self.history is not None:
            self.history.close()
        for listener in reversed(self.listeners):
            await listener.stop()
        if self.gate is not None:
            self.gate.close()  # the password checks' threads
        self.broker.close()
        if self.cluster is not None and self._owns_cluster:
            await asyncio.to_thread(self.cluster.stop)


async def join_cluster(config: BrokerConfig) -> ClusterMember | None:
    """With imq.cluster.ha, this broker's membership, joined and renewing its lease; None
    without. Call it before the store is opened, and stop the member after the store is
    closed: the store's writes need the lease."""
    if not config.cluster_ha:
        return None
    member = ClusterMember(config)
    await asyncio.to_thread(member.join)
    return member


def is_loopback(host: str) -> bool:
    """Whether `host` names only the local machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            infos = socket.getaddrinfo(host, None)
        except OSError:
            return False
        return all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def check_exposure(config: BrokerConfig) -> None:
    """A broker reachable from other machines must check who connects, unless told otherwise."""
    if config.authentication or config.insecure or is_loopback(config.host):
        return
    raise ConfigError(
        "imq.authentication.enabled",
        f"imq.hostname is {config.host}, which other machines can reach, and authentication is "
        "off: set imq.authentication.enabled=true (with users added by `sluiceway cmd user "
        "add`), or set imq.authentication.insecure=true to run without it anyway",
    )
