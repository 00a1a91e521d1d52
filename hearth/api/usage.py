"""`GET /admin/usage`: the usage ledger's rows or sums (docs/api.md, "Usage ledger").

Filters: `tenant`, `key` (a key's name), `model`, `request_id` (the answer's id: one request),
`since` and `until` (unix seconds or an ISO
8601 date or time, UTC unless it says otherwise; `until` exclusive), `limit` (rows, newest
first; 1000 by default). `group=day,key,model,tenant` (any of them, comma-separated; empty:
one row of totals) sums instead of listing. The admin (and a node without keys) sees every
tenant; any other key sees its own tenant's rows only, whatever `tenant` it asks for: it is
the one path under /admin/ a tenant key may read (hearth/http/auth.py).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hearth.api.context import node
from hearth.errors import BadRequest, NotFound
from hearth.http.auth import caller
from hearth.observability.ledger import GROUPS, UsageFilter

PATH = "/admin/usage"
MAX_ROWS = 100_000


def parse_time(value: str | None, param: str) -> float | None:
    if value is None or value == "":
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        raise BadRequest(f"{param} must be unix seconds or an ISO 8601 date or time", param=param) from None
    return (t if t.tzinfo is not None else t.replace(tzinfo=UTC)).timestamp()


async def usage(request: Request) -> Response:
    ctx, who = node(request), caller(request)
    if ctx.ledger is None:
        raise NotFound("this node keeps no usage ledger (started with --no-usage-ledger)")
    q = request.query_params
    tenant = q.get("tenant") if who.admin else who.tenant
    f = UsageFilter(tenant=tenant, key=q.get("key"), model=q.get("model"),
                    since=parse_time(q.get("since"), "since"), until=parse_time(q.get("until"), "until"),
                    request_id=q.get("request_id"))
    limit_text = q.get("limit", "1000")
    if not limit_text.isdigit() or not 1 <= int(limit_text) <= MAX_ROWS:
        raise BadRequest(f"limit must be a whole number from 1 to {MAX_ROWS}", param="limit")
    ledger = ctx.ledger
    if "group" in q:
        group = [g.strip() for g in q["group"].split(",") if g.strip()]
        bad = [g for g in group if g not in GROUPS]
        if bad or len(set(group)) != len(group):
            raise BadRequest(f"group must be some of {', '.join(GROUPS)}, each once", param="group")
        data = await asyncio.to_thread(lambda: (ledger.flush(1.0), ledger.totals(f, group))[1])
        return JSONResponse({"object": "list", "group": group, "data": data})
    limit = int(limit_text)
    data = await asyncio.to_thread(lambda: (ledger.flush(1.0), ledger.rows(f, limit))[1])
    return JSONResponse({"object": "list", "data": data})


async def journal_record(request: Request) -> Response:
    """`GET /admin/journal/{request_id}`: a journaled request's body and answer (docs/api.md,
    "Usage ledger"; `hearth replay`). The caller's tenant's own, or any for the admin; another
    tenant's record is the same 404 as a missing one."""
    ctx, who = node(request), caller(request)
    if ctx.journal is None:
        raise NotFound("this node keeps no journal (start it with --journal)")
    journal = ctx.journal
    rid = request.path_params["request_id"]
    entry = await asyncio.to_thread(lambda: (journal.flush(1.0), journal.get(rid))[1])
    if entry is None or not who.sees(entry["owner"]):
        raise NotFound(f"no journal record {rid!r}")
    return JSONResponse({k: v for k, v in entry.items() if k != "owner"})
