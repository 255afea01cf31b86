"""The client side of the broker's admin API (admin/http.py), for `sluiceway cmd`.

Blocking HTTP with the standard library's urllib: one request per call, JSON in and out. What
can go wrong is sorted into the three errors `sluiceway cmd` reports, each with its exit status:
`Refused` (the broker answered with an error: 1), `UsageError` (the command line is wrong: 2) and
`Unreachable` (no answer from the broker: 3).
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from sluiceway.errors import ConfigError, SluicewayError
from sluiceway.javaprops import parse_properties

API_PATH: Final = "/api/v1"
DEFAULT_PORT: Final = 61680  # imq.admin.http.port
DEFAULT_ADDRESS: Final = f"127.0.0.1:{DEFAULT_PORT}"
PASSWORD_ENV: Final = "SLUICEWAY_ADMIN_PASSWORD"  # noqa: S105  (a variable's name, no secret)
PASSFILE_KEY: Final = "imq.imqcmd.password"  # what imqcmd -passfile reads
_MUTATING: Final = frozenset({"POST", "PATCH", "PUT", "DELETE"})


class CmdError(SluicewayError):
    """A failure `sluiceway cmd` reports in one line on stderr, exiting with `exit_status`."""

    exit_status = 1


class Refused(CmdError):
    """The broker (or the users file) refused: nothing was changed."""

    exit_status = 1

    def __init__(self, message: str, *, http_status: int = 0) -> None:
        super().__init__(message)
        self.http_status = http_status


class UsageError(CmdError):
    """The command line is wrong or incomplete."""

    exit_status = 2


class Unreachable(CmdError):
    """The admin API could not be reached, or did not answer in time."""

    exit_status = 3


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_address(text: str) -> Address:
    """`host:port`, `host` (the default port) or `[v6 address]:port`, as imqcmd -b takes."""
    text = text.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest.removeprefix(":")
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host, port_text = text, ""
    if not host:
        raise UsageError(f"-b {text!r}: expected HOST:PORT, e.g. -b {DEFAULT_ADDRESS}")
    if not port_text:
        return Address(host, DEFAULT_PORT)
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise UsageError(f"-b {text!r}: the port must be a number from 1 to 65535")
    return Address(host, int(port_text))


def read_passfile(path: str) -> str:
    """The password in `path`: the value of imq.imqcmd.password (as Open MQ's imqcmd -passfile
    reads it), or else the file's first line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"-passfile {path}: cannot read it: {exc}") from None
    try:
        entries = {line.key: line.value for line in parse_properties(text, path)}
    except ConfigError:
        entries = {}
    if PASSFILE_KEY in entries:
        password = entries[PASSFILE_KEY]
    else:
        password = text.splitlines()[0] if text else ""
    if not password:
        raise UsageError(f"-passfile {path}: no password in it (expected {PASSFILE_KEY}=...)")
    return password


def password_from_environment() -> str | None:
    return os.environ.get(PASSWORD_ENV) or None


class AdminApi:
    """Calls the admin API at `address`; every call returns the answer's JSON."""

    def __init__(
        self,
        address: Address,
        *,
        tls: bool = False,
        cafile: str | None = None,
        user: str | None = None,
        password: str | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.address = address
        self.scheme = "https" if tls else "http"
        self.base = f"{self.scheme}://{address}{API_PATH}"
        self.timeout = timeout
        self.user = user
        self._context: ssl.SSLContext | None = None
        if tls:
            try:
                self._context = ssl.create_default_context(cafile=cafile)
            except (OSError, ssl.SSLError) as exc:
                raise UsageError(f"--cafile {cafile}: cannot load it: {exc}") from None
        self._authorization = ""
        if user is not None:
            token = base64.b64encode(f"{user}:{password or ''}".encode()).decode("ascii")
            self._authorization = f"Basic {token}"

    def get(self, path: str, **query: str) -> Any:
        return self.request("GET", path, query=query)

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self.request("POST", path, body)

    def patch(self, path: str, body: dict[str, Any]) -> Any:
        return self.request("PATCH", path, body)

    def delete(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self.request("DELETE", path, body)

    def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        query: dict[str, str] | None = None,
    ) -> Any:
        url = self.base + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        headers = {"Accept": "application/json"}
        data = None
        if method in _MUTATING:
            # The API refuses a change without this header (a browser cannot forge it).
            headers["Content-Type"] = "application/json"
            data = json.dumps(body or {}).encode()
        if self._authorization:
            headers["Authorization"] = self._authorization
        request = urllib.request.Request(url, data=data, headers=headers, method=method)  # noqa: S310  (http or https, built above)
        try:
            with urllib.request.urlopen(  # noqa: S310  (the scheme is http or https)
                request, timeout=self.timeout, context=self._context
            ) as response:
                return _json(response.read(), url, response.status)
        except urllib.error.HTTPError as exc:
            raise self._refused(exc, url) from None
        except urllib.error.URLError as exc:
            raise self._unreachable(exc.reason) from None
        except (OSError, http.client.HTTPException) as exc:
            raise self._unreachable(exc) from None

    def _refused(self, error: urllib.error.HTTPError, url: str) -> Refused:
        try:
            answer = json.loads(error.read())
        except (ValueError, OSError):
            answer = None
        if not isinstance(answer, dict) or "error" not in answer:
            return Refused(
                f"{url.split('?', 1)[0]} answered HTTP {error.code} {error.reason}: is this the "
                "Sluiceway admin API (imq.admin.http.port)?",
                http_status=error.code,
            )
        summary, detail = str(answer["error"]), str(answer.get("detail", ""))
        message = f"{summary}: {detail}" if detail and detail != summary else summary
        if error.code == 401 and self.user is None:
            message += "; give an administrator's name with -u (and the password with -passfile "
            message += f"or {PASSWORD_ENV})"
        return Refused(message, http_status=error.code)

    def _unreachable(self, reason: object) -> Unreachable:
        where = f"the broker's admin API at {self.scheme}://{self.address}"
        if isinstance(reason, ConnectionRefusedError):
            text = (
                f"cannot connect to {where}: connection refused; the broker may not be running, "
                "or its admin port (imq.admin.http.port) is another one: give it with -b HOST:PORT"
            )
        elif isinstance(reason, ssl.SSLCertVerificationError):
            text = (
                f"cannot connect to {where}: its TLS certificate was not accepted "
                f"({reason.verify_message}); give the CA that signed it with --cafile"
            )
        elif isinstance(reason, ssl.SSLError):
            text = f"cannot connect to {where}: TLS failed ({reason}); does it serve HTTPS?"
        elif isinstance(reason, TimeoutError):
            text = f"no answer from {where} within {self.timeout:g} s (--timeout)"
        elif isinstance(reason, http.client.RemoteDisconnected | ConnectionResetError):
            hint = (
                "" if self.scheme == "https" else "; if it serves HTTPS (imq.admin.tls), add --tls"
            )
            text = f"{where} closed the connection without answering{hint}"
        elif isinstance(reason, socket.gaierror):
            text = f"cannot connect to {where}: unknown host {self.address.host!r}"
        else:
            text = f"cannot connect to {where}: {reason}"
        return Unreachable(text)


def _json(data: bytes, url: str, status: int) -> Any:
    try:
        return json.loads(data) if data else None
    except ValueError:
        raise Refused(
            f"{url} answered HTTP {status} with something that is not JSON: is this the "
            "Sluiceway admin API (imq.admin.http.port)?"
        ) from None
