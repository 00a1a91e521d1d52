"""Loading and unloading models on request, in llama-server's router shapes:

- `POST /models/load` {"model": NAME, "keep_alive": optional}: load it now (if it is not) and
  keep it for its keep-alive from now → {"success": true, "model": ID, "status": {...}};
- `POST /models/unload` {"model": NAME}: unload it now → {"success": true, "model": ID,
  "unloaded": false when it was not loaded}; 409 while requests use it (model_busy) or when
  it was named with --model (model_pinned).

Both need the admin key when the server has one (they change what every client gets), also
under /v1/. A backend without the capability (a gateway) answers 404 model_loading_unsupported.
"""

from __future__ import annotations

from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hearth.api.context import node
from hearth.api.http.run_options import keep_alive
from hearth.backends.base import require_model_loading
from hearth.http.auth import require_admin
from hearth.http.parsing import OpenBody, read_json, validate


class LoadIn(OpenBody):
    model: str = Field(min_length=1, max_length=1024)
    keep_alive: float | str | None = None


class UnloadIn(OpenBody):
    model: str = Field(min_length=1, max_length=1024)


async def load(request: Request) -> Response:
    ctx = node(request)
    require_admin(request, ctx.settings.admin_key)
    body = validate(LoadIn, await read_json(request))
    loading = require_model_loading(ctx.backend)
    card = await loading.load_model(body.model, keep_alive(body.keep_alive))
    return JSONResponse({"success": True, "model": card.id, "status": card.status})


async def unload(request: Request) -> Response:
    ctx = node(request)
    require_admin(request, ctx.settings.admin_key)
    body = validate(UnloadIn, await read_json(request))
    loading = require_model_loading(ctx.backend)
    model_id = ctx.backend.resolve(body.model)
    unloaded = await loading.unload_model(model_id)
    return JSONResponse({"success": True, "model": model_id, "unloaded": unloaded})
