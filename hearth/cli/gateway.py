"""`hearth gateway`: serve the gateway; `hearth gateway status`, `hearth gateway drain NODE`,
`hearth gateway move SESSION`, `hearth gateway reload` talk to a running one."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from hearth.cli.client import Client
from hearth.cli.common import (
    ApiKeyOpt,
    CorsOpt,
    InsecureOpt,
    JsonOpt,
    RequireKeyOpt,
    cli_errors,
    console,
    print_json,
    required_keys,
)
from hearth.http.serving import GRACEFUL_SHUTDOWN_S, KEEP_ALIVE_S

app = typer.Typer(help="One front door over a fleet of Hearth nodes and OpenAI-compatible engines.",
                  invoke_without_command=True)

GatewayUrlOpt = Annotated[str, typer.Option(
    "--url", envvar="HEARTH_GATEWAY_URL", help="The gateway's URL.")]


@app.callback()
def serve(
    ctx: typer.Context,
    upstreams: Annotated[Path | None, typer.Option(
        "--upstreams", envvar="HEARTH_UPSTREAMS",
        help="TOML file with one upstream table per node (docs/gateway.md); reloaded on SIGHUP or "
             "`hearth gateway reload`. Optional when nodes join (--join-key).")] = None,
    host: Annotated[str, typer.Option(envvar="HEARTH_HOST", help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(envvar="HEARTH_GATEWAY_PORT")] = 8080,
    default_model: Annotated[str | None, typer.Option(
        envvar="HEARTH_DEFAULT_MODEL", help="Alias that serves requests naming an unknown model.")] = None,
    api_key: RequireKeyOpt = None,
    api_key_file: Annotated[str | None, typer.Option(
        envvar="HEARTH_API_KEY_FILE", help="File with one client key per line, a node's format: KEY [name=NAME] "
        "[tenant=TENANT] [cache=...] [concurrent=N] [rpm=N] [tpm=N] (docs/gateway.md, \"Tenants\"); read again on "
        "SIGHUP or `hearth keys reload` (POST /admin/keys/reload).")] = None,
    admin_key: Annotated[str | None, typer.Option(
        envvar="HEARTH_ADMIN_KEY", help="Key needed for drain/move and to delete sessions and snapshots.")] = None,
    join_key: Annotated[str | None, typer.Option(
        envvar="HEARTH_JOIN_KEY", help="Key with which nodes join the fleet at run time (`hearth serve --join`); "
        "the admin key is accepted too.")] = None,
    member_ttl: Annotated[float, typer.Option(
        envvar="HEARTH_MEMBER_TTL", help="Seconds a joined node's registration lasts; nodes renew it every "
        "third of that.")] = 15.0,
    member_grace: Annotated[float, typer.Option(
        envvar="HEARTH_MEMBER_GRACE", help="Seconds a node that stopped renewing is kept out of routing before "
        "it is removed from the fleet.")] = 60.0,
    metrics_token: Annotated[str | None, typer.Option(envvar="HEARTH_METRICS_TOKEN")] = None,
    metrics_public: Annotated[bool, typer.Option(envvar="HEARTH_METRICS_PUBLIC")] = False,
    insecure: InsecureOpt = False,
    cors_origins: CorsOpt = "loopback",
    max_waiting: Annotated[int, typer.Option(
        envvar="HEARTH_MAX_WAITING", help="Requests that may wait for a free node; more get 429.")] = 64,
    max_wait: Annotated[float, typer.Option(
        envvar="HEARTH_MAX_WAIT", help="Seconds a request may wait for a node before it gets 429.")] = 30.0,
    probe_interval: Annotated[float, typer.Option(
        envvar="HEARTH_PROBE_INTERVAL", help="Seconds between liveness probes.")] = 2.0,
    probe_timeout: Annotated[float, typer.Option(envvar="HEARTH_PROBE_TIMEOUT")] = 2.0,
    heartbeat: Annotated[float, typer.Option(
        envvar="HEARTH_HEARTBEAT", help="Seconds without upstream bytes before an SSE keep-alive comment.")] = 5.0,
    stall_timeout: Annotated[float, typer.Option(
        envvar="HEARTH_STALL_TIMEOUT", help="Seconds a stream from a Hearth node may send nothing (its own heartbeats "
        "included) before it counts as broken; 0: never. Per upstream: stall_timeout in the TOML.")] = 30.0,
    migration_limit: Annotated[int, typer.Option(
        envvar="HEARTH_MIGRATION_LIMIT", help="Times a stream whose node died mid-answer may continue on "
        "another node (openai upstreams: those with a continuation in the TOML; 0: never; the client gets the "
        "protocol's terminal error).")] = 3,
    routing: Annotated[str, typer.Option(
        envvar="HEARTH_GATEWAY_ROUTING", help="cost (affinity + cache-aware) or round_robin (a baseline).")] = "cost",
    digest_interval: Annotated[float, typer.Option(
        envvar="HEARTH_DIGEST_INTERVAL", help="Seconds between reads of each Hearth node's prompt-cache digest "
        "(routing on what nodes hold); 0: off, route by the estimate.")] = 1.0,
    digest_timeout: Annotated[float, typer.Option(
        envvar="HEARTH_DIGEST_TIMEOUT", help="Seconds a digest read or a request's blocks call may take.")] = 1.0,
    digest_max_age: Annotated[float, typer.Option(
        envvar="HEARTH_DIGEST_MAX_AGE", help="Seconds a node's last digest is used (stale) after its reads "
        "fail; then the node is routed by the estimate.")] = 5.0,
    data_dir: Annotated[str | None, typer.Option(
        envvar="HEARTH_GATEWAY_HOME", help="Where the gateway keeps transcripts (default: DATA_DIR/gateway).")] = None,
    database: Annotated[str | None, typer.Option(
        "--database", envvar="HEARTH_DATABASE_URL", show_default=False,
        help="postgresql://USER:PASSWORD@HOST/DB: the state several gateways share (sessions, chains, "
        "transcripts, moves). Default: SQLite in the gateway's home, for one gateway.")] = None,
    lease_ttl: Annotated[float, typer.Option(
        envvar="HEARTH_LEASE_TTL", help="Seconds after its last renewal (every --probe-interval) that a gateway "
        "counts as gone: others on the database then settle its moves and drains and fail its background "
        "runs.")] = 15.0,
    batch_concurrency: Annotated[int, typer.Option(
        envvar="HEARTH_GATEWAY_BATCH_CONCURRENCY", min=1,
        help="Batch API lines the gateway runs at once over its nodes (all batches).")] = 4,
    usage_ledger: Annotated[bool, typer.Option(
        "--usage-ledger/--no-usage-ledger", envvar="HEARTH_USAGE_LEDGER",
        help="Keep one row per turn in the gateway's database (GET /admin/usage, hearth usage).")] = True,
    otlp_endpoint: Annotated[str | None, typer.Option(
        envvar="HEARTH_OTLP_ENDPOINT",
        help="Export OpenTelemetry traces over OTLP/HTTP to this collector (the standard OTEL_EXPORTER_OTLP_* "
             "variables work too); the trace context goes on to the nodes. Off by default.")] = None,
    log_level: Annotated[str, typer.Option(envvar="HEARTH_LOG_LEVEL")] = "info",
    log_format: Annotated[str, typer.Option(envvar="HEARTH_LOG_FORMAT")] = "text",
) -> None:
    """Serve the gateway (the four protocols, over the upstreams in --upstreams).

    Example: hearth gateway --upstreams fleet.toml --port 8080
             hearth gateway --join-key "$HEARTH_JOIN_KEY" --host 0.0.0.0 --api-key … --admin-key …
    """
    if ctx.invoked_subcommand is not None:
        return
    import uvicorn

    from hearth.config import default_data_dir, parse_origins
    from hearth.gateway.app import create_gateway_app
    from hearth.gateway.settings import GatewaySettings, load_upstreams
    from hearth.observability.logging import setup_logging
    from hearth.tenants import read_key_file

    if upstreams is None and not (join_key or admin_key):
        typer.echo("error: --upstreams FILE (a TOML [[upstream]] list; see docs/gateway.md) or --join-key KEY "
                   "(nodes join at run time) is required", err=True)
        raise typer.Exit(2)
    try:
        keys = required_keys(api_key)
        named = read_key_file(api_key_file) if api_key_file else []
        home = Path(data_dir).expanduser() if data_dir else default_data_dir() / "gateway"
        settings = GatewaySettings(
            upstreams=load_upstreams(upstreams) if upstreams else [], upstreams_file=upstreams, join_key=join_key,
            member_ttl=member_ttl, member_grace=member_grace, host=host, port=port, default_model=default_model,
            api_keys=keys, named_keys=named, api_key_file=Path(api_key_file) if api_key_file else None,
            admin_key=admin_key, metrics_token=metrics_token, metrics_public=metrics_public, insecure=insecure,
            cors_origins=parse_origins(cors_origins),
            max_waiting=max_waiting, max_wait=max_wait, probe_interval=probe_interval, probe_timeout=probe_timeout,
            heartbeat=heartbeat, stall_timeout=stall_timeout, log_level=log_level, data_dir=home, routing=routing,
            database=database or None, lease_ttl=lease_ttl, batch_concurrency=batch_concurrency,
            migration_limit=migration_limit, digest_interval=digest_interval, digest_timeout=digest_timeout,
            digest_max_age=digest_max_age, usage_ledger=usage_ledger, otlp_endpoint=otlp_endpoint)
    except (ValueError, OSError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e
    setup_logging(log_level, log_format)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per upstream call is noise
    names = ", ".join(f"{u.name} ({u.kind})" for u in settings.upstreams) or "no upstream yet"
    if settings.database is not None:
        from hearth.gateway.store.postgres import redacted
        names += f"; state in {redacted(settings.database)}"
    joins = "; nodes may join" if join_key or admin_key else ""
    typer.echo(f"hearth gateway on http://{host}:{port} over {names}{joins}", err=True)
    uvicorn.run(create_gateway_app(settings), host=host, port=port, log_level=log_level.lower(), log_config=None,
                access_log=False, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S, timeout_keep_alive=KEEP_ALIVE_S)


@app.command()
@cli_errors
def status(url: GatewayUrlOpt = "http://127.0.0.1:8080", api_key: ApiKeyOpt = None, as_json: JsonOpt = False) -> None:
    """Nodes, health, breaker, load and sessions per node."""
    with Client(url, api_key) as c:
        data = c.get("/admin/status")
    if as_json:
        print_json(data)
        return
    table = Table("node", "kind", "source", "url", "up", "breaker", "draining", "in flight", "sessions", box=None)
    for n in data["nodes"]:
        up = "up" if n["up"] else f"down ({n['last_error']})" if n["last_error"] else "down"
        source = "joined (lapsed)" if n.get("lapsed") else n.get("source", "file")
        table.add_row(n["name"], n["kind"], source, n["url"], up, n["breaker"], "yes" if n["draining"] else "",
                      f"{n['in_flight']}/{n['max_in_flight']}", str(n["sessions"]))
    console().print(table)
    console().print(f"waiting for a node: {data['waiting']}")


@app.command()
@cli_errors
def drain(node: Annotated[str, typer.Argument(help="The upstream's name.")], url: GatewayUrlOpt = "http://127.0.0.1:8080",
          api_key: ApiKeyOpt = None, as_json: JsonOpt = False) -> None:
    """Stop routing to NODE and move all its sessions, with their KV, to other nodes."""
    with Client(url, api_key) as c:
        data = c.post(f"/admin/nodes/{node}/drain", timeout=None)  # as long as the moves take
    if as_json:
        print_json(data)
        return
    for m in data["moved"]:
        console().print(f"moved {m['session_id']} → {m['to']} ({m['tokens']} tokens, {m['seconds']} s)")
    for f in data["failed"]:
        console().print(f"[red]not moved {f['session_id']}: {f['error']}[/red]")
    console().print(f"{node} is draining: {len(data['moved'])} moved, {len(data['failed'])} failed")


@app.command()
@cli_errors
def move(session: Annotated[str, typer.Argument(help="Session id.")],
         to: Annotated[str | None, typer.Option(help="Destination node (default: the least loaded).")] = None,
         url: GatewayUrlOpt = "http://127.0.0.1:8080", api_key: ApiKeyOpt = None) -> None:
    """Move one session, with its KV, to another node."""
    with Client(url, api_key) as c:
        print_json(c.post(f"/admin/sessions/{session}/move", {"to": to} if to else {}, timeout=None))


@app.command()
@cli_errors
def reload(url: GatewayUrlOpt = "http://127.0.0.1:8080", api_key: ApiKeyOpt = None, as_json: JsonOpt = False) -> None:
    """Read the gateway's fleet file again: added upstreams join, removed ones are drained, then
    removed. A bad file is an error and the running fleet stays as it was."""
    with Client(url, api_key) as c:
        data = c.post("/admin/fleet/reload", {})
    if as_json:
        print_json(data)
        return
    for what in ("added", "changed", "removed"):
        console().print(f"{what}: {', '.join(data[what]) or 'none'}")
