"""Helpers of the listener, browser and admin-connection probes (tests/security/test_hardening.py)
and of the deeper tests of the same checks: certificates with chosen dates, raw HTTP and
WebSocket handshakes with chosen headers, a STOMP session over WebSocket, the sockets this
process listens on, and the log lines a logger emits.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import socket
import ssl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import trustme

from tests.e2e.rawclient import RawClient
from tests.server.wsclient import WsStomp

TIMEOUT = 10.0  # every wait here is bounded by this


@dataclass(frozen=True)
class Certificate:
    """A certificate for 127.0.0.1 and localhost, its key and the CA that signed it, in files."""

    ca: trustme.CA
    certfile: Path
    keyfile: Path
    not_before: datetime
    not_after: datetime

    def properties(self) -> dict[str, str]:
        return {"imq.tls.certfile": str(self.certfile), "imq.tls.keyfile": str(self.keyfile)}

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context()
        self.ca.configure_trust(context)
        return context


def make_certificate(
    directory: Path,
    name: str = "broker",
    *,
    not_before: datetime | None = None,
    not_after: datetime | None = None,
) -> Certificate:
    """A certificate valid from `not_before` to `not_after` (default: a year either side of
    now), written as NAME.pem and NAME.key in `directory`."""
    now = datetime.now(UTC).replace(microsecond=0)
    not_before = not_before or now.replace(year=now.year - 1)
    not_after = not_after or now.replace(year=now.year + 1)
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1", "localhost", not_before=not_before, not_after=not_after)
    certfile, keyfile = directory / f"{name}.pem", directory / f"{name}.key"
    certfile.write_bytes(b"".join(blob.bytes() for blob in issued.cert_chain_pems))
    issued.private_key_pem.write_to_path(str(keyfile))
    return Certificate(ca, certfile, keyfile, not_before, not_after)


def tls_client(port: int, context: ssl.SSLContext) -> RawClient:
    """A RawClient over TLS (the handshake happens here)."""
    client = RawClient(port)
    try:
        client.sock = context.wrap_socket(client.sock, server_hostname="127.0.0.1")
    except BaseException:
        client.close()
        raise
    return client


def listening_ports() -> set[int]:
    """The TCP ports this process listens on (Linux: /proc/net/tcp* and /proc/self/fd)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            listening = fields[3] == "0A"
            if listening and fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    head: str
    body: bytes


def http_exchange(port: int, request: bytes, *, sock: socket.socket | None = None) -> HttpAnswer:
    """Send `request` and read one answer (whose body runs to Content-Length or to the end)."""
    own = sock is None
    if sock is None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    try:
        sock.sendall(request)
        return read_answer(sock)
    finally:
        if own:
            sock.close()


def read_answer(sock: socket.socket) -> HttpAnswer:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before an answer's head: {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    text = head.decode("latin-1")
    status = int(text.split(" ", 2)[1])
    length = None
    for line in text.split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    if status == 101:
        return HttpAnswer(status, text, b"")
    while length is None or len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return HttpAnswer(status, text, body)


def get_request(path: str, host: str | None, *, close: bool = True, **headers: str) -> bytes:
    lines = [f"GET {path} HTTP/1.1"]
    if host is not None:
        lines.append(f"Host: {host}")
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def ws_handshake(port: int, path: str = "/stomp", origin: str | None = None) -> HttpAnswer:
    """A WebSocket handshake with `origin` (none: no Origin header); the answer's head."""
    headers = {
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Protocol": "v12.stomp",
    }
    if origin is not None:
        headers["Origin"] = origin
    request = get_request(path, f"127.0.0.1:{port}", close=False, **headers)
    return http_exchange(port, request)


def ws_connect(port: int, path: str, origin: str | None, login: str, passcode: str) -> str:
    """Open STOMP over WebSocket with aiohttp's client and CONNECT: the frame's command, or
    `HTTP <status>` when the handshake is refused."""

    async def run() -> str:
        async with aiohttp.ClientSession() as session:
            try:
                ws = await session.ws_connect(
                    f"http://127.0.0.1:{port}{path}",
                    protocols=("v12.stomp",),
                    origin=origin,
                    timeout=aiohttp.ClientWSTimeout(ws_close=TIMEOUT),
                )
            except aiohttp.WSServerHandshakeError as exc:
                return f"HTTP {exc.status}"
            try:
                frame = await WsStomp(ws).connect(login=login, passcode=passcode)
                return frame.command
            finally:
                await ws.close()

    return asyncio.run(asyncio.wait_for(run(), TIMEOUT))


def closed_within(sock: socket.socket, deadline: float) -> bool:
    """Whether the broker closes `sock` before `deadline` (reading and dropping what comes)."""
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            sock.settimeout(left)
            if not sock.recv(65536):
                return True
    except TimeoutError:
        return False
    except (ConnectionResetError, ssl.SSLError):  # an abort; over TLS, a cut stream
        return True


class Records(logging.Handler):
    """The records a logger emits at WARNING and above while `capture` lasts."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def text(self) -> str:
        return "\n".join(record.getMessage() for record in self.records)


@contextmanager
def capture(logger: str) -> Iterator[Records]:
    records = Records()
    target = logging.getLogger(logger)
    target.addHandler(records)
    try:
        yield records
    finally:
        target.removeHandler(records)
