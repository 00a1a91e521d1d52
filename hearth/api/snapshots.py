"""/v1/snapshots: list, inspect, edit metadata, delete, load, archive, import (docs/sessions.md).
Every route acts for its caller: a snapshot of another tenant is not found (hearth.tenants)."""

from __future__ import annotations

import contextlib
import os
import uuid
from typing import Any

from starlette.concurrency import iterate_in_threadpool, run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from hearth.api.context import node
from hearth.errors import BadRequest
from hearth.http.auth import caller, require_admin
from hearth.http.body import stream_limited
from hearth.http.parsing import StrictBody, read_json, read_json_or_empty, validate
from hearth.sessions.ids import check_snapshot_id
from hearth.sessions.manager import SessionManager


class SnapshotMetaIn(StrictBody):
    """What a save sets and a PATCH may change (limits: `hearth.sessions.snapshots.check_meta`)."""

    title: str | None = None
    description: str | None = None
    tags: list[str] | None = None


class LoadIn(StrictBody):
    session_id: str | None = None
    force: bool = False


def snapshot_json(manifest: dict[str, Any]) -> dict[str, Any]:
    files = manifest.get("files") or {}
    return {"object": "snapshot", "snapshot_id": manifest.get("id"), "created_at": manifest.get("created_at"),
            "title": manifest.get("title", ""), "description": manifest.get("description", ""),
            "tags": manifest.get("tags", []), "model": manifest.get("model"), "engine": manifest.get("engine"),
            "session": manifest.get("session"), "format_version": manifest.get("format_version"),
            "bytes": sum(int(f.get("bytes", 0)) for f in files.values() if isinstance(f, dict))}


RESIZE_KEYS = ("old_max_seq_len", "strategy", "mode")  # about the change, not the session


def wrapped(info: dict[str, Any]) -> dict[str, Any]:
    """A session as Hearth returns it, plus superlinear's `{"session": {...}}` wrapper (additive)."""
    session = {k: v for k, v in info.items() if k not in RESIZE_KEYS}
    return {**info, "session": session}


def session_manager(request: Request) -> SessionManager:
    return node(request).sessions


def _id(request: Request) -> str:
    """The path's snapshot id, once checked and found to be one the caller sees (else 404)."""
    snap = check_snapshot_id(request.path_params["snapshot_id"])
    session_manager(request).snapshots.owner(snap, caller(request))
    return snap


async def list_snapshots(request: Request) -> Response:
    data = await run_in_threadpool(session_manager(request).snapshots.list, caller(request))
    snaps = [snapshot_json(m) for m in data]
    return JSONResponse({"object": "list", "data": snaps, "snapshots": snaps})  # "snapshots": superlinear's name


async def get_snapshot(request: Request) -> Response:
    return JSONResponse(snapshot_json(session_manager(request).snapshots.get(_id(request))))


async def patch_snapshot(request: Request) -> Response:
    body = validate(SnapshotMetaIn, await read_json(request))
    manifest = session_manager(request).snapshots.update(_id(request), title=body.title, description=body.description,
                                                   tags=body.tags)
    return JSONResponse(snapshot_json(manifest))


async def delete_snapshot(request: Request) -> Response:
    snap = _id(request)
    await run_in_threadpool(session_manager(request).snapshots.delete, snap)
    return JSONResponse({"snapshot_id": snap, "object": "snapshot.deleted", "deleted": True})


async def load_snapshot(request: Request) -> Response:
    body = validate(LoadIn, await read_json_or_empty(request))
    if body.force:  # replacing an existing session is destructive (docs/api.md, "Admin key")
        require_admin(request, node(request).settings.admin_key)
    info = await session_manager(request).load(_id(request), body.session_id, body.force, caller(request))
    return JSONResponse(wrapped(info), status_code=201)


async def archive(request: Request) -> Response:
    snap = _id(request)
    chunks = session_manager(request).snapshots.archive(snap)
    return StreamingResponse(iterate_in_threadpool(chunks), media_type="application/x-tar",
                             headers={"Content-Disposition": f'attachment; filename="{snap}.tar"'})


async def import_snapshot(request: Request) -> Response:
    """The archive is spooled to a temporary file (never held whole in memory), then unpacked
    and verified; it becomes visible only if every check passes. Its size is bounded by what
    this server's KV could load: refused on Content-Length before reading, and cut off at the
    limit when the length is not given."""
    manager = session_manager(request)
    store = manager.snapshots
    limits = await manager.import_limits()
    spool = store.root / f".import-{uuid.uuid4().hex}"
    size = 0
    try:
        with spool.open("wb") as f:
            async for chunk in stream_limited(request, limits.archive_bytes, "archive"):
                size += len(chunk)
                f.write(chunk)
        if size == 0:
            raise BadRequest("the request body is empty; send the archive from GET /v1/snapshots/{id}/archive")
        manifest = await run_in_threadpool(store.import_archive, spool, limits, caller(request).tenant)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(spool)
    return JSONResponse(snapshot_json(manifest), status_code=201)
