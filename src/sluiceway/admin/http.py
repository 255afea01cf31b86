"""The admin endpoint: an HTTP JSON API over the broker's core admin calls, on its own port.

`sluiceway cmd` and the web console use it; every route is documented in admin/openapi.py.
It runs on the broker's event loop, so a handler calls the core directly. With authentication on
(imq.authentication.enabled) every request needs HTTP Basic credentials (401 without valid
ones) of an administrator (403 for other users): as in Open MQ, with access control on
(imq.accesscontrol.enabled) the access rules' `connection.ADMIN` decide who that is (the default
rules: the group `admin`); with it off, the group `admin`. The credentials go through the same
password checks as a STOMP CONNECT (security.logins: worker threads, cache, delays after
failures; 503 when too many checks wait). Without authentication, the broker refuses to bind to
anything but loopback (app.services.check_exposure).

Requests that change something (POST, PATCH, DELETE) must say `Content-Type: application/json`:
a page on another site cannot send that without the browser asking first, so a logged-in
browser cannot be made to pause or purge a destination by a link or a form elsewhere.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

from aiohttp import BasicAuth, web

from sluiceway.admin import cluster, console, model, openapi, prometheus, readers
from sluiceway.admin.guards import HostCheck, admin_limits
from sluiceway.core.broker import PauseTarget
from sluiceway.errors import (
    BadRequest,
    BrokerError,
    Forbidden,
    Gone,
    InternalError,
    NotFound,
    Status,
    Unauthorized,
    Unavailable,
)
from sluiceway.naming import DestinationKind, DestinationName, validate_name
from sluiceway.security.access import AccessControl, Operation, Service, access_path
from sluiceway.security.logins import LoginResult, Logins, Refusal
from sluiceway.security.users import ANONYMOUS, Principal
from sluiceway.server.httpguard import ConnectionGuard, guard_middleware, http_kwargs
from sluiceway.server.stomp_server import find_session

if TYPE_CHECKING:
    from sluiceway.admin.view import BrokerView

log = logging.getLogger(__name__)

API: Final = "/api/v1"
# Open MQ status -> HTTP status: a full broker is "unavailable", a too-large entity 413.
_HTTP_STATUS: Final = {
    Status.BAD_REQUEST: 400,
    Status.UNAUTHORIZED: 401,
    Status.FORBIDDEN: 403,
    Status.NOT_FOUND: 404,
    Status.CONFLICT: 409,
    Status.RESOURCE_FULL: 503,
    Status.ENTITY_TOO_LARGE: 413,
    Status.INTERNAL: 500,
    Status.UNAVAILABLE: 503,
}
_KINDS: Final = {
    "queue": DestinationKind.QUEUE,
    "q": DestinationKind.QUEUE,
    "topic": DestinationKind.TOPIC,
    "t": DestinationKind.TOPIC,
}
_MUTATING: Final = frozenset({"POST", "PATCH", "PUT", "DELETE"})
# destroy cxn's reason travels in the ERROR frame's body: one line of at most this many characters.
MAX_REASON: Final = 200
PRINCIPAL: Final = web.RequestKey("principal", Principal)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(error: BrokerError) -> web.Response:
    body = {"error": error.summary, "detail": str(error), "status": int(error.status)}
    for key in ("destination", "limit", "limit_value"):
        value = getattr(error, key)
        if value is not None:
            body[key] = value
    response = web.json_response(body, status=_HTTP_STATUS.get(error.status, 500))
    if error.status is Status.UNAUTHORIZED:
        response.headers["WWW-Authenticate"] = 'Basic realm="sluiceway", charset="UTF-8"'
    return response


def json_response(value: Any, status: int = 200) -> web.Response:
    return web.json_response(model.to_json(value), status=status)


class AdminServer:
    """Serves the admin API (and whatever else registers routes: console, /metrics)."""

    def __init__(self, services: BrokerView) -> None:
        self.services = services
        self.broker = services.broker
        self.config = services.config
        # The password checks the STOMP listeners use (one pool, cache and table of delays).
        self.logins: Logins | None = None
        self.access: AccessControl | None = None
        if self.config.authentication:
            gate = services.gate
            self.logins = gate.logins if gate is not None else Logins(self.config)
            if self.config.access_control:
                # Open MQ's connection.ADMIN rules decide who administers.
                self.access = AccessControl(access_path(self.config))
        # Before authentication: the connection's limits, then the Host it names.
        hosts = HostCheck(self.config, self.scheme).middleware
        self.app = web.Application(
            middlewares=[guard_middleware, self._errors, hosts, self._security]
        )
        self._routes()
        self._runner: web.AppRunner | None = None
        self._listening: asyncio.Server | None = None
        self.guard = ConnectionGuard("admin endpoint", admin_limits(self.config))
        self._address: tuple[str, int] = ("", 0)

    @property
    def address(self) -> tuple[str, int]:
        return self._address

    @property
    def scheme(self) -> str:
        return "https" if self.config.admin_tls else "http"

    async def start(self, tls: ssl.SSLContext | None = None) -> None:
        """Listen on imq.hostname:imq.admin.http.port; HTTPS with `tls` (imq.admin.tls)."""
        config = self.config
        sock = socket.create_server((config.host, config.admin_port), reuse_port=False)
        self._address = sock.getsockname()[:2]
        self._runner = web.AppRunner(
            self.app,
            access_log=None,
            handle_signals=False,
            **http_kwargs(config.admin_keepalive_timeout_ms / 1000),
        )
        await self._runner.setup()
        assert self._runner.server is not None
        # Not a SockSite: every connection goes through the guard (server.httpguard).
        self._listening = await asyncio.get_running_loop().create_server(
            self.guard.factory(self._runner.server),
            sock=sock,
            ssl=tls,
            ssl_handshake_timeout=config.admin_header_timeout_ms / 1000 if tls else None,
        )

    async def stop(self) -> None:
        if self._listening is not None:
            self._listening.close()  # accept nothing more
        if self._runner is not None:
            await self._runner.cleanup()  # finish the requests in progress, close the rest
        if self._listening is not None:
            await self._listening.wait_closed()

    # -- middlewares ---------------------------------------------------------------------------

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except BrokerError as exc:
            # A refusal by the security middleware was logged there, at WARNING.
            if PRINCIPAL in request:
                log.info("admin %s %s refused: %s", request.method, request.path, exc)
            return error_response(exc)

    @web.middleware
    async def _security(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        principal = await self.authenticate(request)
        self._authorize(request, principal)
        if request.method in _MUTATING and request.content_type != "application/json":
            raise BadRequest(
                "JSON required",
                f"a {request.method} request must have Content-Type: application/json",
            )
        request[PRINCIPAL] = principal
        return await handler(request)

    def _authorize(self, request: web.Request, principal: Principal) -> None:
        """Raise Forbidden unless `principal` may administer: with access control on, as the
        rules' connection.ADMIN say (Open MQ's admin connection service); with it off, or
        without authentication, as membership in the group admin says."""
        user = principal.user
        if self.access is None:
            if principal.is_admin:
                return
            why = "not in the admin group"
            detail = (
                f"user {user!r} is not in the admin group; the admin API is for administrators only"
            )
        else:
            decision = self.access.decide(principal, Operation.CONNECT, None, Service.ADMIN.value)
            if decision.allowed:
                return
            why = decision.explain()
            if decision.invalid:
                fix = "the broker's access rules cannot be read; an administrator must fix them"
            else:
                fix = (
                    "the broker's access rules do not allow it; an administrator can allow it in "
                    "the access control file (imq.accesscontrol.file.filename), e.g. with "
                    f"connection.ADMIN.allow.user={user}"
                )
            detail = f"user {user!r} may not administer the broker: {fix}"
        log.warning(
            "admin request %s %s by %r refused: not an administrator: %s",
            request.method,
            request.path,
            user,
            why,
        )
        raise Forbidden("not an administrator", detail)

    async def authenticate(self, request: web.Request) -> Principal:
        """The request's principal; raises Unauthorized for missing or wrong credentials (the
        answer to wrong ones held back as for a CONNECT), Unavailable when too many password
        checks wait. The password hash (scrypt, tens of ms by design) is checked in a worker
        thread (security.logins), so the event loop goes on moving messages meanwhile."""
        if self.logins is None:
            return ANONYMOUS
        header = request.headers.get("Authorization", "")
        try:
            auth = BasicAuth.decode(header) if header else None
        except ValueError:
            auth = None
        if auth is None:
            # Nothing to check: a browser's first request, which the 401 asks for credentials.
            log.warning(
                "admin request from %s refused: bad credentials for 'nobody'", request.remote
            )
            raise _unauthorized(None)
        # Failures are counted per address, as for STOMP (aiohttp gives the host alone).
        result = await self.logins.check(auth.login, auth.password, request.remote or "?")
        if result.principal is not None:
            return result.principal
        raise _refusal(result, request, auth.login)

    # -- routes --------------------------------------------------------------------------------

    def _routes(self) -> None:
        add = self.app.router
        add.add_get(f"{API}/broker", self.get_broker)
        add.add_patch(f"{API}/broker", self.patch_broker)
        add.add_get(f"{API}/destinations", self.list_destinations)
        add.add_post(f"{API}/destinations", self.create_destination)
        add.add_post(f"{API}/destinations/pause", self.pause_all)
        add.add_post(f"{API}/destinations/resume", self.resume_all)
        add.add_post(f"{API}/destinations/compact", self.compact_all)
        one = f"{API}/destinations/{{type}}/{{name}}"
        add.add_get(one, self.get_destination)
        add.add_patch(one, self.patch_destination)
        add.add_delete(one, self.delete_destination)
        add.add_post(f"{one}/pause", self.pause_destination)
        add.add_post(f"{one}/resume", self.resume_destination)
        add.add_post(f"{one}/purge", self.purge_destination)
        add.add_post(f"{one}/compact", self.compact_destination)
        add.add_get(f"{API}/connections", self.list_connections)
        add.add_delete(f"{API}/connections/{{id}}", self.destroy_connection)
        add.add_get(f"{API}/consumers", self.list_consumers)
        add.add_get(f"{API}/readers", self.list_readers)
        add.add_get(f"{API}/producers", self.list_producers)
        add.add_get(f"{API}/durables", self.list_durables)
        add.add_delete(f"{API}/durables/{{client_id}}/{{name}}", self.delete_durable)
        add.add_get(f"{API}/metrics/broker", self.broker_metrics)
        add.add_get(f"{API}/metrics/services", self.service_metrics)
        add.add_get(f"{one.replace('destinations', 'metrics/destinations')}", self.dest_metrics)
        prometheus.register(self.app, self.services)
        cluster.register(self.app, self.services)
        openapi.register(self.app)
        console.register(self.app)

    async def get_broker(self, request: web.Request) -> web.Response:
        return json_response(
            model.broker_snapshot(self.broker, self.services, self.services.started)
        )

    async def patch_broker(self, request: web.Request) -> web.Response:
        properties = _properties(await _body(request))
        self.broker.update_properties(properties)
        self._audit(request, "update bkr", properties)
        return json_response(
            model.broker_snapshot(self.broker, self.services, self.services.started)
        )

    async def list_destinations(self, request: web.Request) -> web.Response:
        kind = request.query.get("type")
        found = model.list_destinations(self.broker, _kind(kind) if kind else None)
        return json_response([model.destination_summary(self.broker, d) for d in found])

    async def create_destination(self, request: web.Request) -> web.Response:
        body = await _body(request)
        name = _name(str(body.get("type", "")), str(body.get("name", "")))
        properties = _properties(body)
        destination = self.broker.create_destination(name, properties)
        self._audit(request, f"create dst {name}", properties)
        return json_response(self._detail(destination.name), status=201)

    async def get_destination(self, request: web.Request) -> web.Response:
        return json_response(self._detail(_path_name(request)))

    async def patch_destination(self, request: web.Request) -> web.Response:
        name = _path_name(request)
        properties = _properties(await _body(request))
        self.broker.update_destination(name, properties)
        self._audit(request, f"update dst {name}", properties)
        return json_response(self._detail(name))

    async def delete_destination(self, request: web.Request) -> web.Response:
        name = _path_name(request)
        self.broker.destroy_destination(name)
        self._audit(request, f"destroy dst {name}")
        return web.json_response({"destroyed": name.path})

    async def pause_destination(self, request: web.Request) -> web.Response:
        name = _path_name(request)
        target = _target(await _body(request))
        self.broker.pause(name, target)
        self._audit(request, f"pause dst {name} {target.value}")
        return json_response(self._detail(name))

    async def resume_destination(self, request: web.Request) -> web.Response:
        name = _path_name(request)
        target = _target(await _body(request))
        self.broker.resume(name, target)
        self._audit(request, f"resume dst {name} {target.value}")
        return json_response(self._detail(name))

    async def pause_all(self, request: web.Request) -> web.Response:
        target = _target(await _body(request))
        names = [d.name for d in self.broker.registry if not d.is_dmq]
        for name in names:
            self.broker.pause(name, target)
        self._audit(request, f"pause dst (all) {target.value}")
        return web.json_response({"paused": [n.path for n in names], "target": target.value})

    async def resume_all(self, request: web.Request) -> web.Response:
        target = _target(await _body(request))
        names = [d.name for d in self.broker.registry if not d.is_dmq]
        for name in names:
            self.broker.resume(name, target)
        self._audit(request, f"resume dst (all) {target.value}")
        return web.json_response({"resumed": [n.path for n in names], "target": target.value})

    async def purge_destination(self, request: web.Request) -> web.Response:
        name = _path_name(request)
        count = self.broker.purge(name)
        self._audit(request, f"purge dst {name}")
        return web.json_response({"purged": count, "destination": name.path})

    async def compact_destination(self, request: web.Request) -> web.Response:
        name = _path_name(request)
        destination = self.broker.destination(name)
        if not (destination.paused_producers and destination.paused_consumers):
            raise BadRequest(
                "destination not paused",
                f"compact dst needs {name} paused first (pause dst, as in Open MQ); the journal "
                "it compacts is shared by every destination",
            )
        return await self.compact_all(request)

    async def compact_all(self, request: web.Request) -> web.Response:
        deleted, compacted = self.broker.compact()
        self._audit(request, "compact dst")
        return web.json_response({"segments_deleted": deleted, "segments_compacted": compacted})

    async def list_connections(self, request: web.Request) -> web.Response:
        return json_response(model.connections(self.broker, self.services))

    async def destroy_connection(self, request: web.Request) -> web.Response:
        """`destroy cxn`: the client gets an ERROR (status 410) with the reason, then the
        connection closes; its unacknowledged messages go back, its transactions are aborted."""
        number = _connection_id(request.match_info["id"])
        reason = _reason(await _body(request))
        session = find_session(self.services.listeners, number)
        if session is None:
            raise NotFound(
                "no such connection",
                f"connection {number} is not open; GET {API}/connections (sluiceway cmd list "
                "cxn) lists the open connections",
            )
        user = session.principal.user if session.principal is not None else ""
        session.revoke(closed_by_administrator(reason))
        who = f", user {user}" if user else ""
        why = f": {reason!r}" if reason else ""
        self._audit(request, f"destroy cxn {number} ({session.peer}{who}){why}")
        return json_response(model.ConnectionDestroyed(number, session.peer, user, reason))

    async def list_consumers(self, request: web.Request) -> web.Response:
        return json_response(model.consumers(self.broker))

    async def list_readers(self, request: web.Request) -> web.Response:
        destinations = model.list_destinations(self.broker)
        return json_response(readers.all_readers(self.broker, destinations))

    async def list_producers(self, request: web.Request) -> web.Response:
        return json_response(self.broker.producers.held())

    async def list_durables(self, request: web.Request) -> web.Response:
        return json_response(model.durables(self.broker))

    async def delete_durable(self, request: web.Request) -> web.Response:
        client_id, name = request.match_info["client_id"], request.match_info["name"]
        self.broker.remove_durable(client_id, name)
        self._audit(request, f"destroy dur {name} of client {client_id}")
        return web.json_response({"destroyed": name, "client_id": client_id})

    async def broker_metrics(self, request: web.Request) -> web.Response:
        sampler = self.services.metrics
        ledger = self.broker.ledger
        return web.json_response(
            {
                "totals": sampler.broker_traffic(),
                "rates": model.to_json(sampler.broker_rates()),
                "connections": len(self.broker.connections),
                "msgs": self.broker.context.system.count,
                "msg_bytes": self.broker.context.system.bytes,
                "memory": {"level": ledger.level.name, "used": ledger.used, "peak": ledger.peak},
                "disk_bytes": self.broker.store.disk_bytes(),
                "disk": model.to_json(model.disk_snapshot(self.broker)),
                "counts": model.to_json(sampler.counts()),
            }
        )

    async def service_metrics(self, request: web.Request) -> web.Response:
        return json_response(self.services.metrics.service_trends())

    async def dest_metrics(self, request: web.Request) -> web.Response:
        name = _path_name(request)
        trend = self.services.metrics.destination_trend(name)
        if trend is None:
            raise NotFound("no such destination", f"destination {name} does not exist")
        return json_response(trend)

    # -- helpers -------------------------------------------------------------------------------

    def _detail(self, name: DestinationName) -> model.DestinationDetail:
        destination = self.broker.destination(name)
        trend = self.services.metrics.destination_trend(name)
        return model.destination_detail(self.broker, destination, trend)

    def _audit(self, request: web.Request, action: str, properties: object = None) -> None:
        principal = request[PRINCIPAL]
        extra = f" {properties}" if properties else ""
        log.info("admin %s: %s%s", principal.user or "(local)", action, extra)


def _refusal(result: LoginResult, request: web.Request, login: str) -> BrokerError:
    """The error (and the log line) for credentials the password checks refused."""
    if result.refusal is Refusal.UNREADABLE:
        # The message names the file and the line: there is no bug to trace.
        log.error(
            "admin request from %s: cannot check credentials: %s", request.remote, result.problem
        )
        return InternalError(
            "cannot check credentials",
            "the broker cannot read its users file; fix it (the broker's log says what is "
            "wrong): the admin API accepts no request until then",
        )
    if result.refusal is Refusal.BUSY:
        log.warning(
            "admin request from %s refused: too many logins in progress for %r",
            request.remote,
            login,
        )
        return Unavailable(
            "too many logins in progress",
            "the broker is checking as many passwords as it may "
            "(imq.authentication.queue.max): try again in a moment",
        )
    held = f", answered after {result.delay:.1f} s" if result.delay else ""
    log.warning(
        "admin request from %s refused: bad credentials for %r (failure %d in a row from this "
        "address%s)",
        request.remote,
        login,
        result.failures,
        held,
    )
    return _unauthorized(login)


def _unauthorized(login: str | None) -> Unauthorized:
    return Unauthorized(
        "authentication required",
        "the admin API needs the user name and password of an administrator (HTTP Basic)"
        + (f": user {login!r} was not accepted" if login is not None else ""),
    )


async def _body(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    try:
        body = json.loads(await request.text() or "{}")
    except json.JSONDecodeError as exc:
        raise BadRequest("malformed JSON", f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("malformed JSON", "the request body must be a JSON object")
    return body


def _properties(body: dict[str, Any]) -> dict[str, str]:
    properties = body.get("properties", {})
    if not isinstance(properties, dict):
        raise BadRequest("bad properties", '"properties" must be an object of name: value')
    return {
        str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in properties.items()
    }


def _kind(text: str) -> DestinationKind:
    kind = _KINDS.get(text.lower())
    if kind is None:
        raise BadRequest(
            "bad destination type", f"destination type {text!r}: use queue (q) or topic (t)"
        )
    return kind


def _name(kind: str, name: str) -> DestinationName:
    try:
        validate_name(name)
    except ValueError as exc:
        raise BadRequest("bad destination name", str(exc)) from None
    return DestinationName(_kind(kind), name)


def _path_name(request: web.Request) -> DestinationName:
    return _name(request.match_info["type"], request.match_info["name"])


def _connection_id(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or not 0 < int(text) < 2**63:
        raise BadRequest(
            "bad connection ID",
            f"connection ID {text!r}: expected a positive whole number, as list cxn shows it",
        )
    return int(text)


def _reason(body: dict[str, Any]) -> str:
    reason = body.get("reason", "")
    if not isinstance(reason, str):
        raise BadRequest("bad reason", '"reason" must be a string')
    reason = reason.strip()
    if len(reason) > MAX_REASON or not reason.isprintable():
        raise BadRequest(
            "bad reason",
            f"the reason must be at most {MAX_REASON} characters on one line, without control "
            f"characters (it was {len(reason)} characters long)",
        )
    return reason


def closed_by_administrator(reason: str) -> Gone:
    """The ERROR a connection destroyed by an administrator gets (status 410: it is gone)."""
    summary = "connection closed by an administrator"
    detail = f"{summary}: {reason}" if reason else f"{summary} (no reason given)"
    return Gone(summary, detail)


def _target(body: dict[str, Any]) -> PauseTarget:
    text = str(body.get("target", "ALL")).upper()
    try:
        return PauseTarget(text)
    except ValueError:
        raise BadRequest(
            "bad pause target", f"pause target {text!r}: use PRODUCERS, CONSUMERS or ALL"
        ) from None
