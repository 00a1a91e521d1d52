"""The Batch API on the gateway (docs/gateway.md, "Batches"): /v1/files and /v1/batches with the
node's shapes, checks and errors (hearth/http/batches/), state in the gateway's store
(store/batches.py) and lines run by the gateway (batches/runner.py). Every route scopes what it
reads to its caller: another tenant's file or batch is a 404, exactly as a missing one."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hearth.errors import NotFound
from hearth.gateway.batches.runner import caller_json, input_jsonl
from hearth.gateway.state import gateway_of
from hearth.gateway.store.batches import BatchRow
from hearth.gateway.tenancy import caller
from hearth.http.batches.lines import parse_file
from hearth.http.batches.requests import (
    check_create,
    check_purpose,
    check_urls,
    limit_of,
    list_files_page,
    new_batch,
    new_file_id,
    page,
    read_upload,
)
from hearth.http.body import parse_json, read_limited
from hearth.tenants import Caller


def file_not_found(file_id: str) -> NotFound:
    return NotFound(f"No such File object: {file_id}", param="file_id", code="not_found")


def batch_not_found(batch_id: str) -> NotFound:
    return NotFound(f"No such Batch object: {batch_id}", param="batch_id", code="not_found")


async def _file(request: Request, who: Caller) -> dict[str, Any]:
    fid = request.path_params["file_id"]
    found = await gateway_of(request.app).batches.tables.file(fid)
    if found is None or not who.sees(found[1]):
        raise file_not_found(fid)
    return found[0]


async def _batch(request: Request, who: Caller) -> BatchRow:
    bid = request.path_params["batch_id"]
    row = await gateway_of(request.app).batches.tables.batch(bid)
    if row is None or not who.sees(row.owner):
        raise batch_not_found(bid)
    return row


# files


async def upload_file(request: Request) -> JSONResponse:
    """POST /v1/files: multipart `file` and `purpose` ("batch"); the JSONL is checked line by line."""
    who = caller(request)
    content, filename = await read_upload(request)
    await asyncio.to_thread(parse_file, content)  # every line, or the first error with its line number
    obj = {"id": new_file_id(), "object": "file", "bytes": len(content), "created_at": int(time.time()),
           "expires_at": None, "filename": filename[:255], "purpose": "batch", "status": "processed",
           "status_details": None}
    await gateway_of(request.app).batches.tables.put_file(obj, who.tenant, content)
    return JSONResponse(obj)


async def list_files(request: Request) -> JSONResponse:
    who = caller(request)
    files = await gateway_of(request.app).batches.tables.files(who.scope)
    return JSONResponse(list_files_page(request, files))


async def get_file(request: Request) -> JSONResponse:
    return JSONResponse(await _file(request, caller(request)))


async def delete_file(request: Request) -> JSONResponse:
    obj = await _file(request, caller(request))
    await gateway_of(request.app).batches.tables.delete_file(obj["id"])
    return JSONResponse({"id": obj["id"], "object": "file", "deleted": True})


async def file_content(request: Request) -> Response:
    obj = await _file(request, caller(request))
    content = await gateway_of(request.app).batches.tables.file_content(obj["id"])
    if content is None:
        raise file_not_found(obj["id"])
    return Response(content, media_type="application/jsonl")


# batches


async def create_batch(request: Request) -> JSONResponse:
    """POST /v1/batches: {input_file_id, endpoint, completion_window, metadata}."""
    who, runs = caller(request), gateway_of(request.app).batches
    ask = check_create(await parse_json(await read_limited(request)))
    found = await runs.tables.file(ask.input_file_id)
    if found is None or not who.sees(found[1]):
        raise file_not_found(ask.input_file_id)
    check_purpose(ask, found[0])
    content = await runs.tables.file_content(ask.input_file_id) or b""
    lines = await asyncio.to_thread(parse_file, content)
    check_urls(ask, content, lines)
    obj = new_batch(ask, len(lines), runs.now())
    await runs.tables.create(obj, who.tenant, caller_json(who), input_jsonl(lines))
    runs.launch(obj["id"])
    return JSONResponse(obj)


async def get_batch(request: Request) -> JSONResponse:
    runs = gateway_of(request.app).batches
    return JSONResponse(await runs.public(await _batch(request, caller(request))))


async def list_batches(request: Request) -> JSONResponse:
    runs = gateway_of(request.app).batches
    items = [await runs.public(row) for row in await runs.tables.batches(caller(request).scope)]
    return JSONResponse(page(items, request.query_params.get("after"), limit_of(request)))


async def cancel_batch(request: Request) -> JSONResponse:
    runs = gateway_of(request.app).batches
    return JSONResponse(await runs.cancel(await _batch(request, caller(request))))


ROUTES = [
    Route("/v1/files", upload_file, methods=["POST"]),
    Route("/v1/files", list_files, methods=["GET"]),
    Route("/v1/files/{file_id}", get_file, methods=["GET"]),
    Route("/v1/files/{file_id}", delete_file, methods=["DELETE"]),
    Route("/v1/files/{file_id}/content", file_content, methods=["GET"]),
    Route("/v1/batches", create_batch, methods=["POST"]),
    Route("/v1/batches", list_batches, methods=["GET"]),
    Route("/v1/batches/{batch_id}", get_batch, methods=["GET"]),
    Route("/v1/batches/{batch_id}/cancel", cancel_batch, methods=["POST"]),
]
