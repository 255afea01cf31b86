"""Connection-factory attributes: Open MQ's names and defaults, Pythonic keywords.

Each attribute has an Open MQ name (`imqConsumerFlowLimit`), accepted from a dict or a
properties file with Open MQ's units, and a Python keyword (`consumer_flow_limit`) whose times are
in seconds. A bad value raises ConfigError at construction, naming the attribute.

Attributes (Open MQ name: keyword, default; meaning):

- imqAddressList: address, stomp://127.0.0.1:61613; comma-separated addresses, tried in order;
  `ssl://HOST:PORT` (or `stomp+ssl://`) for STOMP over TLS
- imqAddressListIterations: address_list_iterations, 1; passes over the list per (re)connect
- imqDefaultUsername / imqDefaultPassword: username / password, none; STOMP login / passcode
  (the password is never shown: not in the repr of the settings, nor in any error message);
  the keywords `login` and `passcode` are accepted as aliases (see `credentials`)
- imqConfiguredClientID: client_id, none; the client id (durable subscriptions)
- imqConsumerFlowLimit: consumer_flow_limit, 1000; messages per consumer (0 or -1: no limit of
  the consumer's own; the client then asks for UNLIMITED_CONSUMER_WINDOW, see below), or `auto`
  (any case; CONSUMER_FLOW_AUTO): the broker sizes each consumer's window from its measured pace
  and round trip, at least the consumer's declared handler pool (`pool_size`) and at most the
  destination's consumerFlowLimit, which the RECEIPT names and which bounds the buffer
- imqConsumerFlowThreshold: consumer_flow_threshold, 50; percent of the limit at which the
  broker tops up
- imqConsumerFlowLimitPrefetch: consumer_flow_limit_prefetch, true; false: one at a time
- imqConnectionFlowCount: connection_flow_count, 100; payload frames between control frames
- imqConnectionFlowLimit: connection_flow_limit, 1000; messages per connection, when enabled
- imqConnectionFlowLimitEnabled: connection_flow_limit_enabled, false
- imqAckTimeout: ack_timeout, 0 ms / None s; longest wait for a broker reply (0/None: none)
- imqAckOnProduce: ack_on_produce, unset; true: every send waits for a receipt, false: none
  does, unset: persistent ones do
- imqReconnectEnabled: reconnect_enabled, false; reopen a lost connection
- imqReconnectAttempts: reconnect_attempts, 0; attempts per address (-1: no limit, the list
  tried over and over; 0: one)
- imqReconnectInterval: reconnect_interval, 3000 ms / 3.0 s; pause between attempts
- imqPingInterval: ping_interval, 30 s; heart-beat interval both ways (0: none)
- imqQueueBrowserMaxMessagesPerRetrieve: queue_browser_max_messages_per_retrieve, 1000

TLS has a keyword and no Open MQ attribute (Open MQ's Java clients take whom they trust from the
JVM's trust store): `tls`, a `TlsSettings` (client/tls.py: the CA file, the host name check), as
the pipeline client takes it. `ssl://` addresses turn TLS on with the system's CAs unless `tls`
says otherwise; bare `HOST:PORT` addresses speak TLS when `tls` is given.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, TypeAlias
from urllib.parse import urlsplit

from sluiceway.client.credentials import CREDENTIAL_ALIASES, credential
from sluiceway.client.tls import TlsSettings
from sluiceway.config import int_parser, parse_bool
from sluiceway.errors import ConfigError
from sluiceway.javaprops import load_properties

DEFAULT_ADDRESS: Final = "stomp://127.0.0.1:61613"
DEFAULT_PORT: Final = 61613
# Address schemes of STOMP over TLS (`stomp+ssl` as ActiveMQ names it).
TLS_SCHEMES: Final = frozenset({"ssl", "stomp+ssl"})
# Messages per consumer the client asks for on SUBSCRIBE when imqConsumerFlowLimit sets no limit
# (0 or -1). The window the broker grants is what bounds a consumer's buffer (the broker sends no
# more until messages are consumed), so the client never asks for an unlimited one: a slow
# application would let its buffer grow without end. Ten times the default window, so that such
# a consumer is in practice never paused, while its buffer holds at most this many messages.
UNLIMITED_CONSUMER_WINDOW: Final = 10_000
# imqConsumerFlowLimit=auto: an adaptive window, sized by the broker (`consumer-flow-limit:auto`
# on SUBSCRIBE). The settings hold it as this string; numbers stay ints.
CONSUMER_FLOW_AUTO: Final = "auto"
FlowLimit: TypeAlias = int | Literal["auto"]


@dataclass(frozen=True, slots=True)
class Attribute:
    """One connection-factory attribute: its Open MQ name and how to read it.

    `from_text` reads the Open MQ form (a string in Open MQ's unit); `check` validates and
    normalises a Python keyword value (seconds for times).
    """

    name: str
    from_text: Callable[[str], Any]
    check: Callable[[Any], Any]
    doc: str
    secret: bool = False  # a password: its value is never repr'd nor quoted in an error


def attr(
    name: str,
    from_text: Callable[[str], Any],
    check: Callable[[Any], Any],
    default: Any,
    doc: str,
    *,
    secret: bool = False,
) -> Any:
    return field(
        default=default,
        repr=not secret,
        metadata={"attribute": Attribute(name, from_text, check, doc, secret)},
    )


# -- validators for keyword values ------------------------------------------------------------


def _int_check(minimum: int, maximum: int | None = None) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError("an integer")
        if value < minimum or (maximum is not None and value > maximum):
            upper = f" to {maximum}" if maximum is not None else ""
            raise ValueError(f"an integer from {minimum}{upper}")
        return value

    return check


def _bool_check(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError("True or False")
    return value


def _optional_bool_check(value: Any) -> bool | None:
    return None if value is None else _bool_check(value)


def _seconds_check(allow_none: bool) -> Callable[[Any], float | None]:
    def check(value: Any) -> float | None:
        if value is None and allow_none:
            return None
        accepted = "a number of seconds, 0 or more" + (", or None" if allow_none else "")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(accepted)
        if value < 0:
            raise ValueError(accepted)
        return None if (allow_none and value == 0) else float(value)

    return check


_FLOW_LIMIT_ACCEPTED: Final = "an integer from -1, or auto"


def _flow_limit_text(text: str) -> FlowLimit:
    """imqConsumerFlowLimit from a property: a number of messages from -1, or `auto`."""
    if text.strip().lower() == CONSUMER_FLOW_AUTO:
        return CONSUMER_FLOW_AUTO
    try:
        return int_parser(minimum=-1)(text)
    except ValueError:
        raise ValueError(_FLOW_LIMIT_ACCEPTED) from None


def _flow_limit_check(value: Any) -> FlowLimit:
    """consumer_flow_limit as a keyword: an int from -1, or the string `auto` (any case)."""
    if isinstance(value, str) and value.strip().lower() == CONSUMER_FLOW_AUTO:
        return CONSUMER_FLOW_AUTO
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(_FLOW_LIMIT_ACCEPTED)
    if value < -1:
        raise ValueError(_FLOW_LIMIT_ACCEPTED)
    return value


def _text_check(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError("a string")
    return value


def _credential_text(text: str) -> str:
    """A login or passcode: CONNECT headers are never escaped, so they cannot carry a line end."""
    if "\n" in text or "\r" in text:
        raise ValueError("text without line feeds or carriage returns (a CONNECT header)")
    return text


def _credential_check(value: Any) -> str | None:
    text = _text_check(value)
    return None if text is None else _credential_text(text)


def _addresses_check(value: Any) -> AddressList:
    if isinstance(value, tuple):
        return AddressList(value, None)
    if not isinstance(value, str):
        raise TypeError("a string such as stomp://127.0.0.1:61613")
    return parse_address_list(value)


@dataclass(frozen=True, slots=True)
class AddressList:
    """Brokers to try in order, and whether their scheme asks for TLS: True for `ssl://` (or
    `stomp+ssl://`), False for `stomp://`, None when every address is a bare `HOST:PORT`."""

    addresses: tuple[tuple[str, int], ...]
    tls: bool | None


def parse_address_list(text: str) -> AddressList:
    """`stomp://HOST:PORT` or `ssl://HOST:PORT` (`stomp+ssl://` too), or a bare `HOST:PORT`,
    comma-separated. One list speaks one way: plain and TLS schemes do not mix. A TLS address
    names its port, since the broker's STOMP over TLS has none by default."""
    addresses = []
    schemes: dict[bool, str] = {}  # TLS or not -> the first address that said so
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        split = urlsplit(part if "://" in part else f"stomp://{part}")
        tls = split.scheme in TLS_SCHEMES
        if not (tls or split.scheme == "stomp") or not split.hostname:
            raise ValueError(
                f"addresses of the form stomp://HOST:PORT or ssl://HOST:PORT, not {part!r}"
            )
        try:
            port = split.port
        except ValueError:
            raise ValueError(f"a valid port in {part!r}") from None
        if tls and port is None:
            raise ValueError(
                f"a port in {part!r}: STOMP over TLS has no default port (give the broker's "
                "imq.stomp.tls.port)"
            )
        if "://" in part:
            schemes.setdefault(tls, part)
        addresses.append((split.hostname, port or DEFAULT_PORT))
    if not addresses:
        raise ValueError("at least one address, such as stomp://127.0.0.1:61613")
    if len(schemes) > 1:
        raise ValueError(
            f"addresses that all speak plain STOMP or all TLS, not {schemes[False]!r} with "
            f"{schemes[True]!r}"
        )
    return AddressList(tuple(addresses), next(iter(schemes), None))


def _ms_to_seconds(text: str) -> float | None:
    return int_parser(minimum=0)(text) / 1000 or None


def _ms_to_seconds_required(text: str) -> float:
    return int_parser(minimum=0)(text) / 1000


def _optional_bool_text(text: str) -> bool | None:
    return None if text.strip() == "" else parse_bool(text)


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """Every attribute of a connection factory, validated."""

    # Read as an AddressList (addresses and scheme); build_settings keeps the addresses here and
    # what the scheme says in `tls`.
    addresses: tuple[tuple[str, int], ...] = attr(
        "imqAddressList",
        parse_address_list,
        _addresses_check,
        ((("127.0.0.1", DEFAULT_PORT)),),
        "broker addresses, tried in order",
    )
    address_list_iterations: int = attr(
        "imqAddressListIterations",
        int_parser(minimum=1),
        _int_check(1),
        1,
        "passes over the address list when connecting",
    )
    username: str | None = attr(
        "imqDefaultUsername", _credential_text, _credential_check, None, "STOMP login"
    )
    password: str | None = attr(
        "imqDefaultPassword",
        _credential_text,
        _credential_check,
        None,
        "STOMP passcode",
        secret=True,
    )
    client_id: str | None = attr(
        "imqConfiguredClientID", str, _text_check, None, "client id, for durable subscriptions"
    )
    consumer_flow_limit: int | Literal["auto"] = attr(
        "imqConsumerFlowLimit",
        _flow_limit_text,
        _flow_limit_check,
        1000,
        "messages per consumer, or auto",
    )
    consumer_flow_threshold: int = attr(
        "imqConsumerFlowThreshold",
        int_parser(0, 100),
        _int_check(0, 100),
        50,
        "percent of the limit",
    )
    consumer_flow_limit_prefetch: bool = attr(
        "imqConsumerFlowLimitPrefetch", parse_bool, _bool_check, True, "prefetch messages"
    )
    connection_flow_count: int = attr(
        "imqConnectionFlowCount",
        int_parser(minimum=0),
        _int_check(0),
        100,
        "payload frames between control frames",
    )
    connection_flow_limit: int = attr(
        "imqConnectionFlowLimit",
        int_parser(minimum=1),
        _int_check(1),
        1000,
        "messages per connection",
    )
    connection_flow_limit_enabled: bool = attr(
        "imqConnectionFlowLimitEnabled",
        parse_bool,
        _bool_check,
        False,
        "enable the connection limit",
    )
    ack_timeout: float | None = attr(
        "imqAckTimeout",
        _ms_to_seconds,
        _seconds_check(True),
        None,
        "longest wait for a broker reply, seconds",
    )
    ack_on_produce: bool | None = attr(
        "imqAckOnProduce",
        _optional_bool_text,
        _optional_bool_check,
        None,
        "which sends wait for a receipt",
    )
    reconnect_enabled: bool = attr(
        "imqReconnectEnabled", parse_bool, _bool_check, False, "reopen lost connections"
    )
    reconnect_attempts: int = attr(
        "imqReconnectAttempts", int_parser(minimum=-1), _int_check(-1), 0, "attempts per address"
    )
    reconnect_interval: float = attr(
        "imqReconnectInterval",
        _ms_to_seconds_required,
        _seconds_check(False),
        3.0,
        "pause between attempts, seconds",
    )
    ping_interval: float = attr(
        "imqPingInterval",
        lambda t: float(int_parser(minimum=0)(t)),
        _seconds_check(False),
        30.0,
        "heart-beat interval, seconds",
    )
    queue_browser_max_messages_per_retrieve: int = attr(
        "imqQueueBrowserMaxMessagesPerRetrieve",
        int_parser(minimum=1),
        _int_check(1),
        1000,
        "browser batch size",
    )
    # Whom a TLS connection trusts; None: plain TCP. A keyword only (see the module's doc).
    tls: TlsSettings | None = None

    @property
    def consumer_flow_auto(self) -> bool:
        """True when imqConsumerFlowLimit is `auto`: consumers ask for an adaptive window."""
        return self.consumer_flow_limit == CONSUMER_FLOW_AUTO

    @property
    def consumer_window(self) -> FlowLimit:
        """The consumer flow limit a consumer asks for on SUBSCRIBE: `auto`, or in messages the
        imqConsumerFlowLimit, UNLIMITED_CONSUMER_WINDOW when that is 0 or -1 (no limit)."""
        limit = self.consumer_flow_limit
        if isinstance(limit, str) or limit > 0:
            return limit  # auto, or a number
        return UNLIMITED_CONSUMER_WINDOW

    @property
    def attempts_per_address(self) -> int | None:
        """Reconnection attempts per address; None: no limit (imqReconnectAttempts -1)."""
        if self.reconnect_attempts < 0:
            return None
        return max(1, self.reconnect_attempts)


ATTRIBUTES: Final = {
    f.metadata["attribute"].name: (f.name, f.metadata["attribute"])
    for f in dataclasses.fields(ClientSettings)
    if "attribute" in f.metadata
}
KEYWORDS: Final = dict(ATTRIBUTES.values())
_HIDDEN: Final = "(hidden)"  # stands for a secret's value in error messages


def build_settings(
    address: str | None = None,
    properties: Mapping[str, str] | str | Path | None = None,
    **keywords: Any,
) -> ClientSettings:
    """Settings from Open MQ attributes (a dict or a properties file), then keywords.

    Raises ConfigError naming the first unknown attribute or bad value.
    """
    values: dict[str, Any] = {}
    if isinstance(properties, str | Path):
        properties = {line.key: line.value for line in load_properties(properties)}
    for name, text in (properties or {}).items():
        if name not in ATTRIBUTES:
            raise ConfigError(
                name,
                f"unknown connection-factory attribute {name}; "
                f"known attributes: {', '.join(sorted(ATTRIBUTES))}",
            )
        field_name, attribute = ATTRIBUTES[name]
        try:
            values[field_name] = attribute.from_text(text)
        except ValueError as exc:
            shown = _HIDDEN if attribute.secret else repr(text)
            raise ConfigError(name, f"{name} has the value {shown}; accepted: {exc}") from None
    if address is not None:
        keywords["addresses"] = address
    tls = _tls_check(keywords.pop("tls", None))
    for alias, name in CREDENTIAL_ALIASES.items():
        if alias in keywords:
            keywords[name] = credential(name, keywords.get(name), alias, keywords.pop(alias))
    for keyword, value in keywords.items():
        attribute = KEYWORDS.get(keyword)
        if attribute is None:
            raise ConfigError(
                keyword,
                f"unknown connection-factory keyword {keyword!r}; "
                f"known keywords: {', '.join(sorted([*KEYWORDS, 'tls']))}",
            )
        try:
            values[keyword] = attribute.check(value)
        except (TypeError, ValueError) as exc:
            shown = _HIDDEN if attribute.secret else repr(value)
            raise ConfigError(
                keyword, f"{keyword} ({attribute.name}) = {shown}; accepted: {exc}"
            ) from None
    listed = values.pop("addresses", None)
    if listed is not None:
        values["addresses"] = listed.addresses
    return ClientSettings(**values, tls=_transport(listed, tls))


def _tls_check(value: Any) -> TlsSettings | None:
    if value is None or isinstance(value, TlsSettings):
        return value
    raise ConfigError(
        "tls",
        f"tls = {value!r}; accepted: a TlsSettings (from sluiceway.client.tls) saying whom to "
        "trust, or None for plain TCP",
    )


def _transport(listed: AddressList | None, tls: TlsSettings | None) -> TlsSettings | None:
    """The TLS of the connections: what the addresses' scheme says (`ssl://`: TLS, trusting the
    system's CAs unless `tls` names a CA file), else `tls`. `tls` with `stomp://` addresses, or
    with no address at all (the default one is a plain port), raises ConfigError."""
    if listed is None and tls is not None:
        raise ConfigError(
            "addresses",
            "tls is given but no address: STOMP over TLS has no default port; give the "
            "broker's imq.stomp.tls.port as address='ssl://HOST:PORT'",
        )
    if listed is None or listed.tls is None:
        return tls
    if not listed.tls:
        if tls is not None:
            raise ConfigError(
                "tls",
                "tls is given with stomp:// addresses, which speak plain TCP: give ssl://HOST:PORT "
                "addresses (the broker's imq.stomp.tls.port), or leave tls out",
            )
        return None
    return tls if tls is not None else TlsSettings()
