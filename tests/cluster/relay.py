"""A TCP relay between a broker and PostgreSQL that a test can cut, as a network would: every
relayed connection is closed at once and new ones are refused."""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType


class Relay:
    """Listens on 127.0.0.1 (port 0: `port` tells which) and forwards to `target_port`."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._cut = False
        self._threads: list[threading.Thread] = []
        self._start(self._accept)

    def _start(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # cut: the listener is closed
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                if self._cut:
                    client.close()
                    server.close()
                    return
                self._sockets += [client, server]
            self._start(self._pipe, client, server)
            self._start(self._pipe, server, client)

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """Close every relayed connection and refuse new ones (the port is closed)."""
        with self._lock:
            self._cut = True
            sockets, self._sockets = self._sockets, []
        self._listener.close()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def __enter__(self) -> Relay:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cut()
        for thread in self._threads:
            thread.join(5)
