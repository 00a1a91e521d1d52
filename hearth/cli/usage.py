"""`hearth usage`: a running server's usage ledger (docs/api.md, "Usage ledger"): sums by day,
key, model or tenant, or the latest rows. A tenant's key sees its own tenant's usage only."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from hearth.cli.cache import AdminKeyOpt
from hearth.cli.client import Client
from hearth.cli.common import JsonOpt, UrlOpt, cli_errors, print_result

SUMS = ("requests", "prompt_tokens", "cached_tokens", "generated_tokens", "discarded_tokens", "cancelled")
ROW_COLS = ("at", "tenant", "key", "model", "endpoint", "prompt_tokens", "cached_tokens", "cache_tier",
            "generated_tokens", "finish_reason", "cancelled", "ttft_ms", "total_ms")


def table(rows: list[dict[str, Any]], cols: tuple[str, ...], title: str) -> Table:
    t = Table(title=title)
    for col in cols:
        t.add_column(col.replace("_", " "), overflow="fold")
    for r in rows:
        t.add_row(*("-" if r.get(c) is None else str(r[c]) for c in cols))
    return t


def usage(url: UrlOpt = None, api_key: AdminKeyOpt = None, as_json: JsonOpt = False,
          group: Annotated[str, typer.Option(
              help="Sum by these, comma-separated: day, key, model, tenant, node (a gateway's) ('' : one total; "
                   "'none': list rows).")
          ] = "day",
          tenant: Annotated[str | None, typer.Option(help="Only this tenant (the admin's choice).")] = None,
          key: Annotated[str | None, typer.Option(help="Only this key (its name).")] = None,
          model: Annotated[str | None, typer.Option(help="Only this model.")] = None,
          since: Annotated[str | None, typer.Option(help="From (unix seconds or ISO 8601, UTC).")] = None,
          until: Annotated[str | None, typer.Option(help="Before (unix seconds or ISO 8601, UTC).")] = None,
          limit: Annotated[int, typer.Option(help="Rows at most (with --group none).")] = 50) -> None:
    """What the server's requests used (tokens prompted, cached, generated; cancelled runs), from
    its usage ledger: it survives restarts.

    Example: hearth usage --group day,model --since 2026-11-01
    """
    params: dict[str, Any] = {k: v for k, v in (("tenant", tenant), ("key", key), ("model", model),
                                                ("since", since), ("until", until)) if v is not None}
    if group != "none":
        params["group"] = group
    else:
        params["limit"] = limit
    with Client(url, api_key) as client:
        data = client.get("/admin/usage", params=params)
    if group != "none":
        cols = (*data["group"], *SUMS)
        print_result(data["data"], as_json, lambda c, rows: c.print(table(rows, cols, "Usage")))
    else:
        print_result(data["data"], as_json, lambda c, rows: c.print(table(rows, ROW_COLS, "Usage ledger")))


usage_command = cli_errors(usage)
