"""`sluiceway analyze`: a Spark job over the metrics history that writes a report.

    sluiceway analyze [--data-dir DIR | --history DIR] [--since WHEN] [--until WHEN]
                      [--out DIR] [--master URL] [--pool-size [DEST=]N] [--conf KEY=VALUE]

Exit status: 0 report written; 1 no history (or none in the range), or the report could not be
written; 2 usage error; 3 Spark could not start (no Java, no PySpark, master unreachable) or
its job failed.
A failure prints one line on stderr starting `sluiceway analyze:`.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Final

from sluiceway.analysis.errors import EXIT_OK, AnalysisError, HistoryNotFound, SparkUnavailable
from sluiceway.analysis.options import (
    DEFAULT_IMBALANCE_RATIO,
    DEFAULT_MASTER,
    Options,
    build_options,
)

if TYPE_CHECKING:
    from sluiceway.analysis.rules import Recommendation

DEFAULT_DATA_DIR: Final = "./sluiceway-data"  # the broker's default imq.persist.file.directory
DEFAULT_OUT: Final = "./sluiceway-report"
PROGRAM: Final = "sluiceway analyze"


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "analyze",
        help="analyse the metrics history with Spark: report and flow-setting advice",
        description="Run a Spark job over the broker's metrics history (metrics/*.jsonl in its "
        "data directory) and write report.html and summary.json: throughput and backlog per "
        "destination, the lag of its pipeline readers, producers held or throttled, consumers "
        "paused by flow control, the spread of each queue's messages over its consumers, and "
        "recommended consumerFlowLimit and consumerFlowThreshold values with the reason for "
        "each. "
        "See docs/analyze.md.",
    )
    parser.add_argument(
        "--data-dir",
        metavar="DIR",
        default=DEFAULT_DATA_DIR,
        help=f"the broker's data directory; the history is its metrics/ "
        f"(default {DEFAULT_DATA_DIR})",
    )
    parser.add_argument(
        "--history",
        metavar="DIR",
        help="the history directory itself, or a URL Spark reads (hdfs://, s3a://); "
        "overrides --data-dir",
    )
    parser.add_argument(
        "--since",
        metavar="WHEN",
        help="start: ISO 8601 time (UTC unless it says) or 30m, 2h, 1d ago",
    )
    parser.add_argument("--until", metavar="WHEN", help="end, written like --since")
    parser.add_argument(
        "--out", metavar="DIR", default=DEFAULT_OUT, help=f"where to write (default {DEFAULT_OUT})"
    )
    parser.add_argument(
        "--master",
        metavar="URL",
        default=DEFAULT_MASTER,
        help=f"Spark master (default {DEFAULT_MASTER}: this machine, every core)",
    )
    parser.add_argument(
        "--pool-size",
        dest="pool_sizes",
        action="append",
        default=[],
        metavar="[DEST=]N",
        help="N handlers (an MDB pool) share each consumer of DEST, or of every destination; "
        "no limit is recommended below it (repeatable)",
    )
    parser.add_argument(
        "--imbalance-ratio",
        type=float,
        default=DEFAULT_IMBALANCE_RATIO,
        metavar="X",
        help="a queue is uneven when its largest consumer share is X times its smallest "
        f"(default {DEFAULT_IMBALANCE_RATIO:g})",
    )
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark property, e.g. spark.driver.memory=2g (repeatable)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        options = build_options(
            history=args.history or str(Path(args.data_dir) / "metrics"),
            out=args.out,
            master=args.master,
            since=args.since,
            until=args.until,
            pool_sizes=args.pool_sizes,
            imbalance_ratio=args.imbalance_ratio,
            conf=args.conf,
            now=datetime.now(UTC),
        )
        page, summary, headline = analyse(options)
    except AnalysisError as exc:
        print(f"{PROGRAM}: {exc}", file=sys.stderr)
        return exc.exit_status
    print(f"report: {page}")
    print(f"summary: {summary}")
    for line in headline:
        print(line)
    return EXIT_OK


def analyse(options: Options) -> tuple[Path, Path, list[str]]:
    """Run the analysis; return the two files written and one line per destination with
    something to say (see `headline`)."""
    # PySpark and matplotlib load only here: the rest of the command line never pays for them.
    from sluiceway.analysis import report, rules, sources  # noqa: PLC0415 (PySpark loads only for analyze)
    from sluiceway.analysis.session import spark_error, spark_session  # noqa: PLC0415 (PySpark loads only for analyze)
    from sluiceway.analysis.summary import Analysis  # noqa: PLC0415 (PySpark loads only for analyze)

    remote = sources.is_remote(options.history)
    if remote:
        paths, where = [options.history], options.history
    else:
        directory = sources.local_path(options.history)
        files = sources.history_files(directory, options.since_ms, options.until_ms)
        # Absolute: on a cluster a relative path would be read from Spark's default file system.
        paths, where = [str(f.resolve()) for f in files], str(directory)
    with spark_session(options.master, options.spark_conf) as spark:
        from py4j.protocol import Py4JError  # type: ignore[import-untyped]  # noqa: PLC0415 (no type hints; loads only for analyze)
        from pyspark.errors import PySparkException  # noqa: PLC0415 (PySpark loads only for analyze)

        from sluiceway.analysis import job  # noqa: PLC0415 (PySpark loads only for analyze)

        try:
            collected = job.run(spark, paths, options.since_ms, options.until_ms, where)
        except PySparkException as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            if exc.getCondition() == "PATH_NOT_FOUND":
                # Spark lists a remote directory itself; a missing one is the user's to fix.
                raise HistoryNotFound(f"cannot read the history at {where}: {first}") from None
            raise SparkUnavailable(f"the Spark job failed: {first}") from exc
        except Py4JError as exc:  # an error of the JVM that PySpark passed on as it came
            raise SparkUnavailable(f"the Spark job failed: {spark_error(exc)}") from exc
    analysis = Analysis(
        options=options,
        files=0 if remote else len(paths),
        generated_ms=round(time.time() * 1000),
        collected=collected,
        recommendations=rules.recommend_all(collected, options.imbalance_ratio, options.pool_size),
    )
    out = Path(options.out)
    try:
        page, summary = report.write(analysis, out)
    except OSError as exc:
        raise AnalysisError(f"cannot write the report to {out}: {exc}") from None
    lines = [headline(r) for r in analysis.recommendations]
    return page, summary, [line for line in lines if line]


def headline(recommendation: Recommendation) -> str:
    """One line for the terminal: the settings to change and the rules that say so, the
    windows the broker sized, the deadline misses; "" when there is nothing to say."""
    from sluiceway.analysis.findings import POOL_SIZE, limit_text  # noqa: PLC0415 (loads with the rules, for analyze only)

    rec = recommendation
    changes = []
    if rec.limit_changed:
        fixed = rec.fixed_limit
        instead = "" if fixed is None or fixed == rec.destination_limit else f" (or {fixed})"
        changes.append(
            f"consumerFlowLimit {limit_text(rec.destination_limit)} -> "
            f"{limit_text(rec.limit)}{instead}"
        )
    if rec.threshold_changed:
        changes.append(f"consumerFlowThreshold {rec.threshold_in_use} -> {rec.threshold}")
    if rec.order_changed:
        changes.append(f"deliveryOrder {rec.delivery_order} -> {rec.recommended_order}")
    changes.extend(
        f"{f.setting}:{f.value} on SUBSCRIBE" for f in rec.findings if f.setting == POOL_SIZE
    )
    parts = []
    if rec.findings:
        rules = ", ".join(sorted({f.rule for f in rec.findings}))
        parts.append(f"{'; '.join(changes) if changes else 'see the report'} ({rules})")
    lows = [c.window_low for c in rec.adaptive if c.window_low is not None]
    highs = [c.window_high for c in rec.adaptive if c.window_high is not None]
    if lows and highs:
        low, high = min(lows), max(highs)
        span = str(low) if low == high else f"{low} to {high}"
        parts.append(f"auto windows of {span} messages for {len(rec.adaptive)} consumer(s)")
    if rec.misses:
        parts.append(rec.misses)
    return f"{rec.destination}: {'; '.join(parts)}" if parts else ""
