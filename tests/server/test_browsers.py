"""The Origin and Host checks (server.browsers) and the syntax of their properties (config.web),
as tables of header values: what is accepted, what is refused, and the errors of bad values."""

from __future__ import annotations

import pytest

from sluiceway.config import build_config
from sluiceway.config.properties import format_default
from sluiceway.config.web import normalize_host, parse_hosts, parse_origin, parse_origins
from sluiceway.errors import ConfigError
from sluiceway.server.browsers import HostPolicy, OriginPolicy, served_names, shown

LOOPBACK = served_names(("127.0.0.1", "127.0.0.1"), "mq-box")
EVERY_ADDRESS = served_names(("0.0.0.0", "192.0.2.7"), "mq-box")  # noqa: S104  (a name)


def test_names_served_on_loopback_and_on_every_address() -> None:
    assert {"127.0.0.1", "localhost", "::1", "mq-box"} == LOOPBACK
    # Bound to every address: the address a request came in on, not a wildcard.
    assert {"192.0.2.7", "mq-box"} == EVERY_ADDRESS
    assert served_names(("localhost", None)) == {"localhost", "127.0.0.1", "::1"}
    assert served_names(("::1", "::1")) == {"localhost", "127.0.0.1", "::1"}
    assert served_names(("MQ.Example.COM.", "192.0.2.7")) == {"mq.example.com", "192.0.2.7"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://example.com", ("http", "example.com", 80)),
        ("HTTPS://Example.COM", ("https", "example.com", 443)),
        ("https://example.com:8443", ("https", "example.com", 8443)),
        ("http://[::1]:3000", ("http", "::1", 3000)),
        ("http://127.0.0.1", ("http", "127.0.0.1", 80)),
        ("chrome-extension://abcdef", ("chrome-extension", "abcdef", None)),
        ("http://localhost:3000/", ("http", "localhost", 3000)),
    ],
)
def test_origins_are_parsed_and_normalised(
    text: str, expected: tuple[str, str, int | None]
) -> None:
    assert parse_origin(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "null",
        "example.com",
        "http://",
        "http://example.com/app",
        "http://user@example.com",
        "http://example.com:http",
        "http://example.com:0",
        "http://exa mple.com",
        "http://[::1",
        "://example.com",
    ],
)
def test_what_is_no_origin_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not"):
        parse_origin(text)


@pytest.mark.parametrize(
    ("origin", "allowed", "served", "accepted"),
    [
        (None, (), LOOPBACK, True),  # not a browser
        ("http://localhost:3000", (), LOOPBACK, True),  # a page of this host, any port
        ("https://127.0.0.1", (), LOOPBACK, True),
        ("http://[::1]:8080", (), LOOPBACK, True),
        ("http://mq-box:8080", (), LOOPBACK, True),  # the machine's name
        ("http://evil.example", (), LOOPBACK, False),
        ("http://localhost.evil.example", (), LOOPBACK, False),
        ("http://127.0.0.2", (), LOOPBACK, False),
        ("null", (), LOOPBACK, False),  # a sandboxed page or a file
        ("not an origin", (), LOOPBACK, False),
        ("http://192.0.2.7:80", (), EVERY_ADDRESS, True),
        ("http://localhost", (), EVERY_ADDRESS, False),  # not served on loopback
        ("https://app.example.com", ("https://app.example.com",), LOOPBACK, True),
        ("https://app.example.com:443", ("https://app.example.com",), LOOPBACK, True),
        ("https://app.example.com:8443", ("https://app.example.com",), LOOPBACK, False),
        ("http://app.example.com", ("https://app.example.com",), LOOPBACK, False),
        ("http://evil.example", ("*",), LOOPBACK, True),
        ("null", ("*",), LOOPBACK, True),
    ],
)
def test_origin_policy(
    origin: str | None, allowed: tuple[str, ...], served: frozenset[str], accepted: bool
) -> None:
    policy = OriginPolicy(parse_origins(",".join(allowed)))
    assert policy.allows(origin, served) is accepted


@pytest.mark.parametrize(
    ("host", "allowed", "served", "accepted"),
    [
        (None, (), LOOPBACK, True),  # HTTP/1.0 without Host: not a browser
        ("localhost", (), LOOPBACK, True),
        ("localhost:61680", (), LOOPBACK, True),
        ("LOCALHOST.:61680", (), LOOPBACK, True),
        ("127.0.0.1:61680", (), LOOPBACK, True),
        ("[::1]:61680", (), LOOPBACK, True),
        ("[::1]", (), LOOPBACK, True),
        ("mq-box:61680", (), LOOPBACK, True),
        ("evil.example:61680", (), LOOPBACK, False),
        ("evil.example", (), LOOPBACK, False),
        ("localhost@evil.example", (), LOOPBACK, False),
        ("localhost:61680:1", (), LOOPBACK, False),
        ("", (), LOOPBACK, False),
        ("192.0.2.7:61680", (), EVERY_ADDRESS, True),
        ("127.0.0.1:61680", (), EVERY_ADDRESS, False),
        ("mq.example.com", ("mq.example.com",), LOOPBACK, True),
        ("mq.example.com:443", ("mq.example.com",), LOOPBACK, True),
        ("mq.example.com:443", ("mq.example.com:443",), LOOPBACK, True),
        ("mq.example.com", ("mq.example.com:443",), LOOPBACK, False),  # http: port 80
        ("mq.example.com:8443", ("mq.example.com:443",), LOOPBACK, False),
        ("anything.example", ("*",), LOOPBACK, True),
    ],
)
def test_host_policy(
    host: str | None, allowed: tuple[str, ...], served: frozenset[str], accepted: bool
) -> None:
    policy = HostPolicy(parse_hosts(",".join(allowed)))
    assert policy.allows(host, served, "http") is accepted


def test_a_listed_host_without_port_is_the_schemes_default_port_when_it_has_one() -> None:
    policy = HostPolicy(parse_hosts("mq.example.com:443"))
    assert policy.allows("mq.example.com", frozenset(), "https")
    assert not policy.allows("mq.example.com", frozenset(), "http")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", ()),
        (
            " https://App.example.com , http://localhost:3000 ",
            ("https://app.example.com:443", "http://localhost:3000"),
        ),
        ("http://a.example,*", ("*",)),
        ("http://[::1]:8080", ("http://[::1]:8080",)),
    ],
)
def test_the_origins_property_is_normalised(text: str, expected: tuple[str, ...]) -> None:
    config = build_config({"imq.stomp.ws.allowed_origins": text})
    assert config.ws_allowed_origins == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", ()),
        (
            "MQ.example.com, 10.0.0.5:8080, [::1]:61680",
            ("mq.example.com", "10.0.0.5:8080", "[::1]:61680"),
        ),
        ("*", ("*",)),
    ],
)
def test_the_hosts_property_is_normalised(text: str, expected: tuple[str, ...]) -> None:
    config = build_config({"imq.admin.allowed_hosts": text})
    assert config.admin_allowed_hosts == expected


@pytest.mark.parametrize(
    ("name", "value", "fragment"),
    [
        ("imq.stomp.ws.allowed_origins", "app.example.com", "scheme://host[:port]"),
        ("imq.stomp.ws.allowed_origins", "https://app.example.com/page", "no user, path or query"),
        ("imq.admin.allowed_hosts", "mq.example.com:99999", "number from 1 to 65535"),
        ("imq.admin.allowed_hosts", "http://mq.example.com", "host[:port]"),
        ("imq.admin.allowed_hosts", "bad host", "not a host name"),
    ],
)
def test_bad_values_name_the_property_and_the_entry(name: str, value: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as refused:
        build_config({name: value})
    assert refused.value.name == name
    assert name in str(refused.value)
    assert fragment in str(refused.value)


def test_the_values_in_force_are_shown_as_written_back() -> None:
    """What `query bkr` shows can be given back as the property's value."""
    config = build_config({"imq.stomp.ws.allowed_origins": "https://a.example,http://b.example:81"})
    shown_value = "https://a.example:443,http://b.example:81"
    assert format_default(config.ws_allowed_origins) == shown_value
    assert build_config({"imq.stomp.ws.allowed_origins": shown_value}) == config


def test_hosts_are_normalised() -> None:
    assert normalize_host("[::0:1]") == "::1"
    assert normalize_host("Example.COM.") == "example.com"
    with pytest.raises(ValueError, match="not a host"):
        normalize_host("-bad-.example")


def test_what_a_client_sent_is_shown_escaped_and_cut() -> None:
    assert shown("evil\r\nX: y") == "'evil\\r\\nX: y'"
    assert shown("a" * 500).endswith("' (cut)")
    assert len(shown("a" * 500)) < 220
