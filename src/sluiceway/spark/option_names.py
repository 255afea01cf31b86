"""The names of the data source's options, and the refusal of any other.

A misspelt option (`maxMesagesPerTrigger`) would otherwise be ignored without a word, and its
limit with it: every option given must be one the source (or the sink) reads, or one Spark
passes itself. Spark hands the names over lower-cased, so they are compared lower-cased, and
the refusal names the closest known ones as docs/spark.md spells them.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Final

from sluiceway.errors import ConfigError

# How to reach the broker (options.connection_settings), for sources and sinks alike.
CONNECTION: Final = (
    "host",
    "port",
    "addresses",
    "tls",
    "tlsCaFile",
    "tlsHostnameCheck",
    "username",
    "password",
    "login",
    "passcode",
    "usernameEnv",
    "passwordEnv",
    "passwordFile",
    "timeoutSec",
    "failoverDeadlineSec",
    "retryPauseSec",
)
SOURCE: Final = (
    *CONNECTION,
    "destination",
    "group",
    "startingOffsets",
    "endingOffsets",
    "maxMessagesPerTrigger",
    "maxBytesPerTrigger",
    "minPartitions",
    "failOnDataLoss",
    "includeHeaders",
    "leaseTtlSec",
    "onExpiredLease",
)
SINK: Final = (
    *CONNECTION,
    "destination",
    "deliveryGuarantee",
    "sinkId",
    "stageTtlSec",
    "retryDeadlineSec",
    "maxInflight",  # sends awaiting their receipts: a source sends nothing
    "persistent",
    "priority",
)
# What Spark itself puts among a data source's options: `path` (`load(path)`, `save(path)`,
# `start(path)`), and for a stream's sink `checkpointLocation` and `queryName` (as
# tests/spark/test_options.py finds them). The sink reads checkpointLocation; the others mean
# nothing here.
SPARK_OWN: Final = ("path", "checkpointLocation", "queryName")
# How alike a name must be to be offered in its place (difflib's ratio).
_CLOSE: Final = 0.6


def check_names(
    options: Mapping[str, str], known: Iterable[str], what: str, other: Iterable[str] = ()
) -> None:
    """Refuse an option of `options` that is neither in `known` nor Spark's own, in one line
    naming it and the closest known names; `what` is "source" or "sink", and `other` the
    options of the other one (an option of the sink given to a source is said to be one)."""
    spelled = {name.lower(): name for name in known}
    accepted = spelled.keys() | {name.lower() for name in SPARK_OWN}
    unknown = sorted(str(key) for key in options if str(key).lower() not in accepted)
    if not unknown:
        return
    elsewhere = {name.lower() for name in other}
    parts = []
    for name in unknown:
        close = difflib.get_close_matches(name.lower(), spelled, n=3, cutoff=_CLOSE)
        hint = f" (did you mean {' or '.join(spelled[c] for c in close)}?)" if close else ""
        if not close and name.lower() in elsewhere:
            hint = f" (an option of the {'sink' if what == 'source' else 'source'})"
        parts.append(f"{name}{hint}")
    plural = "s" if len(unknown) > 1 else ""
    raise ConfigError(
        unknown[0],
        f"unknown option{plural} of the sluiceway {what}: {', '.join(parts)}; its options are "
        "listed in docs/spark.md",
    )
