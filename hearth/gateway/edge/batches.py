"""The Batch API on the gateway (docs/gateway.md, "Batches"): /v1/files and /v1/batches with the
node's shapes, checks and errors (hearth/http/batches/), state in the gateway's store
(store/batches.py) and lines run by the gateway (batches/runner.py). Every route scopes what it
reads to its caller: another tenant's file or batch is a 404, exactly as a missing one."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator
from typing import IO, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from hearth.errors import NotFound
from hearth.gateway.batches.runner import caller_json
from hearth.gateway.state import gateway_of
from hearth.gateway.store import chunks
from hearth.gateway.store.batches import BatchRow
from hearth.gateway.tenancy import caller
from hearth.http.batches.lines import FileCheck, check_pieces
from hearth.http.batches.requests import (
    MAX_FILE_BYTES,
    check_create,
    check_purpose,
    check_url,
    limit_of,
    list_files_page,
    new_batch,
    new_file_id,
    opened_upload,
    page,
    too_large,
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
    """POST /v1/files: multipart `file` and `purpose` ("batch"); the JSONL is checked line by line.
    Never whole in memory: the framework spools the file part (opened_upload), then it is read
    in chunks twice, once to check every line (in a thread) and once into the store's chunks
    (one transaction: a file is stored whole or not at all)."""
    who = caller(request)
    async with opened_upload(request) as (upload, filename):
        spool = upload.file
        size = spool.seek(0, os.SEEK_END)
        if size > MAX_FILE_BYTES:
            raise too_large()
        spool.seek(0)
        await asyncio.to_thread(check_pieces, _pieces(spool, size))
        spool.seek(0)
        obj = {"id": new_file_id(), "object": "file", "bytes": size, "created_at": int(time.time()),
               "expires_at": None, "filename": filename[:255], "purpose": "batch", "status": "processed",
               "status_details": None}
        obj = await gateway_of(request.app).batches.tables.put_file(obj, who.tenant, _pieces(spool, size))
    return JSONResponse(obj)


def _pieces(f: IO[bytes], most: int) -> Iterator[bytes]:
    """At most `most` bytes of `f` from where it is, a chunk at a time."""
    while most > 0 and (piece := f.read(min(chunks.CHUNK_BYTES, most))):
        most -= len(piece)
        yield piece


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
    """The file's bytes exactly, streamed a chunk at a time from the store."""
    obj = await _file(request, caller(request))
    tables = gateway_of(request.app).batches.tables
    size = await tables.file_size(obj["id"])
    return StreamingResponse(tables.file_chunks(obj["id"]), media_type="application/jsonl",
                             headers={"content-length": str(size)})


# batches


async def create_batch(request: Request) -> JSONResponse:
    """POST /v1/batches: {input_file_id, endpoint, completion_window, metadata}."""
    who, runs = caller(request), gateway_of(request.app).batches
    ask = check_create(await parse_json(await read_limited(request)))
    found = await runs.tables.file(ask.input_file_id)
    if found is None or not who.sees(found[1]):
        raise file_not_found(ask.input_file_id)
    check_purpose(ask, found[0])
    total = await _check_input(runs.tables.file_lines(ask.input_file_id), ask.endpoint)
    obj = new_batch(ask, total, runs.now())
    if not await runs.tables.create(obj, who.tenant, caller_json(who), ask.input_file_id):
        raise file_not_found(ask.input_file_id)  # deleted meanwhile
    runs.launch(obj["id"])
    return JSONResponse(obj)


async def _check_input(lines: AsyncIterator[tuple[int, bytes]], endpoint: str) -> int:
    """Every line of an input file checked again (`FileCheck`, a chunk's lines at a time in a
    thread), each for the batch's endpoint; the number of requests."""
    check = FileCheck()
    batch: list[tuple[int, bytes]] = []
    held = 0

    def run(numbered: list[tuple[int, bytes]]) -> None:
        for n, raw in numbered:
            if (line := check.line(n, raw)) is not None:
                check_url(endpoint, n, line.url)

    async for numbered in lines:
        batch.append(numbered)
        held += len(numbered[1])
        if held >= chunks.CHUNK_BYTES:
            await asyncio.to_thread(run, batch)
            batch, held = [], 0
    await asyncio.to_thread(run, batch)
    return check.end()


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
