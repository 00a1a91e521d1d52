"""/v1/sessions: create, list, inspect, delete, history, rollback, resize, save (docs/sessions.md).
Every route acts for its caller: a session of another tenant is not found (hearth.tenants)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hearth.api.snapshots import SnapshotMetaIn, session_manager, snapshot_json, wrapped
from hearth.errors import BadRequest
from hearth.fleet_protocol import HistoryAnswer
from hearth.http.auth import caller
from hearth.http.parsing import StrictBody, read_json, read_json_or_empty, validate
from hearth.sessions.transcript import message_from_json


# Types only: the ranges are checked once, by the session manager, with messages that say why.
class CreateIn(StrictBody):
    session_id: str | None = None
    model: str | None = None
    max_seq_len: int | None = None
    # A transcript to start from (history-shaped messages, no KV: the next turn prefills it).
    # The gateway uses it to continue a session whose node died.
    messages: list[dict[str, Any]] | None = None


class RollbackIn(StrictBody):
    keep_messages: int


class ResizeIn(StrictBody):
    max_seq_len: int
    strategy: str = "reject"


async def create_session(request: Request) -> Response:
    body = validate(CreateIn, await read_json_or_empty(request))
    try:
        messages = [message_from_json(m) for m in body.messages or []]
    except ValueError as e:
        raise BadRequest(f"messages: {e}", param="messages") from e
    info = await session_manager(request).create(body.session_id, body.model, body.max_seq_len, messages,
                                                 caller(request))
    return JSONResponse(info, status_code=201)


async def list_sessions(request: Request) -> Response:
    data = await session_manager(request).list_all(caller(request))
    return JSONResponse({"object": "list", "data": data, "sessions": data})  # "sessions": superlinear's name


async def get_session(request: Request) -> Response:
    return JSONResponse(await session_manager(request).info(request.path_params["session_id"], caller(request)))


async def delete_session(request: Request) -> Response:
    sid = request.path_params["session_id"]
    await session_manager(request).delete(sid, caller(request))
    return JSONResponse({"session_id": sid, "object": "session.deleted", "deleted": True})


async def history(request: Request) -> Response:
    sid = request.path_params["session_id"]
    data = session_manager(request).history(sid, caller(request))
    answer = HistoryAnswer(object="list", session_id=sid, data=data, messages=data)
    return JSONResponse(answer)


async def rollback(request: Request) -> Response:
    body = validate(RollbackIn, await read_json(request))
    return JSONResponse(wrapped(await session_manager(request).rollback(request.path_params["session_id"],
                                                                        body.keep_messages, caller(request))))


async def resize(request: Request) -> Response:
    body = validate(ResizeIn, await read_json(request))
    sid = request.path_params["session_id"]
    return JSONResponse(wrapped(await session_manager(request).resize(sid, body.max_seq_len, body.strategy,
                                                                      caller(request))))


async def resize_next_pow2(request: Request) -> Response:
    manager = session_manager(request)
    return JSONResponse(wrapped(await manager.resize_next_pow2(request.path_params["session_id"], caller(request))))


async def save(request: Request) -> Response:
    body = validate(SnapshotMetaIn, await read_json_or_empty(request))
    manifest = await session_manager(request).save(request.path_params["session_id"], body.title, body.description,
                                                   body.tags, caller(request))
    return JSONResponse(snapshot_json(manifest), status_code=201)
