"""Why `sluiceway analyze` could not produce a report; each maps to one exit status."""

from __future__ import annotations

from typing import Final

from sluiceway.errors import SluicewayError

EXIT_OK: Final = 0
EXIT_NO_DATA: Final = 1  # nothing to analyse, or the report could not be written
EXIT_USAGE: Final = 2
EXIT_NO_SPARK: Final = 3  # Spark could not start (no Java, no PySpark, no master) or failed


class AnalysisError(SluicewayError):
    """A failure the user can act on; the message is the whole explanation, on one line."""

    exit_status: int = EXIT_NO_DATA


class AnalysisUsageError(AnalysisError):
    """An option has a value it cannot take."""

    exit_status = EXIT_USAGE


class HistoryNotFound(AnalysisError):
    """No metrics history where we looked, or none in the time range asked for."""


class SparkUnavailable(AnalysisError):
    """Spark cannot run here (Java or PySpark is missing, the master cannot be reached), or
    its job failed."""

    exit_status = EXIT_NO_SPARK
