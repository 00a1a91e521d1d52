"""`hearth sessions ls|show|rm|history|rollback|resize`: the conversations a server keeps
(docs/sessions.md)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from hearth.cli.client import Client, seg
from hearth.cli.common import ApiKeyOpt, JsonOpt, UrlOpt, ago, cli_errors, console, print_json, print_result

app = typer.Typer(help="List, inspect, roll back, resize and delete server sessions.", no_args_is_help=True)

IdArg = Annotated[str, typer.Argument(help="Session id.", show_default=False)]

ROLE_STYLES = {"system": "magenta", "user": "bold cyan", "assistant": "green", "tool": "yellow"}


def sessions_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title=f"Sessions ({len(rows)})")
    # Ids must stay whole however narrow the terminal is: the other columns give way first.
    widest = max([len(str(s.get("session_id"))) for s in rows] or [7])
    table.add_column("session", min_width=min(widest, 40), overflow="fold")
    for col in ("model", "messages", "tokens", "residency", "busy", "last used"):
        table.add_column(col, overflow="fold")
    for s in rows:
        table.add_row(str(s.get("session_id")), str(s.get("model", "-")), str(s.get("message_count", "-")),
                      f"{s.get('current_pos', 0)} / {s.get('max_seq_len', '?')}", str(s.get("residency", "-")),
                      "yes" if s.get("busy") else "", ago(s.get("last_used_at")))
    return table


def print_session(c: Console, s: dict[str, Any]) -> None:
    for key in ("session_id", "model", "message_count", "current_pos", "max_seq_len", "residency", "busy"):
        c.print(f"{key:<14}{s.get(key, '-')}")
    c.print(f"{'created':<14}{ago(s.get('created_at'))}")
    c.print(f"{'last used':<14}{ago(s.get('last_used_at'))}")


def print_history(c: Console, messages: list[dict[str, Any]]) -> None:
    """Messages numbered from 1, so `/rollback N` keeps exactly the first N shown."""
    if not messages:
        c.print("(no messages)")
    for i, m in enumerate(messages, 1):
        role = str(m.get("role", "?"))
        c.print(Text(f"[{i}] {role}", style=ROLE_STYLES.get(role, "bold")))
        if m.get("reasoning_content"):
            c.print(Text(str(m["reasoning_content"]), style="dim"))
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        if content:
            c.print(Text(str(content)))
        for call in m.get("tool_calls") or []:
            fn = call.get("function", {})
            c.print(Text(f"→ {fn.get('name')}({fn.get('arguments')})", style="yellow"))


@app.command("ls")
@cli_errors
def ls(url: UrlOpt = None, api_key: ApiKeyOpt = None, as_json: JsonOpt = False) -> None:
    """List sessions, most recently used first.

    Example: hearth sessions ls --json
    """
    with Client(url, api_key) as client:
        rows = client.get("/v1/sessions")["data"]
    if as_json:
        print_json(rows)
    else:
        console().print(sessions_table(rows))


@app.command()
@cli_errors
def show(session_id: IdArg, url: UrlOpt = None, api_key: ApiKeyOpt = None, as_json: JsonOpt = False) -> None:
    """Show one session: tokens in its KV, size limit, residency.

    Example: hearth sessions show demo
    """
    with Client(url, api_key) as client:
        s = client.get(f"/v1/sessions/{seg(session_id)}")
    print_result(s, as_json, print_session)


@app.command()
@cli_errors
def rm(session_ids: Annotated[list[str], typer.Argument(help="Session ids.", show_default=False)],
       url: UrlOpt = None, api_key: ApiKeyOpt = None) -> None:
    """Delete sessions (transcript and KV). Snapshots of them stay.

    Example: hearth sessions rm demo old-chat
    """
    with Client(url, api_key) as client:
        for sid in session_ids:
            client.delete(f"/v1/sessions/{seg(sid)}")
            console().print(f"deleted session {sid}")


@app.command()
@cli_errors
def history(session_id: IdArg, url: UrlOpt = None, api_key: ApiKeyOpt = None, as_json: JsonOpt = False) -> None:
    """Print a session's transcript, numbered (reasoning dimmed).

    Example: hearth sessions history demo
    """
    with Client(url, api_key) as client:
        messages = client.get(f"/v1/sessions/{seg(session_id)}/history")["data"]
    print_result(messages, as_json, print_history)


@app.command()
@cli_errors
def rollback(session_id: IdArg,
             keep: Annotated[int, typer.Argument(help="Messages to keep (numbers as in `history`).",
                                                 show_default=False)],
             url: UrlOpt = None, api_key: ApiKeyOpt = None, as_json: JsonOpt = False) -> None:
    """Keep only the first KEEP messages of a session; the KV keeps what they still cover.

    Example: hearth sessions rollback demo 2
    """
    with Client(url, api_key) as client:
        s = client.post(f"/v1/sessions/{seg(session_id)}/rollback", {"keep_messages": keep})
    if as_json:
        print_json(s)
    else:
        console().print(f"session {session_id}: {s.get('message_count')} messages kept "
                        f"({s.get('current_pos')} tokens)", markup=False)


@app.command()
@cli_errors
def resize(session_id: IdArg,
           max_seq_len: Annotated[int | None, typer.Argument(
               help="New token limit; omit with --next-pow2.", show_default=False)] = None,
           strategy: Annotated[str, typer.Option(
               help="reject (refuse if the transcript does not fit) or drop_oldest (drop the oldest "
                    "turns until it does); superlinear's auto, gpu and disk mean reject.")] = "reject",
           next_pow2: Annotated[bool, typer.Option(
               "--next-pow2", help="Double the limit to the next power of two.")] = False,
           url: UrlOpt = None, api_key: ApiKeyOpt = None, as_json: JsonOpt = False) -> None:
    """Change a session's token limit (max_seq_len).

    Example: hearth sessions resize demo 4096 --strategy drop_oldest
    """
    if (max_seq_len is None) == (not next_pow2):
        raise typer.BadParameter("give MAX_SEQ_LEN or --next-pow2 (one of them)")
    with Client(url, api_key) as client:
        sid = seg(session_id)
        s = (client.post(f"/v1/sessions/{sid}/resize/next_pow2", {}) if next_pow2 else
             client.post(f"/v1/sessions/{sid}/resize", {"max_seq_len": max_seq_len, "strategy": strategy}))
    if as_json:
        print_json(s)
    else:
        console().print(f"session {session_id}: max_seq_len {s.get('old_max_seq_len')} -> {s.get('max_seq_len')}, "
                        f"{s.get('message_count')} messages, {s.get('current_pos')} tokens", markup=False)
