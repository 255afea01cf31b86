"""Each class of the synchronous client has its asyncio twin's methods, without `await`.

For every public class of `sluiceway.client.sync` and its asyncio counterpart, every public
method has the same name, the same parameters (names, kinds, defaults) and the matching return
type (a synchronous class where the asyncio method returns its twin). The differences are listed
below, each with its reason; a new method on either side without a twin fails this test until it
gets one or a reason.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, Final

import pytest

from sluiceway.client import browser, connection, consumer, message, producer, session, sync

# asyncio class -> its synchronous twin
TWINS: Final[dict[type, type]] = {
    connection.ConnectionFactory: sync.ConnectionFactory,
    connection.Connection: sync.Connection,
    session.Session: sync.Session,
    producer.Producer: sync.Producer,
    consumer.Consumer: sync.Consumer,
    browser.QueueBrowser: sync.QueueBrowser,
    message.Message: sync.Message,
}

# The protocols' methods that take each other's place.
DUNDER_TWINS: Final = {
    "__aiter__": "__iter__",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
}

# (asyncio class, method) without a synchronous twin, and why.
PLUMBING = (
    "called by the client's own sessions and consumers, not by applications; the synchronous "
    "client reaches it through the asyncio object it wraps"
)
ASYNC_ONLY: Final[dict[tuple[type, str], str]] = {
    **{
        (connection.Connection, name): PLUMBING
        for name in (
            "open",
            "wire",
            "send",
            "send_nowait",
            "request",
            "buffer_changed",
            "next_id",
            "register",
            "unregister",
            "adopt",
            "forget",
        )
    },
    **{
        (session.Session, name): PLUMBING
        for name in (
            "handed_over",
            "forget_consumer_acks",
            "transaction",
            "connection_lost",
            "forget",
        )
    },
    **{
        (consumer.Consumer, name): PLUMBING
        for name in ("subscribe", "resubscribe", "deliver", "connection_lost", "connection_closed")
    },
    (consumer.Consumer, "__anext__"): (
        "the synchronous consumer's __iter__ is a generator: there is no separate next step"
    ),
}

# (synchronous class, method) whose parameters differ from its twin's, and why.
DIFFERENT_PARAMETERS: Final[dict[tuple[type, str], str]] = {
    # Constructors: the synchronous objects wrap asyncio ones and are made by the synchronous
    # API itself; only the factory is made by applications.
    **{
        (cls, "__init__"): "a wrapper of the asyncio object, made by the synchronous API"
        for cls in TWINS.values()
        if cls is not sync.ConnectionFactory
    },
}


def public_methods(cls: type) -> dict[str, Callable[..., Any]]:
    """The methods of `cls` an application may call: public names, the constructor, and the
    protocols' methods (context manager, iteration)."""
    methods: dict[str, Callable[..., Any]] = {}
    protocols = {"__init__", "__anext__", "__next__", *DUNDER_TWINS, *DUNDER_TWINS.values()}
    for name, value in inspect.getmembers(cls):
        if (not name.startswith("_") or name in protocols) and inspect.isfunction(value):
            methods[name] = value
    return methods


def sync_name(name: str) -> str:
    return DUNDER_TWINS.get(name, name)


def as_sync(annotation: Any) -> Any:
    """The synchronous type that stands for an asyncio one (recursively through unions and
    generic arguments)."""
    if annotation in TWINS:
        return TWINS[annotation]
    if annotation is None:
        return type(None)
    origin: Any = typing.get_origin(annotation)
    if origin is None:
        return annotation
    arguments = tuple(as_sync(a) for a in typing.get_args(annotation))
    if origin is Awaitable:  # a plain method returning an awaitable: the sync one waits
        return arguments[0]
    if origin in (types.UnionType, typing.Union):
        return typing.Union[arguments]  # noqa: UP007  (built from a tuple of types)
    if origin is AsyncIterator:
        origin = Iterator
    return origin[arguments]


def shape(function: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    """(name, kind, default) of each parameter but `self`."""
    parameters = list(inspect.signature(function).parameters.values())[1:]
    return [(p.name, p.kind, p.default) for p in parameters]


PAIRS: Final = [
    (async_cls, sync_cls, name, function)
    for async_cls, sync_cls in TWINS.items()
    for name, function in public_methods(async_cls).items()
    if (async_cls, name) not in ASYNC_ONLY
]


@pytest.mark.parametrize(
    ("async_cls", "sync_cls", "name", "function"),
    PAIRS,
    ids=[f"{a.__name__}.{n}" for a, _, n, _ in PAIRS],
)
def test_every_asyncio_method_has_a_synchronous_twin_with_its_signature(
    async_cls: type, sync_cls: type, name: str, function: Callable[..., Any]
) -> None:
    twin = public_methods(sync_cls).get(sync_name(name))
    assert twin is not None, f"sync.{sync_cls.__name__} has no {sync_name(name)} for {name}"
    if (sync_cls, sync_name(name)) in DIFFERENT_PARAMETERS:
        return
    assert shape(twin) == shape(function)
    async_return: Any = typing.get_type_hints(function).get("return")
    sync_return = typing.get_type_hints(twin).get("return")
    if name == "__aenter__":  # returns the connection itself, whichever kind it is
        async_return = TWINS.get(async_return, async_return)
    assert sync_return == as_sync(async_return)


def test_every_synchronous_method_has_an_asyncio_twin() -> None:
    async_names = {cls: {sync_name(name) for name in public_methods(cls)} for cls in TWINS}
    missing = [
        f"sync.{sync_cls.__name__}.{name}"
        for async_cls, sync_cls in TWINS.items()
        for name in public_methods(sync_cls)
        if name not in async_names[async_cls]
    ]
    assert missing == []


def test_every_listed_difference_names_a_method_that_exists() -> None:
    for cls, name in ASYNC_ONLY:
        assert name in public_methods(cls), f"{cls.__name__}.{name} is listed but gone"
    for cls, name in DIFFERENT_PARAMETERS:
        assert name in public_methods(cls), f"{cls.__name__}.{name} is listed but gone"
