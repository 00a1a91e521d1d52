"""The built-in chat page: `GET /` and a fixed allow-list of static files under `/web/`.

The files ship inside the package (`hearth/web/`) and are read once, at first use. Only names in
`FILES` are served, so no request path ever reaches the filesystem. The page holds no data: every
API call it makes carries the key typed into it, so these routes need none (see auth.py).
"""

from __future__ import annotations

import functools
import hashlib
from importlib import resources

from starlette.requests import Request
from starlette.responses import Response

from hearth.errors import NotFound

_JS, _CSS = "text/javascript; charset=utf-8", "text/css; charset=utf-8"
FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": _JS,
    "render.js": _JS,
    "messages.js": _JS,
    "edits.js": _JS,
    "style.css": _CSS,
    # Browser libraries the page renders markdown with (hearth/web/vendor/VERSIONS.md).
    "vendor/marked.umd.js": _JS,
    "vendor/purify.min.js": _JS,
    "vendor/highlight.min.js": _JS,
    "vendor/hljs-github.min.css": _CSS,
    "vendor/hljs-github-dark.min.css": _CSS,
}
# The page may talk only to this origin and load nothing from elsewhere.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; base-uri 'none'; frame-ancestors 'none'; form-action 'none'")


@functools.cache
def _asset(name: str) -> tuple[bytes, str]:
    data = resources.files("hearth.web").joinpath(*name.split("/")).read_bytes()
    return data, '"' + hashlib.sha256(data).hexdigest()[:16] + '"'


def _serve(request: Request, name: str) -> Response:
    if name not in FILES:
        raise NotFound(f"no such file: /web/{name}", code="not_found")
    data, etag = _asset(name)
    headers = {"etag": etag, "cache-control": "no-cache", "x-content-type-options": "nosniff",
               "content-security-policy": CSP, "referrer-policy": "no-referrer"}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    return Response(data, media_type=FILES[name], headers=headers)


async def index(request: Request) -> Response:
    return _serve(request, "index.html")


async def static_file(request: Request) -> Response:
    return _serve(request, request.path_params["name"])
