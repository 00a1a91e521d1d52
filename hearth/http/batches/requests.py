"""The Batch API's requests as both the node and the gateway check them (OpenAI's shapes and
messages): an upload's form, a batch's creation body and the batch object it starts as, list
limits and cursor pages, and the ids of a batch's output files."""

from __future__ import annotations

import contextlib
import hashlib
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import UploadFile
from starlette.requests import Request

from hearth.errors import BadRequest, PayloadTooLarge
from hearth.http.batches.lines import ENDPOINTS, Line, line_number
from hearth.http.body import check_length, declared_length

MAX_FILE_BYTES = 200 * 1024 * 1024  # OpenAI's limit for a batch input file
FORM_OVERHEAD = 64 * 1024  # the multipart envelope around the file
COMPLETION_WINDOWS = {"24h": 24 * 3600}
MAX_METADATA = 16  # OpenAI's metadata limits: pairs, key and value lengths
MAX_METADATA_KEY, MAX_METADATA_VALUE = 64, 512
MAX_LIST = 100  # batches per page
MAX_FILES_LIST = 10_000  # files per page (OpenAI's default and most)
EXPIRED = {"code": "batch_expired",
           "message": "This request could not be executed before the completion window expired."}
SERVICE_TIER = "flex"  # every batch line runs in the lowest class


def new_file_id() -> str:
    return "file-" + secrets.token_hex(16)


def new_batch_id() -> str:
    return "batch_" + secrets.token_hex(16)


def derived_file_id(batch_id: str, kind: str) -> str:
    """The id of a batch's output (`kind` "output") or error file: derived from the batch's, so
    finalizing twice (after a crash) writes the same file, never a second one."""
    return "file-" + hashlib.sha256(f"{batch_id}/{kind}".encode()).hexdigest()[:32]


def limit_of(request: Request, default: int = 20, most: int = MAX_LIST) -> int:
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


def page(items: list[dict[str, Any]], after: str | None, limit: int) -> dict[str, Any]:
    """OpenAI's cursor list: the items after the one whose id is `after` (an id not in the
    list starts from the top)."""
    if after is not None:
        ids = [x["id"] for x in items]
        if after in ids:
            items = items[ids.index(after) + 1:]
    chosen = items[:limit]
    return {"object": "list", "data": chosen, "first_id": chosen[0]["id"] if chosen else None,
            "last_id": chosen[-1]["id"] if chosen else None, "has_more": len(items) > limit}


def list_files_page(request: Request, files: list[dict[str, Any]]) -> dict[str, Any]:
    """GET /v1/files over `files` (newest first): `purpose`, `order`, `limit`, `after`."""
    purpose = request.query_params.get("purpose")
    if purpose:
        files = [f for f in files if f["purpose"] == purpose]
    if request.query_params.get("order", "desc") == "asc":
        files = list(reversed(files))
    limit = limit_of(request, MAX_FILES_LIST, MAX_FILES_LIST)
    return page(files, request.query_params.get("after"), limit)


@contextlib.asynccontextmanager
async def opened_upload(request: Request) -> AsyncIterator[tuple[UploadFile, str]]:
    """POST /v1/files: multipart `file` and `purpose` ("batch"), checked; the file part and its
    filename, until the block ends (the lines are not checked here: `lines.parse_file`). The
    multipart parser (starlette's) reads the whole body first and spools the file part to a
    temporary file (in memory up to 1 MiB, on disk beyond), so the part is bounded by the
    Content-Length check, in memory by the spool; its size is the reader's to check (`MAX_FILE_BYTES`)."""
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
        yield upload, upload.filename or "upload.jsonl"
    finally:
        await form.close()


def too_large() -> PayloadTooLarge:
    return PayloadTooLarge(f"the file is larger than the limit of {MAX_FILE_BYTES} bytes", param="file")


async def read_upload(request: Request) -> tuple[bytes, str]:
    """POST /v1/files (`opened_upload`): the content, whole, and its filename."""
    async with opened_upload(request) as (upload, filename):
        content = await upload.read(MAX_FILE_BYTES + 1)
    if len(content) > MAX_FILE_BYTES:
        raise too_large()
    return content, filename


@dataclass(frozen=True, slots=True)
class BatchAsk:
    """A checked POST /v1/batches body."""

    input_file_id: str
    endpoint: str
    window: str
    metadata: dict[str, str] | None


def check_create(body: Any) -> BatchAsk:
    """POST /v1/batches: {input_file_id, endpoint, completion_window, metadata}, field by field."""
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
    return BatchAsk(fid, str(endpoint), str(window), metadata)


def check_purpose(ask: BatchAsk, info: dict[str, Any]) -> None:
    """The input file (its object `info`) is one a batch reads."""
    if info["purpose"] != "batch":
        raise BadRequest(f"file {ask.input_file_id} has purpose {info['purpose']!r}; a batch reads a file of "
                         "purpose \"batch\"", param="input_file_id")


def check_url(endpoint: str, n: int, url: str) -> None:
    """Line `n` (1-based) of a batch's input is for the batch's endpoint."""
    if url != endpoint:
        raise BadRequest(f"line {n}: url {url} does not match the batch's endpoint {endpoint}",
                         param="endpoint", code="invalid_batch_line")


def check_urls(ask: BatchAsk, content: bytes, lines: list[Line]) -> None:
    """Every line of the input (`content`, parsed as `lines`) is for the batch's endpoint."""
    for ln in lines:
        if ln.url != ask.endpoint:
            check_url(ask.endpoint, line_number(content, ln.index), ln.url)


def new_batch(ask: BatchAsk, total: int, now: int) -> dict[str, Any]:
    """The object of a batch just created (status `validating`, OpenAI's fields)."""
    return {
        "id": new_batch_id(), "object": "batch", "endpoint": ask.endpoint, "errors": None,
        "input_file_id": ask.input_file_id, "completion_window": ask.window, "status": "validating",
        "output_file_id": None, "error_file_id": None, "created_at": now, "in_progress_at": None,
        "expires_at": now + COMPLETION_WINDOWS[ask.window], "finalizing_at": None, "completed_at": None,
        "failed_at": None, "expired_at": None, "cancelling_at": None, "cancelled_at": None,
        "request_counts": {"total": total, "completed": 0, "failed": 0}, "metadata": ask.metadata,
    }


def line_out(line: Line, response: dict[str, Any] | None, error: dict[str, Any] | None) -> dict[str, Any]:
    """One line of a batch's output or error file (OpenAI's format)."""
    return {"id": "batch_req_" + secrets.token_hex(16), "custom_id": line.custom_id,
            "response": response, "error": error}
