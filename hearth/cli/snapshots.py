"""`hearth snapshots ls|show|rm|load|tag|export|import`: saved sessions on the server's disk."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from hearth.cli.client import Client, CLIError, seg
from hearth.cli.common import (
    ApiKeyOpt,
    JsonOpt,
    UrlOpt,
    ago,
    cli_errors,
    console,
    human_bytes,
    print_json,
    print_result,
    spinner,
)
from hearth.cli.sessions import print_session

app = typer.Typer(help="List, tag, load, export and import session snapshots.", no_args_is_help=True)

IdArg = Annotated[str, typer.Argument(help="Snapshot id (snap_…).", show_default=False)]


def snapshots_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title=f"Snapshots ({len(rows)})")
    table.add_column("snapshot", min_width=37 if rows else 8, overflow="fold")  # snap_ + 32 hex, kept whole
    for col in ("title", "tags", "session", "tokens", "size", "created"):
        table.add_column(col, overflow="fold")
    for s in rows:
        session = s.get("session") or {}
        table.add_row(str(s.get("snapshot_id")), str(s.get("title") or ""), ", ".join(s.get("tags") or []),
                      str(session.get("session_id", "-")), str(session.get("n_tokens", "-")),
                      human_bytes(s.get("bytes")), ago(s.get("created_at")))
    return table


def print_snapshot(c: Console, s: dict[str, Any]) -> None:
    session, model = s.get("session") or {}, s.get("model") or {}
    rows = [("snapshot_id", s.get("snapshot_id")), ("title", s.get("title") or ""),
            ("description", s.get("description") or ""), ("tags", ", ".join(s.get("tags") or [])),
            ("created", ago(s.get("created_at"))), ("size", human_bytes(s.get("bytes"))),
            ("model", f"{model.get('id', '?')} ({model.get('arch', '?')}, "
                      f"sha256 {str(model.get('sha256', '?'))[:12]}…)"),
            ("session", session.get("session_id", "-")), ("tokens", session.get("n_tokens", "-")),
            ("messages", session.get("message_count", "-")), ("max_seq_len", session.get("max_seq_len", "-"))]
    for key, value in rows:
        c.print(f"{key:<13}{value}")


@app.command("ls")
@cli_errors
def ls(url: UrlOpt = None, api_key: ApiKeyOpt = None, as_json: JsonOpt = False) -> None:
    """List snapshots, newest first.

    Example: hearth snapshots ls
    """
    with Client(url, api_key) as client:
        rows = client.get("/v1/snapshots")["data"]
    if as_json:
        print_json(rows)
    else:
        console().print(snapshots_table(rows))


@app.command()
@cli_errors
def show(snapshot_id: IdArg, url: UrlOpt = None, api_key: ApiKeyOpt = None, as_json: JsonOpt = False) -> None:
    """Show one snapshot's manifest: model, tokens, tags.

    Example: hearth snapshots show snap_0f3a…
    """
    with Client(url, api_key) as client:
        s = client.get(f"/v1/snapshots/{seg(snapshot_id)}")
    print_result(s, as_json, print_snapshot)


@app.command()
@cli_errors
def rm(snapshot_ids: Annotated[list[str], typer.Argument(help="Snapshot ids.", show_default=False)],
       url: UrlOpt = None, api_key: ApiKeyOpt = None) -> None:
    """Delete snapshots from the server's disk.

    Example: hearth snapshots rm snap_0f3a…
    """
    with Client(url, api_key) as client:
        for sid in snapshot_ids:
            client.delete(f"/v1/snapshots/{seg(sid)}")
            console().print(f"deleted snapshot {sid}")


@app.command()
@cli_errors
def load(
    snapshot_id: IdArg,
    session: Annotated[str | None, typer.Option(
        "--session", "-s", help="Session id to load into (default: a new id from the server).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace the session if it exists.")] = False,
    url: UrlOpt = None, api_key: ApiKeyOpt = None, as_json: JsonOpt = False,
) -> None:
    """Load a snapshot into a session (KV restored: no re-prefill), then chat on with it.

    Example: hearth snapshots load snap_0f3a… --session demo && hearth chat --session demo
    """
    body: dict[str, Any] = {"force": force}
    if session:
        body["session_id"] = session
    with Client(url, api_key) as client, spinner(f"loading {snapshot_id}…"):
        s = client.post(f"/v1/snapshots/{seg(snapshot_id)}/load", body)
    if as_json:
        print_json(s)
    else:
        c = console()
        c.print(f"loaded {snapshot_id} into session {s.get('session_id')}")
        print_session(c, s)


@app.command()
@cli_errors
def tag(
    snapshot_id: IdArg,
    tags: Annotated[list[str] | None, typer.Argument(help="Tags to add.", show_default=False)] = None,
    remove: Annotated[list[str] | None, typer.Option("--remove", "-r", help="Tag to remove. Repeatable.")] = None,
    title: Annotated[str | None, typer.Option(help="New title.")] = None,
    description: Annotated[str | None, typer.Option(help="New description.")] = None,
    url: UrlOpt = None, api_key: ApiKeyOpt = None, as_json: JsonOpt = False,
) -> None:
    """Add or remove tags, or set the title or description, of a snapshot.

    Example: hearth snapshots tag snap_0f3a… work draft -r old --title "before refactor"
    """
    if not tags and not remove and title is None and description is None:
        raise CLIError("nothing to change: give tags to add, --remove TAG, --title or --description", 2)
    with Client(url, api_key) as client:
        path = f"/v1/snapshots/{seg(snapshot_id)}"
        body: dict[str, Any] = {}
        if tags or remove:
            current = client.get(path).get("tags") or []
            drop = set(remove or [])
            body["tags"] = [t for t in dict.fromkeys([*current, *(tags or [])]) if t not in drop]
        if title is not None:
            body["title"] = title
        if description is not None:
            body["description"] = description
        s = client.patch(path, body)
    print_result(s, as_json, print_snapshot)


@app.command()
@cli_errors
def export(
    snapshot_id: IdArg,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="File to write (default: ID.tar).")] = None,
    url: UrlOpt = None, api_key: ApiKeyOpt = None,
) -> None:
    """Download a snapshot as one tar archive, to import on another server with the same model.

    Example: hearth snapshots export snap_0f3a… -o chat.tar
    """
    dest = output or Path(f"{snapshot_id}.tar")
    with Client(url, api_key) as client, spinner(f"exporting {snapshot_id}…"):
        n = client.download(f"/v1/snapshots/{seg(snapshot_id)}/archive", dest)
    console().print(f"exported {snapshot_id} to {dest} ({human_bytes(n)})")


@app.command("import")
@cli_errors
def import_(
    archive: Annotated[Path, typer.Argument(help="A tar written by `hearth snapshots export`.", show_default=False)],
    url: UrlOpt = None, api_key: ApiKeyOpt = None, as_json: JsonOpt = False,
) -> None:
    """Upload a snapshot archive to the server.

    Example: hearth snapshots import chat.tar
    """
    data = archive.read_bytes()
    with Client(url, api_key) as client, spinner(f"importing {archive}…"):
        s = client.request("POST", "/v1/snapshots/import", content=data,
                           headers={"Content-Type": "application/x-tar"}).json()
    if as_json:
        print_json(s)
    else:
        console().print(f"imported {s.get('snapshot_id')} from {archive}")
