"""Errors of the Spark data source, in the project's error tree."""

from __future__ import annotations

from sluiceway.errors import SluicewayError


class SchemaMismatch(SluicewayError):
    """A DataFrame's columns do not fit what the sink writes, or a user schema what it reads."""


class DataLossError(SluicewayError):
    """Messages a query should read are gone: released before they were read (a topic), or a
    lease that expired before Spark committed its batch (a queue). The message says which, how
    many when known, and the option that lets the query go on (`failOnDataLoss`,
    `onExpiredLease`)."""


class LeaseExpiredError(SluicewayError):
    """A batch being replayed finds its lease expired: the query was down longer than the lease's
    time to live, and the lease's messages went back to the queue (they will be delivered again,
    marked redelivered). `onExpiredLease=skip` goes on without them; a longer `leaseTtlSec`
    avoids it."""


class UnsupportedBroker(SluicewayError):
    """The broker does not speak the pipeline extensions this operation needs."""
