"""A small synchronous client of the admin API for tests (urllib, JSON in and out)."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from typing import Any


class AdminHttp:
    def __init__(self, port: int, user: str | None = None, password: str | None = None) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.auth = None
        if user is not None:
            token = base64.b64encode(f"{user}:{password or ''}".encode()).decode()
            self.auth = f"Basic {token}"

    def raw(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> tuple[int, bytes, dict[str, str]]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": content_type} if method != "GET" else {}
        if self.auth is not None:
            headers["Authorization"] = self.auth
        url = self.base + path  # always http://127.0.0.1:<port>/...
        request = urllib.request.Request(url, data=data, method=method, headers=headers)  # noqa: S310  (a local http URL)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310  (a local http URL)
                return response.status, response.read(), dict(response.headers)
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read(), dict(exc.headers)

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        status, data, _ = self.raw(method, f"/api/v1{path}", body)
        return status, json.loads(data)

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, value = self.call(method, path, body)
        assert 200 <= status < 300, (status, value)
        return value
