"""`hearth keys usage`: a running server's usage and limits per API key (docs/api.md, "Usage
and limits per key"); `hearth keys reload`: its key file read again (POST /admin/keys/reload).
The routes live under /admin: send the admin key when the server has one."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from hearth.cli.cache import AdminKeyOpt
from hearth.cli.client import Client
from hearth.cli.common import JsonOpt, UrlOpt, cli_errors, print_result

app = typer.Typer(help="The server's API keys: usage and limits per key; the key file reloaded.",
                  no_args_is_help=True)


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


@app.command()
@cli_errors
def reload(url: UrlOpt = None, api_key: AdminKeyOpt = None, as_json: JsonOpt = False) -> None:
    """Read the server's --api-key-file again and put it in force without a restart (as SIGHUP
    does): a removed key gets 401 on its next request, a changed one's limits apply to new
    requests. A bad file is an error and the keys in force stay as they were.

    Example: hearth keys reload --url http://gateway:8080
    """
    with Client(url, api_key) as client:
        data = client.post("/admin/keys/reload", {})
    print_result(data, as_json, lambda c, d: c.print(
        f"keys reloaded: {d['added']} added, {d['removed']} removed, {d['changed']} changed, "
        f"{d['unchanged']} unchanged"))
