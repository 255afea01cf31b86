"""The web console: one page over the admin API, served by the admin endpoint itself.

The page is static (admin/console/: index.html, app.js, style.css; no build step, nothing
fetched from elsewhere). Its script polls the JSON API under /api/v1 and draws what it returns,
so the console shows nothing the API does not give an operator, and it is under the API's rule:
with authentication on (imq.authentication.enabled) only an administrator can load it, with
HTTP Basic credentials the browser asks for and keeps.

The three files are read once, when the endpoint is set up, and served from memory: no disk
read on the broker's event loop, and no part of a request's path ever reaches the file system.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from typing import Final

from aiohttp import web

from sluiceway.errors import NotFound

PREFIX: Final = "/console"
PAGE: Final = "index.html"
_CONTENT_TYPES: Final = {
    "index.html": "text/html",
    "app.js": "text/javascript",
    "style.css": "text/css",
}
# The page loads only its own script and style and talks only to its own origin. Nothing it
# shows is ever parsed as HTML, and this stops an injected script if that ever slipped; it may
# not be framed either, so another site cannot lay it under a decoy and have Purge clicked.
_SECURITY_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    # Revalidate every time (the ETag makes that a 304): after an upgrade of the broker the
    # browser must not keep running the old script against the new API.
    "Cache-Control": "no-cache",
}


@dataclass(frozen=True, slots=True)
class _File:
    body: bytes
    content_type: str
    etag: str


def load_files() -> dict[str, _File]:
    """The console's files from the package data, by name."""
    folder = resources.files("sluiceway.admin").joinpath("console")
    files = {}
    for name, content_type in _CONTENT_TYPES.items():
        body = folder.joinpath(name).read_bytes()
        files[name] = _File(body, content_type, hashlib.sha256(body).hexdigest()[:32])
    return files


def register(app: web.Application) -> None:
    """Add the console's routes: `/` (the page) and `/console/{file}` (its script and style)."""
    files = load_files()

    async def page(request: web.Request) -> web.Response:
        return _serve(request, files[PAGE])

    async def static(request: web.Request) -> web.Response:
        found = files.get(request.match_info["name"])
        if found is None:
            raise NotFound(
                "no such console file",
                f"the console has no file {request.match_info['name']!r}; open / for the page",
            )
        return _serve(request, found)

    router = app.router
    router.add_get("/", page)
    router.add_get(f"{PREFIX}/{{name}}", static)


def _serve(request: web.Request, found: _File) -> web.Response:
    wanted = request.if_none_match
    if wanted is not None and any(tag.value in (found.etag, "*") for tag in wanted):
        response = web.Response(status=304, headers=_SECURITY_HEADERS)
    else:
        response = web.Response(
            body=found.body,
            content_type=found.content_type,
            charset="utf-8",
            headers=_SECURITY_HEADERS,
        )
    response.etag = found.etag
    return response
