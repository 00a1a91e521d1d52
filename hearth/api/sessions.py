"""/v1/sessions: create, list, inspect, delete, history, rollback, resize, save (docs/sessions.md)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hearth.api.parsing import read_json, validate
from hearth.api.snapshots import snapshot_json
from hearth.sessions.manager import SessionManager


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateIn(_Strict):
    session_id: str | None = None
    model: str | None = None
    max_seq_len: int | None = Field(default=None, ge=16)


class RollbackIn(_Strict):
    keep_messages: int = Field(ge=0)


class ResizeIn(_Strict):
    max_seq_len: int = Field(ge=16)
    strategy: str = "reject"


class SaveIn(_Strict):
    title: str | None = Field(default=None, max_length=200)
    description: str | None = Field(default=None, max_length=4000)
    tags: list[str] | None = Field(default=None, max_length=32)


def _sessions(request: Request) -> SessionManager:
    return request.app.state.sessions  # type: ignore[no-any-return]


async def _body(request: Request) -> dict[str, Any]:
    """An optional JSON body: empty means {}."""
    return await read_json(request) if await request.body() else {}


async def create_session(request: Request) -> Response:
    body = validate(CreateIn, await _body(request))
    info = _sessions(request).create(body.session_id, body.model, body.max_seq_len)
    return JSONResponse(info, status_code=201)


async def list_sessions(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": _sessions(request).list()})


async def get_session(request: Request) -> Response:
    return JSONResponse(_sessions(request).info(request.path_params["session_id"]))


async def delete_session(request: Request) -> Response:
    sid = request.path_params["session_id"]
    await _sessions(request).delete(sid)
    return JSONResponse({"session_id": sid, "object": "session.deleted", "deleted": True})


async def history(request: Request) -> Response:
    sid = request.path_params["session_id"]
    return JSONResponse({"object": "list", "session_id": sid, "data": _sessions(request).history(sid)})


async def rollback(request: Request) -> Response:
    body = validate(RollbackIn, await read_json(request))
    return JSONResponse(await _sessions(request).rollback(request.path_params["session_id"], body.keep_messages))


async def resize(request: Request) -> Response:
    body = validate(ResizeIn, await read_json(request))
    sid = request.path_params["session_id"]
    return JSONResponse(await _sessions(request).resize(sid, body.max_seq_len, body.strategy))


async def resize_next_pow2(request: Request) -> Response:
    return JSONResponse(await _sessions(request).resize_next_pow2(request.path_params["session_id"]))


async def save(request: Request) -> Response:
    body = validate(SaveIn, await _body(request))
    manifest = await _sessions(request).save(request.path_params["session_id"], body.title, body.description,
                                             body.tags)
    return JSONResponse(snapshot_json(manifest), status_code=201)
