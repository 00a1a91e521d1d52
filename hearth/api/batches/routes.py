"""The routes of the Batch API (docs/api.md, "Batches"): /v1/files and /v1/batches, OpenAI's
shapes and errors. Every route scopes what it reads to its caller (hearth.tenants): another
tenant's file or batch is a 404, exactly as a missing one."""

from __future__ import annotations

import asyncio
import time

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse

from hearth.api.context import node
from hearth.http.auth import caller
from hearth.http.batches.lines import parse_file
from hearth.http.batches.requests import (
    check_create,
    check_purpose,
    check_urls,
    limit_of,
    list_files_page,
    new_batch,
    page,
    read_upload,
)
from hearth.http.body import parse_json, read_limited

# files


async def upload_file(request: Request) -> JSONResponse:
    """POST /v1/files: multipart `file` and `purpose` ("batch"); the JSONL is checked line by line."""
    ctx, who = node(request), caller(request)
    content, filename = await read_upload(request)
    await asyncio.to_thread(parse_file, content)  # every line, or the first error with its line number
    obj = await asyncio.to_thread(ctx.batches.files.create, content, filename, "batch", who.tenant)
    return JSONResponse(obj)


async def list_files(request: Request) -> JSONResponse:
    ctx, who = node(request), caller(request)
    files = await asyncio.to_thread(ctx.batches.files.list, who)
    return JSONResponse(list_files_page(request, files))


async def get_file(request: Request) -> JSONResponse:
    ctx = node(request)
    return JSONResponse(ctx.batches.files.get(request.path_params["file_id"], caller(request)))


async def delete_file(request: Request) -> JSONResponse:
    ctx, fid = node(request), request.path_params["file_id"]
    await asyncio.to_thread(ctx.batches.files.delete, fid, caller(request))
    return JSONResponse({"id": fid, "object": "file", "deleted": True})


async def file_content(request: Request) -> FileResponse:
    ctx = node(request)
    path = ctx.batches.files.content_path(request.path_params["file_id"], caller(request))
    return FileResponse(path, media_type="application/jsonl")


# batches


async def create_batch(request: Request) -> JSONResponse:
    """POST /v1/batches: {input_file_id, endpoint, completion_window, metadata}."""
    ctx, who = node(request), caller(request)
    body = await parse_json(await read_limited(request))
    ask = check_create(body)
    batches = ctx.batches
    check_purpose(ask, batches.files.get(ask.input_file_id, who))
    content = await asyncio.to_thread(batches.files.read, ask.input_file_id, who)
    lines = await asyncio.to_thread(parse_file, content)
    check_urls(ask, content, lines)
    obj = new_batch(ask, len(lines), batches.now())
    b = await asyncio.to_thread(batches.store.create, obj, lines, who.tenant, who, time.time_ns())
    out = b.public()
    batches.launch(b)
    return JSONResponse(out)


async def get_batch(request: Request) -> JSONResponse:
    ctx = node(request)
    return JSONResponse(ctx.batches.store.get(request.path_params["batch_id"], caller(request)).public())


async def list_batches(request: Request) -> JSONResponse:
    ctx = node(request)
    items = [b.public() for b in ctx.batches.store.list(caller(request))]
    return JSONResponse(page(items, request.query_params.get("after"), limit_of(request)))


async def cancel_batch(request: Request) -> JSONResponse:
    ctx = node(request)
    b = ctx.batches.store.get(request.path_params["batch_id"], caller(request))
    ctx.batches.cancel(b)
    return JSONResponse(b.public())
