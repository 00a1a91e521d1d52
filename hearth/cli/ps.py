"""`hearth ps`: the models a running server has in memory, as `ollama ps` shows them: memory
its load took, context, and until when an idle one stays loaded (from /v1/models)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from hearth.cli.client import Client, CLIError
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


CLASSES = ("priority", "default", "flex")  # highest first


def work_by_class(samples: list[tuple[str, dict[str, str], float]]) -> dict[str, dict[str, int]]:
    """Requests queued and paused now, per class, all models together (from /metrics)."""
    out: dict[str, dict[str, int]] = {"queued": {}, "paused": {}}
    for name, labels, value in samples:
        for what in out:
            if name == f"hearth_{what}_requests_by_class" and value:
                cls = labels.get("class", "?")
                out[what][cls] = out[what].get(cls, 0) + int(value)
    return out


def work_line(work: dict[str, dict[str, int]]) -> str:
    """`queued 2 priority, 5 flex; paused 3 flex` (or `none queued, none paused`)."""
    parts = []
    for what in ("queued", "paused"):
        counts = work.get(what, {})
        listed = ", ".join(f"{counts[c]} {c}" for c in CLASSES if counts.get(c))
        parts.append(f"{what} {listed}" if listed else f"none {what}")
    return "; ".join(parts)


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
        try:
            work = work_by_class(client.samples())
        except CLIError:  # /metrics off or behind its own token: the models alone
            work = None
    if as_json:
        print_result(in_memory(models), as_json, ps_table)
        return

    def show(c: Console, rows: list[dict[str, Any]]) -> None:
        ps_table(c, rows)
        if work is not None:
            c.print(f"work: {work_line(work)}")

    print_result(models, as_json, show)
