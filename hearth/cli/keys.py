"""`hearth keys usage`: a running server's usage and limits per API key (docs/api.md, "Usage
and limits per key"). The route lives under /admin: send the admin key when the server has one."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from hearth.cli.cache import AdminKeyOpt
from hearth.cli.client import Client
from hearth.cli.common import JsonOpt, UrlOpt, cli_errors, print_result

app = typer.Typer(help="The server's API keys: usage and limits per key.", no_args_is_help=True)


def usage_table(rows: list[dict[str, Any]]) -> Table:
    """One row per key; a node adds a row per tenant a gateway key spoke for (`via`: that key)."""
    table = Table(title="API keys")
    via = any(r.get("via") for r in rows)
    cols = ("key", "tenant", *(("via",) if via else ()), "requests", "limited", "in flight", "prompt tokens",
            "completion tokens", "cached tokens", "limits")
    for col in cols:
        table.add_column(col, overflow="fold", justify="left" if col in ("key", "tenant", "via", "limits") else "right")
    for r in rows:
        limits = ", ".join(f"{k}={v}" for k, v in r["limits"].items() if v is not None) or "-"
        table.add_row(r["name"], r["tenant"], *((r.get("via") or "-",) if via else ()), str(r["requests"]),
                      str(r["limited"]), str(r["in_flight"]), str(r["prompt_tokens"]), str(r["completion_tokens"]),
                      str(r["cached_tokens"]), limits)
    return table


@app.command()
@cli_errors
def usage(url: UrlOpt = None, api_key: AdminKeyOpt = None, as_json: JsonOpt = False) -> None:
    """Requests (admitted, refused for a limit, in flight) and tokens (prompt, completion, cached)
    per API key since the server started (resumed from the usage ledger after a restart), with each key's limits.

    Example: hearth keys usage
    """
    with Client(url, api_key) as client:
        data = client.get("/admin/keys/usage")
    print_result(data["data"], as_json, lambda c, rows: c.print(usage_table(rows)))
