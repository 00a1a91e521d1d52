"""`hearth cache stats|list|clear`: a running server's prompt cache (docs/api.md, "Prompt cache").

The routes live under /admin, so these verbs send the server's admin key when it has one:
`--api-key`, else HEARTH_ADMIN_KEY, else HEARTH_API_KEY.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from hearth.cli.client import Client
from hearth.cli.common import (
    JsonOpt,
    UrlOpt,
    ago,
    cli_errors,
    console,
    human_bytes,
    plural,
    print_json,
    print_result,
)

app = typer.Typer(help="The server's prompt cache: counters per tier, its blocks, clearing it.",
                  no_args_is_help=True)

AdminKeyOpt = Annotated[str | None, typer.Option(
    "--api-key", envvar=["HEARTH_ADMIN_KEY", "HEARTH_API_KEY"], show_default=False,
    help="The server's admin key (any API key if it has none). Env: HEARTH_ADMIN_KEY, then HEARTH_API_KEY.")]
ModelOpt = Annotated[str | None, typer.Option(
    "--model", "-m", show_default=False, help="Model id or alias (default: the server's default model).")]

TIERS = ("slot", "ram", "disk")
BLOCK_TIERS = ("ram", "disk")  # slots hold sequences, not blocks


def stats_table(models: dict[str, Any]) -> Table:
    table = Table(title="Prompt cache")
    for col in ("model", "tier", "hits", "tokens served", "blocks", "bytes", "budget", "evictions"):
        table.add_column(col, overflow="fold", justify="left" if col in ("model", "tier") else "right")
    for mid, st in models.items():
        for tier in TIERS:
            t = st["tiers"][tier]
            held = tier in BLOCK_TIERS
            table.add_row(mid, tier, str(t["hits"]), str(t["tokens"]), str(t["blocks"]) if held else "-",
                          human_bytes(t["bytes"]) if held else "-",
                          ("off" if not t["budget"] else human_bytes(t["budget"])) if held else "-",
                          str(t["evictions"]) if held else "-")
    return table


def stats_lines(mid: str, st: dict[str, Any]) -> str:
    line = (f"{mid}: {plural(st['misses'], 'miss', 'misses')}, "
            f"{plural(st['written_blocks'], 'block')} written, {plural(st['write_errors'], 'write error')}, "
            f"{plural(st['dropped_offers'], 'dropped offer')}, {plural(st['rejected_files'], 'rejected file')}; "
            f"{human_bytes(st['loaded_bytes'])} loaded from disk in {st['load_seconds']:.3f} s")
    if st["disk_full"]:
        line += "; DISK FULL: cache writes stopped (serving goes on)"
    return line


def print_stats(c: Console, data: dict[str, Any]) -> None:
    models = data["models"]
    if not models:
        c.print("the server's models keep no prompt cache")
        return
    c.print(stats_table(models))
    for mid, st in models.items():
        c.print(stats_lines(mid, st), markup=False)


def entries_table(data: dict[str, Any]) -> Table:
    rows = data["data"]
    shown = f", first {len(rows)} shown" if data["has_more"] else ""
    table = Table(title=f"Prompt cache of {data['model']} ({plural(data['total'], 'block')}{shown})")
    for col in ("hash", "parent", "start", "tokens", "ram", "disk", "kept", "last used"):
        table.add_column(col, overflow="fold", no_wrap=col in ("hash", "parent"))
    for e in rows:
        table.add_row(e["hash"], e["parent"], str(e["start"]), str(e["n_tokens"]), "yes" if e["ram"] else "",
                      "yes" if e["disk"] else "", "yes" if e["kept"] else "", ago(e["last_used"]))
    return table


@app.command()
@cli_errors
def stats(url: UrlOpt = None, api_key: AdminKeyOpt = None, as_json: JsonOpt = False) -> None:
    """Hits, tokens served, blocks, bytes and evictions per model and tier (slot, ram, disk).

    Example: hearth cache stats
    """
    with Client(url, api_key) as client:
        data = client.get("/admin/prompt-cache")
    print_result(data, as_json, print_stats)


@app.command("list")
@cli_errors
def list_blocks(model: ModelOpt = None,
                limit: Annotated[int, typer.Option(help="At most this many blocks (1 to 100000).")] = 1000,
                url: UrlOpt = None, api_key: AdminKeyOpt = None, as_json: JsonOpt = False) -> None:
    """The blocks one model's cache holds, in chain order: hash, parent, position, tiers.

    Example: hearth cache list --limit 20
    """
    params: dict[str, str | int] = {"limit": limit}
    if model:
        params["model"] = model
    with Client(url, api_key) as client:
        data = client.get("/admin/prompt-cache/entries", params=params)
    print_result(data, as_json, lambda c, d: c.print(entries_table(d)))


def confirm_clear(client: Client, model: str | None) -> None:
    """Say what a clear would drop and ask (typer.Abort on no, or when nobody can answer)."""
    models = client.get("/admin/prompt-cache")["models"]
    counts: dict[str, int] = {}
    for m in [model] if model else list(models):  # the server resolves an alias, refuses an unknown model
        page = client.get("/admin/prompt-cache/entries", params={"model": m, "limit": 1})
        counts[page["model"]] = page["total"]
    ram = sum(models[m]["tiers"]["ram"]["bytes"] for m in counts if m in models)
    disk = sum(models[m]["tiers"]["disk"]["bytes"] for m in counts if m in models)
    what = f"{next(iter(counts))}'s prompt cache" if model else "the prompt cache of every model"
    typer.confirm(f"Drop {what}: {plural(sum(counts.values()), 'block')}, {human_bytes(ram)} in RAM, "
                  f"{human_bytes(disk)} on disk?", abort=True, err=True)


@app.command()
@cli_errors
def clear(model: Annotated[str | None, typer.Option(
              "--model", "-m", show_default=False, help="Model id or alias (default: every model).")] = None,
          yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask first.")] = False,
          url: UrlOpt = None, api_key: AdminKeyOpt = None, as_json: JsonOpt = False) -> None:
    """Drop every block of the prompt cache (one model's with --model), in RAM and on disk.

    Asks first unless --yes is given. Sessions are not touched.

    Example: hearth cache clear --yes
    """
    with Client(url, api_key) as client:
        if not yes:
            confirm_clear(client, model)
        params = {"model": model} if model else {}
        data = client.request("DELETE", "/admin/prompt-cache", params=params).json()
    if as_json:
        print_json(data)
    else:
        whose = f"{data['model']}'s" if data["model"] else "every model's"
        console().print(f"dropped {plural(data['dropped'], 'block')} of {whose} prompt cache", markup=False)
