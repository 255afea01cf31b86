"""`sluiceway`: the command line."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sluiceway import BUILD, __version__
from sluiceway.analysis import command as analyze
from sluiceway.bench import command as bench
from sluiceway.cli import cmd, dbmgr
from sluiceway.collector import tune_collector
from sluiceway.config import BrokerConfig, load_config, render_reference
from sluiceway.errors import ConfigError, SluicewayError

if TYPE_CHECKING:
    from sluiceway.app.storage import Storage
    from sluiceway.cluster.member import ClusterMember

log = logging.getLogger("sluiceway")

# The exit status of a broker that stopped because it lost its cluster lease (a supervisor
# restarts it; it rejoins with a new epoch). 1 is a broker that could not start.
EXIT_FENCED = 3


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sluiceway",
        description="Sluiceway: a STOMP message broker with Open Message Queue's flow control.",
    )
    parser.add_argument("--version", action="version", version=f"sluiceway {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    broker = commands.add_parser(
        "broker",
        help="run the broker in the foreground",
        description="Run the broker in the foreground until SIGTERM or Ctrl-C. "
        "Properties use Open MQ's names; see docs/configuration.md.",
    )
    broker.add_argument("--config", metavar="FILE", help="properties file (Java-properties syntax)")
    broker.add_argument(
        "-D",
        dest="overrides",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set a property, overriding the file (repeatable), like imqbrokerd -D",
    )
    broker.add_argument("--host", help="address to bind (same as -D imq.hostname=HOST)")
    broker.add_argument(
        "--data-dir",
        metavar="DIR",
        help="data directory: journal, swap area (same as -D imq.persist.file.directory=DIR; "
        "default ./sluiceway-data)",
    )
    broker.add_argument(
        "--port",
        type=int,
        help="plain STOMP port: 0 any free one, -1 none (same as -D imq.stomp.tcp.port=PORT)",
    )
    broker.add_argument(
        "--list-properties",
        action="store_true",
        help="print every property with its default and meaning, then exit",
    )
    cmd.add_parser(commands)
    dbmgr.add_parser(commands)
    analyze.add_parser(commands)
    bench.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(as_dbmgr(sys.argv[1:] if argv is None else list(argv)))
    if args.command == "broker":
        return run_broker(args)
    if args.command == "cmd":
        return cmd.run(args)
    if args.command == "dbmgr":
        return dbmgr.run(args)
    if args.command == "analyze":
        return analyze.run(args)
    if args.command == "bench":
        return bench.run(args)
    return 2  # argparse rejects unknown commands before this


def as_dbmgr(argv: list[str]) -> list[str]:
    """`sluiceway cmd create tbl` (and upgrade tbl, show version, show tbl, delete tbl) is
    `sluiceway dbmgr ...`: the schema verbs work without a broker, so they are dbmgr's."""
    if len(argv) >= 3 and argv[0] == "cmd" and argv[2] in dbmgr.VERBS.get(argv[1], ()):
        return ["dbmgr", *argv[1:]]
    return argv


def run_broker(args: argparse.Namespace) -> int:
    if args.list_properties:
        sys.stdout.write(render_reference())
        return 0
    overrides = list(args.overrides)
    if args.host is not None:
        overrides.append(f"imq.hostname={args.host}")
    if args.port is not None:
        overrides.append(f"imq.stomp.tcp.port={args.port}")
    if args.data_dir is not None:
        overrides.append(f"imq.persist.file.directory={args.data_dir}")
    try:
        config = load_config(args.config, overrides)
    except ConfigError as exc:
        print(f"sluiceway: configuration error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return asyncio.run(serve(config))
    except (OSError, SluicewayError) as exc:
        log.error("cannot start: %s", exc)  # noqa: TRY400  (the cause says it; no traceback)
        return 1


async def serve(config: BrokerConfig) -> int:
    """Run until SIGTERM or SIGINT, then shut down cleanly; or until the cluster lease is
    lost (EXIT_FENCED). The exit status."""
    # Imported here, so that `sluiceway cmd` starts without loading the broker (a third of a
    # second, paid by every admin command otherwise).
    from sluiceway.app.services import join_cluster  # noqa: PLC0415  (late: see above)
    from sluiceway.app.storage import Storage  # noqa: PLC0415  (late: see above)

    # A cluster member joins before it opens its store, and leaves after closing it.
    cluster = await join_cluster(config)
    try:
        storage = Storage(config, fence=cluster.store_fence.check if cluster else None)
        try:
            return await _serve(config, storage, cluster)
        finally:
            storage.close()
    finally:
        if cluster is not None:
            await asyncio.to_thread(cluster.stop)


async def _serve(config: BrokerConfig, storage: Storage, cluster: ClusterMember | None) -> int:
    from sluiceway.app.services import Services  # noqa: PLC0415  (late, as Storage)

    broker, _ = storage.open_broker()
    services = Services(broker, cluster)
    storage.notifier.attach(asyncio.get_running_loop(), services.synced)
    await services.start()
    tune_collector()
    stop = asyncio.Event()
    services.when_fenced(stop.set)
    loop = asyncio.get_running_loop()
    # Before the ready line: a SIGTERM sent as soon as it is read stops the broker cleanly.
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    log.info("Sluiceway %s ready: %s", __version__, services.ready_line())
    log.log(logging.WARNING if BUILD.warn else logging.INFO, "per-message path: %s", BUILD.reason)
    await stop.wait()
    log.info("shutting down: closing %d connections", services.connection_count)
    await services.stop()
    log.info("stopped")
    return EXIT_FENCED if services.fenced is not None else 0


if __name__ == "__main__":
    sys.exit(main())
