"""The prompt cache, seen and managed (docs/api.md, "Prompt cache"):

- `GET /admin/prompt-cache`: counters and sizes per model and tier;
- `GET /admin/prompt-cache/entries?model=&limit=`: one model's blocks;
- `DELETE /admin/prompt-cache?model=`: drop one model's blocks (every model's without `model`);
- `GET /v1/prompt-cache/digest`: what this node holds, as block hashes (slot, RAM, disk),
  conversation keys and session ids, for a router. It needs only an API key: a gateway
  reaches its nodes with their API key (and so does `POST /v1/prompt-cache/blocks`,
  prompt_blocks.py).

Everything under /admin needs the admin key when one is set (hearth/http/auth.py). A backend
without the capability answers 404 `prompt_cache_unsupported`.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hearth.api.context import node
from hearth.backends.base import require_prompt_cache
from hearth.errors import BadRequest
from hearth.fleet_protocol import DIGEST_VERSION, DigestAnswer
from hearth.http.auth import caller

DEFAULT_LIMIT = 1000
MAX_LIMIT = 100_000


def _model(request: Request) -> str | None:
    model = request.query_params.get("model")
    return model or None


def _limit(request: Request) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return DEFAULT_LIMIT
    try:
        limit = int(raw)
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_LIMIT:
        raise BadRequest(f"limit must be an integer from 1 to {MAX_LIMIT}", param="limit")
    return limit


async def stats(request: Request) -> Response:
    cache = require_prompt_cache(node(request).backend)
    models = {mid: asdict(st) for mid, st in cache.cache_stats().items()}
    return JSONResponse({"object": "prompt_cache.stats", "models": models})


async def entries(request: Request) -> Response:
    """The blocks in chain order (by position, then hash), the first `limit` of them."""
    backend = node(request).backend
    cache = require_prompt_cache(backend)
    model = backend.resolve(_model(request))
    limit = _limit(request)
    found = await cache.cache_entries(model)
    data: list[dict[str, Any]] = [asdict(e) for e in found[:limit]]
    return JSONResponse({"object": "list", "model": model, "data": data, "total": len(found),
                         "has_more": len(found) > limit})


async def clear(request: Request) -> Response:
    backend = node(request).backend
    cache = require_prompt_cache(backend)
    requested = _model(request)
    model = backend.resolve(requested) if requested is not None else None
    dropped = await cache.clear_cache(model)
    return JSONResponse({"object": "prompt_cache.cleared", "model": model, "dropped": dropped})


async def digest(request: Request) -> Response:
    """The caller's prompt-cache namespace only (its blocks, its slots' conversation keys, and
    of the sessions, those it sees): a digest never shows another tenant's state."""
    ctx = node(request)
    cache = require_prompt_cache(ctx.backend)
    who = caller(request)
    models = await cache.cache_digest(who.namespace())
    if not who.admin:
        mine = ctx.sessions.visible_ids(who)
        for m in models.values():
            sessions = m.get("sessions") or {}
            # under the names the caller gives them (a tenant's ids are its namespace, hearth.tenants)
            m["sessions"] = {where: [who.shown(s) for s in ids if s in mine] for where, ids in sessions.items()}
    answer: DigestAnswer = {"object": "prompt_cache.digest", "version": DIGEST_VERSION, "models": models}
    return JSONResponse(answer)
