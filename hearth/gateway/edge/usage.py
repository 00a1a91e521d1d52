"""`GET /admin/usage` on the gateway: its usage ledger's rows or sums (store/usage.py), with the
node's filters and grouping (hearth/api/usage.py): `tenant`, `key`, `model`, `request_id`, `since`, `until`,
`limit`, `group=day,key,model,tenant,node`. The admin sees every tenant; any other key its own
tenant's rows only, whatever `tenant` it asks for (the one /admin/ path a tenant key may read,
hearth/http/auth.py)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hearth.api.usage import MAX_ROWS, parse_time
from hearth.errors import BadRequest, NotFound
from hearth.gateway.state import gateway_of
from hearth.gateway.store.usage import GROUPS
from hearth.http.auth import caller
from hearth.observability.ledger import UsageFilter


async def usage(request: Request) -> Response:
    ledger, who = gateway_of(request.app).proxy.ledger, caller(request)
    if ledger is None:
        raise NotFound("this gateway keeps no usage ledger (started with --no-usage-ledger)")
    q = request.query_params
    f = UsageFilter(tenant=q.get("tenant") if who.admin else who.tenant, key=q.get("key"), model=q.get("model"),
                   since=parse_time(q.get("since"), "since"), until=parse_time(q.get("until"), "until"),
                   request_id=q.get("request_id"))
    limit_text = q.get("limit", "1000")
    if not limit_text.isdigit() or not 1 <= int(limit_text) <= MAX_ROWS:
        raise BadRequest(f"limit must be a whole number from 1 to {MAX_ROWS}", param="limit")
    await ledger.flush(1.0)  # what this gateway recorded so far is in the answer
    if "group" in q:
        group = [g.strip() for g in q["group"].split(",") if g.strip()]
        bad = [g for g in group if g not in GROUPS]
        if bad or len(set(group)) != len(group):
            raise BadRequest(f"group must be some of {', '.join(GROUPS)}, each once", param="group")
        return JSONResponse({"object": "list", "group": group, "data": await ledger.totals(f, group)})
    return JSONResponse({"object": "list", "data": await ledger.rows(f, int(limit_text))})
