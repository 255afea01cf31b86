"""The admin API's OpenAPI 3.1 document, served at /api/v1/openapi.json.

The response schemas are generated from the snapshot dataclasses of admin.model and
admin.metrics, so the document cannot drift from what the API returns; a test checks that every
route the server registers is documented, and nothing else.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Final, Union, get_args, get_origin

from aiohttp import web

from sluiceway import __version__
from sluiceway.admin import cluster, metrics, model, readers
from sluiceway.core.model.holding import HeldProducer

API: Final = "/api/v1"
_SCHEMAS: Final = (
    model.BrokerSnapshot,
    model.MemorySnapshot,
    model.DiskSnapshot,
    model.DestinationSummary,
    model.DestinationDetail,
    model.Totals,
    model.ConsumerSnapshot,
    readers.ReaderSnapshot,
    model.ConnectionSnapshot,
    model.ConnectionDestroyed,
    model.DurableSnapshot,
    metrics.DestinationTrend,
    metrics.ServiceTrend,
    metrics.Rates,
    metrics.CountTrend,
    HeldProducer,
    cluster.ClusterView,
    cluster.MemberSnapshot,
    cluster.ClusterEvent,
)
_ERROR: Final = {
    "type": "object",
    "required": ["error", "detail", "status"],
    "properties": {
        "error": {"type": "string", "description": "one-line summary"},
        "detail": {"type": "string", "description": "what was wrong and what to do"},
        "status": {"type": "integer", "description": "Open MQ status code (400-500)"},
        "destination": {"type": "string"},
        "limit": {"type": "string", "description": "the property that refused it"},
        "limit_value": {"type": "string"},
    },
}
_TYPE = {"name": "type", "in": "path", "required": True, "schema": {"enum": ["queue", "topic"]}}
_NAME = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
_PROPERTIES_FIELD: Final[dict[str, Any]] = {
    "type": "object",
    "additionalProperties": {"type": "string"},
    "description": 'Open MQ property names and values, e.g. {"maxNumMsgs": "5000"}',
}
_PROPERTIES_BODY: Final = {"type": "object", "properties": {"properties": _PROPERTIES_FIELD}}
_TARGET_BODY = {
    "type": "object",
    "properties": {"target": {"enum": ["PRODUCERS", "CONSUMERS", "ALL"], "default": "ALL"}},
}


_SIMPLE: Final[dict[Any, dict[str, Any]]] = {
    int: {"type": "integer"},
    float: {"type": "number"},
    str: {"type": "string"},
    bool: {"type": "boolean"},
    type(None): {"type": "null"},
}


def _schema(annotation: Any) -> dict[str, Any]:
    """A JSON schema for a resolved type annotation."""
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return {"$ref": f"#/components/schemas/{annotation.__name__}"}
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin in (Union, types.UnionType):
        return {"anyOf": [_schema(arg) for arg in args]}
    if origin is list:
        return {"type": "array", "items": _schema(args[0])}
    if origin is dict:
        return {"type": "object", "additionalProperties": _schema(args[1])}
    return _SIMPLE.get(annotation, {})  # {}: any value


def dataclass_schema(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls, vars(model) | vars(metrics) | vars(cluster))
    fields = dataclasses.fields(cls)
    return {
        "type": "object",
        "required": [f.name for f in fields],
        "properties": {f.name: _schema(hints[f.name]) for f in fields},
    }


def _op(
    summary: str,
    response: dict[str, Any] | None = None,
    *,
    body: dict[str, Any] | None = None,
    status: str = "200",
    path: bool = False,
) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "summary": summary,
        "responses": {
            status: {
                "description": "OK",
                "content": {"application/json": {"schema": response or {"type": "object"}}},
            },
            "default": {
                "description": "refused (the error names the cause)",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
            },
        },
    }
    if body is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": body}},
        }
    if path:
        operation["parameters"] = [_TYPE, _NAME]
    return operation


def _ref(name: str, many: bool = False) -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{name}"}
    return {"type": "array", "items": ref} if many else ref


def document() -> dict[str, Any]:
    one = f"{API}/destinations/{{type}}/{{name}}"
    detail = _ref("DestinationDetail")
    paths: dict[str, dict[str, Any]] = {
        f"{API}/broker": {
            "get": _op("query bkr: the broker's state and properties", _ref("BrokerSnapshot")),
            "patch": _op(
                "update bkr: change run-time broker properties",
                _ref("BrokerSnapshot"),
                body=_PROPERTIES_BODY,
            ),
        },
        f"{API}/destinations": {
            "get": _op("list dst (?type=queue|topic)", _ref("DestinationSummary", many=True)),
            "post": _op(
                "create dst",
                detail,
                body={
                    "type": "object",
                    "required": ["type", "name"],
                    "properties": {
                        "type": {"enum": ["queue", "topic"]},
                        "name": {"type": "string"},
                        "properties": _PROPERTIES_FIELD,
                    },
                },
                status="201",
            ),
        },
        f"{API}/destinations/pause": {"post": _op("pause dst (all)", body=_TARGET_BODY)},
        f"{API}/destinations/resume": {"post": _op("resume dst (all)", body=_TARGET_BODY)},
        f"{API}/destinations/compact": {"post": _op("compact dst: the whole journal", body={})},
        one: {
            "get": _op("query dst", detail, path=True),
            "patch": _op("update dst", detail, body=_PROPERTIES_BODY, path=True),
            "delete": _op("destroy dst", path=True),
        },
        f"{one}/pause": {"post": _op("pause dst", detail, body=_TARGET_BODY, path=True)},
        f"{one}/resume": {"post": _op("resume dst", detail, body=_TARGET_BODY, path=True)},
        f"{one}/purge": {"post": _op("purge dst", body={}, path=True)},
        f"{one}/compact": {"post": _op("compact dst (paused first)", body={}, path=True)},
        f"{API}/connections": {"get": _op("list cxn", _ref("ConnectionSnapshot", many=True))},
        f"{API}/connections/{{id}}": {
            "delete": {
                **_op(
                    "destroy cxn: the client gets an ERROR (status 410) with the reason, then the "
                    "connection closes",
                    _ref("ConnectionDestroyed"),
                    body={
                        "type": "object",
                        "properties": {
                            "reason": {
                                "type": "string",
                                "maxLength": 200,
                                "description": "one line, sent to the client",
                            }
                        },
                    },
                ),
                "parameters": [
                    {"name": "id", "in": "path", "required": True, "schema": {"type": "integer"}}
                ],
            }
        },
        f"{API}/consumers": {"get": _op("every consumer", _ref("ConsumerSnapshot", many=True))},
        f"{API}/readers": {
            "get": _op(
                "every pipeline reader (a topic's cursor groups, a queue's lease groups) and its "
                "lag",
                _ref("ReaderSnapshot", many=True),
            )
        },
        f"{API}/producers": {
            "get": _op("held producers, in pause order", _ref("HeldProducer", many=True))
        },
        f"{API}/durables": {"get": _op("list dur", _ref("DurableSnapshot", many=True))},
        f"{API}/durables/{{client_id}}/{{name}}": {
            "delete": {
                **_op("destroy dur"),
                "parameters": [
                    {"name": n, "in": "path", "required": True, "schema": {"type": "string"}}
                    for n in ("client_id", "name")
                ],
            }
        },
        f"{API}/metrics/broker": {"get": _op("metrics bkr: totals, rates, memory, disk")},
        f"{API}/metrics/services": {"get": _op("metrics svc", _ref("ServiceTrend", many=True))},
        f"{API}/metrics/destinations/{{type}}/{{name}}": {
            "get": _op("metrics dst", _ref("DestinationTrend"), path=True)
        },
        f"{API}/cluster": {
            "get": _op(
                "list bkr: the cluster's members, their states and leases, recent events",
                _ref("ClusterView"),
            )
        },
        f"{API}/openapi.json": {"get": _op("this document")},
    }
    schemas = {cls.__name__: dataclass_schema(cls) for cls in _SCHEMAS} | {"Error": _ERROR}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Sluiceway admin API",
            "version": __version__,
            "description": "The HTTP JSON API of the admin endpoint (imq.admin.http.port). "
            "With authentication on, every request needs HTTP Basic credentials of a user in the "
            "admin group. Requests that change something must be application/json.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"basic": {"type": "http", "scheme": "basic"}},
        },
        "security": [{"basic": []}],
    }


def register(app: web.Application) -> None:
    spec = document()

    async def openapi(request: web.Request) -> web.Response:
        return web.json_response(spec)

    app.router.add_get(f"{API}/openapi.json", openapi)
