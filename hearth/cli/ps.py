"""`hearth ps`: the models a running server has in memory, as `ollama ps` shows them: memory
its load took, context, and until when an idle one stays loaded (from /v1/models)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from hearth.cli.client import Client
from hearth.cli.common import ApiKeyOpt, JsonOpt, UrlOpt, cli_errors, human_bytes, human_duration, print_result


def in_memory(models: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The models loaded, loading or unloading; a server without on-demand loading lists all its
    models (they are always loaded)."""
    return [m for m in models if (m.get("status") or {"value": "loaded"})["value"] != "unloaded"]


def until(status: dict[str, Any]) -> str:
    if status.get("pinned"):
        return "kept (--model)"
    if status.get("users"):
        return f"in use ({status['users']} request{'s' if status['users'] != 1 else ''})"
    if status["value"] != "loaded":
        return str(status["value"])
    left = status.get("expires_in")
    return "forever" if left is None else f"{human_duration(left)} from now"


def ps_table(c: Console, models: list[dict[str, Any]]) -> None:
    rows = in_memory(models)
    if not rows:
        c.print("no model is loaded (one loads when a request names it: hearth models load NAME)")
        return
    table = Table(title="Loaded models")
    for col in ("id", "status", "memory", "file", "context", "loads", "until"):
        table.add_column(col, no_wrap=col == "id", justify="right" if col in ("memory", "file", "loads") else "left")
    for m in rows:
        st = m.get("status") or {"value": "loaded"}
        meta = m.get("meta", {})
        table.add_row(m["id"], st["value"], human_bytes(st.get("loaded_bytes")) if st.get("loaded_bytes") else "-",
                      human_bytes(meta.get("size_bytes")), str(meta.get("n_ctx") or "?"), str(st.get("loads", "-")),
                      until(st) if "users" in st else "-")
    c.print(table)


@cli_errors
def ps(url: UrlOpt = None, api_key: ApiKeyOpt = None, as_json: JsonOpt = False) -> None:
    """List the models the server has in memory: memory, context, and until when they stay.

    "memory" is what the model's load added to the server's resident memory (weights, KV cache
    and compute buffers, measured); an idle model is unloaded when its keep-alive runs out.

    Example: hearth ps
    """
    with Client(url, api_key) as client:
        models = client.get("/v1/models")["data"]
    print_result(in_memory(models) if as_json else models, as_json, ps_table)
