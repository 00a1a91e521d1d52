"""The routes of the Batch API (docs/api.md, "Batches"): /v1/files and /v1/batches, OpenAI's
shapes and errors. Every route scopes what it reads to its caller (hearth.tenants): another
tenant's file or batch is a 404, exactly as a missing one."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse

from hearth.api.batches.lines import ENDPOINTS, line_number, parse_file
from hearth.api.batches.store import new_batch_id
from hearth.api.context import node
from hearth.errors import BadRequest, PayloadTooLarge
from hearth.http.auth import caller
from hearth.http.body import check_length, declared_length, parse_json, read_limited

MAX_FILE_BYTES = 200 * 1024 * 1024  # OpenAI's limit for a batch input file
FORM_OVERHEAD = 64 * 1024  # the multipart envelope around the file
COMPLETION_WINDOWS = {"24h": 24 * 3600}
MAX_METADATA = 16  # OpenAI's metadata limits: pairs, key and value lengths
MAX_METADATA_KEY, MAX_METADATA_VALUE = 64, 512
MAX_LIST = 100  # batches per page
MAX_FILES_LIST = 10_000  # files per page (OpenAI's default and most)


def _limit(request: Request, default: int = 20, most: int = MAX_LIST) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return default
    try:
        n = int(raw)
    except ValueError as e:
        raise BadRequest("limit must be an integer", param="limit") from e
    if not 1 <= n <= most:
        raise BadRequest(f"limit must be between 1 and {most}", param="limit")
    return n


def _page(items: list[dict[str, Any]], after: str | None, limit: int) -> dict[str, Any]:
    """OpenAI's cursor list: the items after the one whose id is `after` (an id not in the
    list starts from the top)."""
    if after is not None:
        ids = [x["id"] for x in items]
        if after in ids:
            items = items[ids.index(after) + 1:]
    page = items[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}


# files


async def upload_file(request: Request) -> JSONResponse:
    """POST /v1/files: multipart `file` and `purpose` ("batch"); the JSONL is checked line by line."""
    ctx, who = node(request), caller(request)
    check_length(request, MAX_FILE_BYTES + FORM_OVERHEAD, "upload")
    if declared_length(request) is None:  # the multipart parser spools a file part to disk, unbounded
        raise BadRequest("POST /v1/files needs a Content-Length (a chunked upload is not accepted)")
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise BadRequest("upload the file as multipart/form-data with fields `file` and `purpose`")
    try:
        form = await request.form(max_files=1, max_fields=8)
    except Exception as e:  # a malformed multipart body (starlette raises its own kinds)
        raise BadRequest(f"the multipart body cannot be read: {e}") from e
    try:
        purpose = form.get("purpose")
        if purpose != "batch":
            raise BadRequest("purpose must be \"batch\" (the only purpose this server stores files for)",
                             param="purpose")
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise BadRequest("the form needs a `file` part (the JSONL)", param="file")
        content = await upload.read(MAX_FILE_BYTES + 1)
        filename = upload.filename or "upload.jsonl"
    finally:
        await form.close()
    if len(content) > MAX_FILE_BYTES:
        raise PayloadTooLarge(f"the file is larger than the limit of {MAX_FILE_BYTES} bytes", param="file")
    await asyncio.to_thread(parse_file, content)  # every line, or the first error with its line number
    obj = await asyncio.to_thread(ctx.batches.files.create, content, filename, "batch", who.tenant)
    return JSONResponse(obj)


async def list_files(request: Request) -> JSONResponse:
    ctx, who = node(request), caller(request)
    files = await asyncio.to_thread(ctx.batches.files.list, who)
    purpose = request.query_params.get("purpose")
    if purpose:
        files = [f for f in files if f["purpose"] == purpose]
    if request.query_params.get("order", "desc") == "asc":
        files.reverse()
    limit = _limit(request, MAX_FILES_LIST, MAX_FILES_LIST)
    return JSONResponse(_page(files, request.query_params.get("after"), limit))


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
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    unknown = sorted(set(body) - {"input_file_id", "endpoint", "completion_window", "metadata"})
    if unknown:
        raise BadRequest(f"Unrecognized request argument supplied: {unknown[0]}", param=unknown[0])
    fid, endpoint, window = body.get("input_file_id"), body.get("endpoint"), body.get("completion_window")
    if not isinstance(fid, str):
        raise BadRequest("input_file_id is required (the id of an uploaded file, purpose \"batch\")",
                         param="input_file_id")
    if endpoint not in ENDPOINTS:
        raise BadRequest(f"endpoint must be one of {', '.join(ENDPOINTS)}", param="endpoint")
    if window not in COMPLETION_WINDOWS:
        raise BadRequest(f"completion_window must be one of {', '.join(COMPLETION_WINDOWS)}",
                         param="completion_window")
    metadata = body.get("metadata")
    if metadata is not None and not (
            isinstance(metadata, dict) and len(metadata) <= MAX_METADATA
            and all(isinstance(k, str) and len(k) <= MAX_METADATA_KEY and isinstance(v, str)
                    and len(v) <= MAX_METADATA_VALUE for k, v in metadata.items())):
        raise BadRequest(f"metadata must be at most {MAX_METADATA} string pairs (keys up to {MAX_METADATA_KEY}, "
                         f"values up to {MAX_METADATA_VALUE} characters)", param="metadata")
    batches = ctx.batches
    info = batches.files.get(fid, who)
    if info["purpose"] != "batch":
        raise BadRequest(f"file {fid} has purpose {info['purpose']!r}; a batch reads a file of purpose \"batch\"",
                         param="input_file_id")
    content = await asyncio.to_thread(batches.files.read, fid, who)
    lines = await asyncio.to_thread(parse_file, content)
    for ln in lines:
        if ln.url != endpoint:
            n = line_number(content, ln.index)
            raise BadRequest(f"line {n}: url {ln.url} does not match the batch's endpoint {endpoint}",
                             param="endpoint", code="invalid_batch_line")
    now = batches.now()
    obj: dict[str, Any] = {
        "id": new_batch_id(), "object": "batch", "endpoint": endpoint, "errors": None, "input_file_id": fid,
        "completion_window": window, "status": "validating", "output_file_id": None, "error_file_id": None,
        "created_at": now, "in_progress_at": None, "expires_at": now + COMPLETION_WINDOWS[str(window)],
        "finalizing_at": None, "completed_at": None, "failed_at": None, "expired_at": None,
        "cancelling_at": None, "cancelled_at": None,
        "request_counts": {"total": len(lines), "completed": 0, "failed": 0}, "metadata": metadata,
    }
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
    return JSONResponse(_page(items, request.query_params.get("after"), _limit(request)))


async def cancel_batch(request: Request) -> JSONResponse:
    ctx = node(request)
    b = ctx.batches.store.get(request.path_params["batch_id"], caller(request))
    ctx.batches.cancel(b)
    return JSONResponse(b.public())
