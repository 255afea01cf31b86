"""What one `sluiceway analyze` run is asked to do, parsed and checked before Spark starts."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Final

from sluiceway.analysis.errors import AnalysisUsageError

DEFAULT_MASTER: Final = "local[*]"
DEFAULT_IMBALANCE_RATIO: Final = 2.0
_AGO = re.compile(r"(\d+)\s*([smhd])")
_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True, slots=True)
class Options:
    """Everything the analysis needs to know; times are ms since the epoch (UTC)."""

    history: str  # a directory, or a URL Spark can read (hdfs://, s3a://...)
    out: str
    master: str = DEFAULT_MASTER
    since_ms: int | None = None
    until_ms: int | None = None
    # Handlers behind one consumer (an MDB pool): by destination path, "" for every destination.
    pool_sizes: dict[str, int] = field(default_factory=dict)
    imbalance_ratio: float = DEFAULT_IMBALANCE_RATIO  # max/min share that counts as uneven
    spark_conf: dict[str, str] = field(default_factory=dict)

    def pool_size(self, destination: str) -> int | None:
        return self.pool_sizes.get(destination, self.pool_sizes.get(""))


def parse_time(text: str, now: datetime, option: str) -> int:
    """`--since`/`--until`: an ISO 8601 date or time (UTC unless it says otherwise), or a span
    before now such as 90m, 2h or 1d. Returns ms since the epoch."""
    value = text.strip()
    ago = _AGO.fullmatch(value)
    if ago is not None:
        seconds = int(ago.group(1)) * _UNITS[ago.group(2)]
        return round((now - timedelta(seconds=seconds)).timestamp() * 1000)
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise AnalysisUsageError(
            f"{option} {text!r} is neither an ISO 8601 time (2026-03-24T09:30, UTC unless it "
            "has an offset) nor a span before now (30m, 2h, 1d)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return round(moment.timestamp() * 1000)


def parse_pool_size(text: str) -> tuple[str, int]:
    """`--pool-size [DESTINATION=]N`: (destination path, or "" for all; N)."""
    name, sep, number = text.rpartition("=")
    if not sep:
        name, number = "", text
    try:
        size = int(number)
    except ValueError:
        size = 0
    if size < 1:
        raise AnalysisUsageError(
            f"--pool-size {text!r}: expected N or DESTINATION=N with N a whole number of at "
            "least 1 (the handlers that serve one consumer), e.g. /queue/orders=32"
        )
    if name and not name.startswith(("/queue/", "/topic/")):
        raise AnalysisUsageError(
            f"--pool-size {text!r}: the destination must be written /queue/NAME or /topic/NAME"
        )
    return name, size


def parse_conf(text: str) -> tuple[str, str]:
    """`--conf KEY=VALUE`: one Spark property."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise AnalysisUsageError(
            f"--conf {text!r}: expected KEY=VALUE, e.g. spark.driver.memory=2g"
        )
    return key.strip(), value


def build_options(
    *,
    history: str,
    out: str,
    master: str,
    since: str | None,
    until: str | None,
    pool_sizes: list[str],
    imbalance_ratio: float,
    conf: list[str],
    now: datetime,
) -> Options:
    since_ms = parse_time(since, now, "--since") if since is not None else None
    until_ms = parse_time(until, now, "--until") if until is not None else None
    if since_ms is not None and until_ms is not None and since_ms >= until_ms:
        raise AnalysisUsageError(f"--since {since} is not before --until {until}")
    if not math.isfinite(imbalance_ratio) or imbalance_ratio <= 1.0:
        raise AnalysisUsageError(
            f"--imbalance-ratio {imbalance_ratio}: must be above 1 (the largest consumer's share "
            "divided by the smallest; 2 means one consumer got twice another's messages)"
        )
    return Options(
        history=history,
        out=out,
        master=master,
        since_ms=since_ms,
        until_ms=until_ms,
        pool_sizes=dict(parse_pool_size(p) for p in pool_sizes),
        imbalance_ratio=imbalance_ratio,
        spark_conf=dict(parse_conf(c) for c in conf),
    )
