"""One error tree for the whole project.

Every error a user can see says what was wrong, which limit or input caused it, and what to do.
Broker errors carry the Open MQ status code that goes into the `status` header of a STOMP ERROR
frame (400 bad request, 401 unauthorized, 403 forbidden, 404 not found, 409 conflict, 410 gone,
414 resource full, 423 entity too large, 500 internal, 503 unavailable).
"""

from __future__ import annotations

from enum import IntEnum


class Status(IntEnum):
    """Open MQ status codes, as carried by the `status` header of an ERROR frame."""

    BAD_REQUEST = 400
    UNAUTHORIZED = 401
    FORBIDDEN = 403
    NOT_FOUND = 404
    CONFLICT = 409
    GONE = 410  # HTTP's code for something that existed and is no more: an expired lease
    RESOURCE_FULL = 414
    ENTITY_TOO_LARGE = 423
    INTERNAL = 500
    UNAVAILABLE = 503  # busy for now, nothing wrong with the request: try again later


class SluicewayError(Exception):
    """Root of every error raised by Sluiceway."""


class ConfigError(SluicewayError):
    """A configuration property is unknown or has a value it cannot take.

    `name` is the property's name as the user wrote it; the message says which values are
    accepted.
    """

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


class ProtocolError(SluicewayError):
    """The STOMP byte stream or frame sequence is invalid."""


class RemoteProtocolError(ProtocolError):
    """The peer broke the protocol: its bytes or frames cannot be accepted.

    The connection cannot go on; the receiver answers with an ERROR frame (when it is the broker)
    and closes.
    """


class FrameLimitExceeded(RemoteProtocolError):
    """A frame exceeded a configured size limit (frame size, header count or header length).

    `limit` is the name of the configuration property that sets the limit, `value` its value.
    """

    def __init__(self, message: str, *, limit: str, value: int) -> None:
        super().__init__(message)
        self.limit = limit
        self.value = value


class LocalProtocolError(ProtocolError):
    """This side tried to send something the protocol does not allow (a bug on our side)."""


class BrokerError(SluicewayError):
    """A client request the broker refuses, with the status code that goes on the wire.

    `summary` is the short text for the ERROR frame's `message` header; the exception's own text is
    the full explanation that goes in the ERROR frame's body. A refusal caused by a limit names
    the destination, the limit (its property name) and the limit's value; they travel as the
    `destination`, `limit` and `limit-value` headers, and the client raises the same class with
    the same attributes. A refusal of something that lives on another member of a cluster (a
    lease group, a sink) names that member and its STOMP address (`member`, `member-address`):
    a client goes there, or tries again once the member took it over.
    """

    status: Status = Status.INTERNAL

    def __init__(
        self,
        summary: str,
        detail: str | None = None,
        *,
        destination: str | None = None,
        limit: str | None = None,
        limit_value: str | None = None,
        member: str | None = None,
        member_address: str | None = None,
    ) -> None:
        super().__init__(detail if detail is not None else summary)
        self.summary = summary
        self.destination = destination
        self.limit = limit
        self.limit_value = limit_value
        self.member = member
        self.member_address = member_address


class BadRequest(BrokerError):
    status = Status.BAD_REQUEST


class Unauthorized(BrokerError):
    """Authentication failed: no credentials, an unknown user, or a wrong password."""

    status = Status.UNAUTHORIZED


class Forbidden(BrokerError):
    status = Status.FORBIDDEN


class NotFound(BrokerError):
    status = Status.NOT_FOUND


class Conflict(BrokerError):
    status = Status.CONFLICT


class Gone(BrokerError):
    status = Status.GONE


class ResourceFull(BrokerError):
    status = Status.RESOURCE_FULL


class EntityTooLarge(BrokerError):
    status = Status.ENTITY_TOO_LARGE


class InternalError(BrokerError):
    status = Status.INTERNAL


class Unavailable(BrokerError):
    """The broker cannot take this request now (too many logins in progress); a later attempt
    may succeed."""

    status = Status.UNAVAILABLE


BROKER_ERRORS: dict[int, type[BrokerError]] = {
    cls.status.value: cls
    for cls in (
        BadRequest,
        Unauthorized,
        Forbidden,
        NotFound,
        Conflict,
        Gone,
        ResourceFull,
        EntityTooLarge,
        Unavailable,
    )
}


def broker_error(
    status: int,
    summary: str,
    detail: str | None = None,
    *,
    destination: str | None = None,
    limit: str | None = None,
    limit_value: str | None = None,
    member: str | None = None,
    member_address: str | None = None,
) -> BrokerError:
    """The BrokerError subclass for an Open MQ status code (InternalError for unknown codes)."""
    cls = BROKER_ERRORS.get(status, InternalError)
    return cls(
        summary,
        detail,
        destination=destination,
        limit=limit,
        limit_value=limit_value,
        member=member,
        member_address=member_address,
    )


class ClientError(SluicewayError):
    """An error of the Python client runtime itself (not a refusal by the broker)."""


class ConnectionClosedError(ClientError, ConnectionError):
    """The connection is closed, or was lost, so the operation cannot complete.

    Also the built-in ConnectionError, so that code written for any network client (retry
    loops, `except ConnectionError`) treats it as the lost connection it is.
    """


class ConnectFailedError(ClientError):
    """No connection could be opened (every address and attempt failed)."""


class OperationTimeoutError(ClientError, TimeoutError):
    """A bounded wait expired: the broker did not answer within the time allowed."""


class TransactionRolledBackError(ClientError):
    """A transaction could not be committed and was rolled back (for example, the connection
    was lost before the COMMIT was confirmed)."""
