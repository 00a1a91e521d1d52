"""`hearth batch submit|status|ls|cancel|download`: the Batch API (/v1/files, /v1/batches) for
people without an SDK (docs/api.md, "Batches")."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from hearth.cli.client import Client, CLIError, seg
from hearth.cli.common import ApiKeyOpt, JsonOpt, UrlOpt, ago, cli_errors, print_result

app = typer.Typer(help="Submit JSONL batches and fetch their results (the OpenAI Batch API).", no_args_is_help=True)

IdArg = Annotated[str, typer.Argument(help="Batch id (batch_…).", show_default=False)]
FINAL = ("completed", "failed", "expired", "cancelled")
POLL = 1.0  # seconds between looks while --wait waits


def print_batch(c: Console, b: dict[str, Any]) -> None:
    counts = b.get("request_counts") or {}
    rows = [("batch", b.get("id")), ("status", b.get("status")), ("endpoint", b.get("endpoint")),
            ("requests", f"{counts.get('completed', 0)} completed, {counts.get('failed', 0)} failed, "
                         f"{counts.get('total', 0)} in all"),
            ("created", ago(b.get("created_at"))), ("input_file", b.get("input_file_id")),
            ("output_file", b.get("output_file_id") or "-"), ("error_file", b.get("error_file_id") or "-")]
    if b.get("metadata"):
        rows.append(("metadata", ", ".join(f"{k}={v}" for k, v in b["metadata"].items())))
    for e in ((b.get("errors") or {}).get("data") or []):
        rows.append(("error", f"{e.get('code')}: {e.get('message')}"))
    for key, value in rows:
        c.print(f"{key:<13}{value}")


def _metadata(pairs: list[str] | None) -> dict[str, str] | None:
    if not pairs:
        return None
    out = {}
    for p in pairs:
        key, eq, value = p.partition("=")
        if not eq or not key:
            raise CLIError(f"--metadata takes KEY=VALUE, not {p!r}", 2)
        out[key] = value
    return out


def _wait(client: Client, batch_id: str) -> dict[str, Any]:
    while True:
        b: dict[str, Any] = client.get(f"/v1/batches/{seg(batch_id)}")
        if b.get("status") in FINAL:
            return b
        time.sleep(POLL)


@app.command()
@cli_errors
def submit(
    file: Annotated[Path, typer.Argument(help="The JSONL: one {custom_id, method, url, body} a line.",
                                         exists=True, dir_okay=False, readable=True, show_default=False)],
    endpoint: Annotated[str, typer.Option(help="The endpoint every line calls.")] = "/v1/chat/completions",
    window: Annotated[str, typer.Option("--completion-window", help="The completion window.")] = "24h",
    metadata: Annotated[list[str] | None, typer.Option(help="KEY=VALUE to keep with the batch (repeatable).",
                                                       show_default=False)] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the batch ends.")] = False,
    url: UrlOpt = None, api_key: ApiKeyOpt = None, as_json: JsonOpt = False,
) -> None:
    """Upload FILE and start a batch over it.

    Example: hearth batch submit requests.jsonl --endpoint /v1/chat/completions
    """
    meta = _metadata(metadata)
    with Client(url, api_key) as client, file.open("rb") as f:
        uploaded = client.request("POST", "/v1/files", files={"file": (file.name, f, "application/jsonl")},
                                  data={"purpose": "batch"}).json()
        body: dict[str, Any] = {"input_file_id": uploaded["id"], "endpoint": endpoint, "completion_window": window}
        if meta is not None:
            body["metadata"] = meta
        b = client.post("/v1/batches", body)
        if wait:
            b = _wait(client, b["id"])
    print_result(b, as_json, print_batch)


@app.command()
@cli_errors
def status(batch_id: IdArg, wait: Annotated[bool, typer.Option("--wait", help="Wait until the batch ends.")] = False,
           url: UrlOpt = None, api_key: ApiKeyOpt = None, as_json: JsonOpt = False) -> None:
    """Show a batch: its status and how many requests are done.

    Example: hearth batch status batch_0f3a…
    """
    with Client(url, api_key) as client:
        b = _wait(client, batch_id) if wait else client.get(f"/v1/batches/{seg(batch_id)}")
    print_result(b, as_json, print_batch)


@app.command("ls")
@cli_errors
def ls(url: UrlOpt = None, api_key: ApiKeyOpt = None, as_json: JsonOpt = False,
       limit: Annotated[int, typer.Option(help="How many, newest first.")] = 20) -> None:
    """List batches, newest first.

    Example: hearth batch ls
    """
    with Client(url, api_key) as client:
        rows = client.get("/v1/batches", params={"limit": limit})["data"]

    def render(c: Console, data: list[dict[str, Any]]) -> None:
        table = Table(title=f"Batches ({len(data)})")
        table.add_column("batch", min_width=38 if data else 5, overflow="fold")
        for col in ("status", "endpoint", "done", "created"):
            table.add_column(col, overflow="fold")
        for b in data:
            n = b.get("request_counts") or {}
            table.add_row(str(b["id"]), str(b["status"]), str(b["endpoint"]),
                          f"{n.get('completed', 0) + n.get('failed', 0)}/{n.get('total', 0)}", ago(b.get("created_at")))
        c.print(table)

    print_result(rows, as_json, render)


@app.command()
@cli_errors
def cancel(batch_id: IdArg, url: UrlOpt = None, api_key: ApiKeyOpt = None, as_json: JsonOpt = False) -> None:
    """Cancel a batch: no new request starts; what finished stays in its output.

    Example: hearth batch cancel batch_0f3a…
    """
    with Client(url, api_key) as client:
        b = client.post(f"/v1/batches/{seg(batch_id)}/cancel")
    print_result(b, as_json, print_batch)


@app.command()
@cli_errors
def download(
    batch_id: IdArg,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Write here (default: stdout).",
                                                dir_okay=False, show_default=False)] = None,
    errors: Annotated[bool, typer.Option("--errors", help="The error file instead of the output file.")] = False,
    url: UrlOpt = None, api_key: ApiKeyOpt = None,
) -> None:
    """Download a batch's output (or, with --errors, its error) JSONL.

    Example: hearth batch download batch_0f3a… -o results.jsonl
    """
    with Client(url, api_key) as client:
        b = client.get(f"/v1/batches/{seg(batch_id)}")
        fid = b.get("error_file_id" if errors else "output_file_id")
        if not fid:
            which = "error" if errors else "output"
            raise CLIError(f"batch {batch_id} has no {which} file (status: {b.get('status')})")
        path = f"/v1/files/{seg(fid)}/content"
        if output is None:
            sys.stdout.buffer.write(client.request("GET", path).content)
            sys.stdout.flush()
            return
        n = client.download(path, output)
    print(f"wrote {n} bytes to {output}", file=sys.stderr)
