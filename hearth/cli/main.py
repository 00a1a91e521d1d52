"""`hearth` command line."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from hearth import __version__
from hearth.cli import (
    batch,
    cache,
    chat,
    docs,
    gateway,
    keys,
    launch,
    models,
    ps,
    replay,
    server,
    sessions,
    snapshots,
    usage,
)
from hearth.cli.common import CorsOpt, InsecureOpt, RequireKeyOpt, cli_errors, required_keys

app = typer.Typer(help="Hearth: an LLM server that keeps conversations warm.", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False)
app.add_typer(server.app, name="server")
app.add_typer(sessions.app, name="sessions")
app.add_typer(snapshots.app, name="snapshots")
app.add_typer(models.app, name="models")
app.add_typer(cache.app, name="cache")
app.add_typer(keys.app, name="keys")
app.add_typer(gateway.app, name="gateway")
app.add_typer(batch.app, name="batch")
app.command()(chat.chat)
app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
    launch.launch)
app.command()(docs.docs)
app.command()(ps.ps)
app.command(name="usage")(usage.usage_command)
app.command(name="replay")(cli_errors(replay.replay))


def _version(value: bool) -> None:
    if value:
        typer.echo(f"hearth {__version__}")
        raise typer.Exit()


@app.callback()
def main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                               help="Print the version and exit.")] = False) -> None:
    """Hearth: an LLM server that keeps conversations warm."""


@app.command()
def serve(
    model: Annotated[list[str] | None, typer.Option(
        "--model", "-m", envvar="HEARTH_MODEL",
        help="GGUF path, ID=PATH, 'default' (the embedded SmolLM2-135M-Instruct) or an installed "
             "catalog model (qwen2.5-coder-0.5b: `hearth models install`), loaded at start and kept "
             "loaded. Repeatable. Every other installed model is loaded when a request names it.")] = None,
    models_dir: Annotated[str | None, typer.Option(
        envvar="HEARTH_MODELS_DIR", help="Serve every *.gguf here too (its id: the file name without "
                                         ".gguf), loaded when a request names it.")] = None,
    models_max: Annotated[int, typer.Option(
        envvar="HEARTH_MODELS_MAX", help="Models in memory at once; to load another, the least recently "
                                         "used idle one is unloaded.")] = 4,
    models_ram_mb: Annotated[int, typer.Option(
        envvar="HEARTH_MODELS_RAM_MB", help="Memory the loaded models may take together (each measured when it "
                                            "loads: weights, KV, compute buffers); 0: no budget.")] = 0,
    keep_alive: Annotated[str, typer.Option(
        envvar="HEARTH_KEEP_ALIVE", help="How long an idle model stays loaded: seconds or 90s, 5m (Ollama's "
                                         "default), 1h; 0 unloads after each request; -1 (the default) "
                                         "until --models-max or --models-ram-mb needs the room (a "
                                         "request's keep_alive overrides it).")] = "-1",
    host: Annotated[str, typer.Option(envvar="HEARTH_HOST", help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(envvar="HEARTH_PORT")] = 8000,
    ctx: Annotated[int | None, typer.Option(
        envvar="HEARTH_CTX", help="Tokens per sequence (prompt + completion). Default: the model's.")] = None,
    parallel: Annotated[int, typer.Option(
        envvar="HEARTH_PARALLEL", help="Sequences decoded together (KV slots).")] = 4,
    threads: Annotated[int | None, typer.Option(envvar="HEARTH_THREADS", help="CPU threads.")] = None,
    batch: Annotated[int, typer.Option(
        envvar="HEARTH_BATCH", help="Tokens per engine step (prefill chunk budget).")] = 512,
    kv_unified: Annotated[bool, typer.Option(
        "--kv-unified/--no-kv-unified", envvar="HEARTH_KV_UNIFIED",
        help="One KV buffer shared by all sequences (default: one per sequence).")] = False,
    kv_type: Annotated[str, typer.Option(
        envvar="HEARTH_KV_TYPE",
        help="KV cache element type: f16, q8_0 (about half the bytes) or q4_0 (about a quarter).")] = "f16",
    spec_draft: Annotated[int, typer.Option(
        envvar="HEARTH_SPEC_DRAFT",
        help="Speculative decoding by prompt lookup: most tokens drafted per sequence per step (0: off).")] = 8,
    tool_parser: Annotated[str, typer.Option(
        envvar="HEARTH_TOOL_PARSER",
        help="Tool-call format: auto (from the chat template), hermes, llama3, mistral, pythonic, json.")] = "auto",
    log_level: Annotated[str, typer.Option(envvar="HEARTH_LOG_LEVEL")] = "info",
    log_format: Annotated[str, typer.Option(envvar="HEARTH_LOG_FORMAT", help="text or json.")] = "text",
    max_waiting: Annotated[int, typer.Option(
        envvar="HEARTH_MAX_WAITING", help="Requests that may queue for a slot; more get 429.")] = 64,
    max_wait: Annotated[float, typer.Option(
        envvar="HEARTH_MAX_WAIT", help="Seconds a request may queue before it gets 429.")] = 60.0,
    batch_concurrency: Annotated[int, typer.Option(
        envvar="HEARTH_BATCH_CONCURRENCY", min=1, help="Batch API lines running at once (all batches).")] = 2,
    request_timeout: Annotated[float, typer.Option(
        envvar="HEARTH_REQUEST_TIMEOUT",
        help="Default cap on a request's generation, seconds from its first token (the prompt's processing "
             "is not counted).")] = 600.0,
    max_request_timeout: Annotated[float, typer.Option(
        envvar="HEARTH_MAX_REQUEST_TIMEOUT", help="Largest per-request `timeout` allowed.")] = 3600.0,
    strict_max_tokens: Annotated[bool, typer.Option(
        "--strict-max-tokens/--no-strict-max-tokens", envvar="HEARTH_STRICT_MAX_TOKENS",
        help="Refuse a max_tokens that overflows the context with OpenAI's 400 context_length_exceeded "
             "(default: lower it to what the context leaves, as llama-server and Ollama do).")] = False,
    clamp_max_tokens: Annotated[bool | None, typer.Option(
        "--clamp-max-tokens/--no-clamp-max-tokens", envvar="HEARTH_CLAMP_MAX_TOKENS", hidden=True,
        help="Deprecated: clamping is the default; --no-clamp-max-tokens means --strict-max-tokens.")] = None,
    sse_heartbeat: Annotated[float, typer.Option(
        envvar="HEARTH_SSE_HEARTBEAT",
        help="Seconds a stream may stay silent (e.g. during a long prefill) before a heartbeat.")] = 5.0,
    repetition_detection: Annotated[bool, typer.Option(
        "--repetition-detection/--no-repetition-detection", envvar="HEARTH_REPETITION_DETECTION",
        help="Stop generations that loop (a request's repetition_detection overrides it).")] = False,
    lenient_tool_calls: Annotated[bool, typer.Option(
        "--lenient-tool-calls/--no-lenient-tool-calls", envvar="HEARTH_LENIENT_TOOL_CALLS",
        help="In auto mode, also take a tool call the model wrote as bare or fenced JSON, without its "
             "template's markers (a request's lenient_tool_calls overrides it).")] = True,
    api_key: RequireKeyOpt = None,
    api_key_file: Annotated[str | None, typer.Option(
        envvar="HEARTH_API_KEY_FILE",
        help="File with one API key per line: KEY [name=NAME] [tenant=TENANT] (docs/api.md); read again "
             "on SIGHUP or `hearth keys reload` (POST /admin/keys/reload).")] = None,
    admin_key: Annotated[str | None, typer.Option(
        envvar="HEARTH_ADMIN_KEY", help="Key needed to delete sessions and snapshots.")] = None,
    metrics_token: Annotated[str | None, typer.Option(
        envvar="HEARTH_METRICS_TOKEN", help="Bearer token that may read /metrics.")] = None,
    metrics_public: Annotated[bool, typer.Option(
        envvar="HEARTH_METRICS_PUBLIC", help="Serve /metrics without a key.")] = False,
    insecure: InsecureOpt = False,
    cors_origins: CorsOpt = "loopback",
    data_dir: Annotated[str | None, typer.Option(
        envvar="HEARTH_HOME", help="Sessions, snapshots, swapped KV and stored responses live here.")] = None,
    usage_ledger: Annotated[bool, typer.Option(
        "--usage-ledger/--no-usage-ledger", envvar="HEARTH_USAGE_LEDGER",
        help="Keep one row per request in DATA_DIR/usage.db (GET /admin/usage, hearth usage).")] = True,
    otlp_endpoint: Annotated[str | None, typer.Option(
        envvar="HEARTH_OTLP_ENDPOINT",
        help="Export OpenTelemetry traces over OTLP/HTTP to this collector (e.g. http://localhost:4318); "
             "the standard OTEL_EXPORTER_OTLP_* variables work too. Off by default.")] = None,
    journal: Annotated[bool, typer.Option(
        envvar="HEARTH_JOURNAL", help="Keep request bodies and answers (compressed, per tenant) for `hearth replay`; "
        "never logged. Off by default.")] = False,
    journal_max_age: Annotated[str, typer.Option(
        envvar="HEARTH_JOURNAL_MAX_AGE", help="How long journal records are kept (seconds, or e.g. 720h).")] = "720h",
    journal_max_mb: Annotated[int, typer.Option(
        envvar="HEARTH_JOURNAL_MAX_MB", help="Compressed journal contents kept at most; the oldest go first.")] = 1024,
    trace_content: Annotated[bool, typer.Option(
        envvar="HEARTH_TRACE_CONTENT", help="Put prompts and answers in the spans (off: counts and times only).")
    ] = False,
    session_ram_mb: Annotated[int, typer.Option(
        envvar="HEARTH_SESSION_RAM_MB",
        help="Host RAM for swapped-out session KV and paused requests' KV; more spills to disk.")] = 2048,
    prompt_cache_mb: Annotated[int, typer.Option(
        envvar="HEARTH_PROMPT_CACHE_MB",
        help="Host RAM for the prompt cache: stateless prompts' KV in blocks, shared by every prompt "
             "with the same prefix.")] = 1024,
    prompt_cache_disk_mb: Annotated[int, typer.Option(
        envvar="HEARTH_PROMPT_CACHE_DISK_MB",
        help="Disk for the prompt cache (under the data directory; survives restarts). 0: RAM only.")] = 8192,
    join: Annotated[str | None, typer.Option(
        "--join", envvar="HEARTH_JOIN", metavar="GATEWAY_URL",
        help="Join this gateway's fleet and keep the registration alive while serving; leave it on a clean "
             "shutdown (docs/gateway.md).")] = None,
    join_key: Annotated[str | None, typer.Option(
        envvar="HEARTH_JOIN_KEY", help="The gateway's join key (or its admin key), for --join.")] = None,
    advertise_url: Annotated[str | None, typer.Option(
        envvar="HEARTH_ADVERTISE_URL", help="The URL the gateway reaches this node at (default: from --host "
                                            "and --port).")] = None,
    node_name: Annotated[str | None, typer.Option(
        envvar="HEARTH_NODE_NAME", help="The name this node joins under (default: the host name).")] = None,
) -> None:
    """Serve one or more GGUF models over the OpenAI API.

    Example: hearth serve --port 8000 --parallel 8
    """
    import uvicorn

    from hearth.api.app import create_app
    from hearth.api.context import node_of
    from hearth.backends.build import build_backend, startup_models
    from hearth.config import Settings, default_data_dir, parse_duration, parse_origins
    from hearth.http.serving import GRACEFUL_SHUTDOWN_S, KEEP_ALIVE_S
    from hearth.models import resolve_model
    from hearth.observability.logging import setup_logging
    from hearth.tenants import read_key_file

    try:
        keys = required_keys(api_key)
        named = read_key_file(api_key_file) if api_key_file else []
        settings = Settings(models=model or [], models_dir=Path(models_dir).expanduser() if models_dir else None,
                            models_max=models_max, models_ram_mb=models_ram_mb,
                            keep_alive=parse_duration(keep_alive), host=host, port=port,
                            ctx=ctx, parallel=parallel,
                            threads=threads, batch=batch, kv_unified=kv_unified, kv_type=kv_type,
                            spec_draft=spec_draft, tool_parser=tool_parser, log_level=log_level,
                            log_format=log_format, max_waiting=max_waiting, max_wait=max_wait,
                            batch_concurrency=batch_concurrency,
                            request_timeout=request_timeout, max_request_timeout=max_request_timeout,
                            strict_max_tokens=strict_max_tokens or clamp_max_tokens is False,
                            sse_heartbeat=sse_heartbeat,
                            repetition_detection=repetition_detection, lenient_tool_calls=lenient_tool_calls,
                            api_keys=keys, named_keys=named,
                            api_key_file=Path(api_key_file) if api_key_file else None,
                            admin_key=admin_key, metrics_token=metrics_token,
                            metrics_public=metrics_public, insecure=insecure, session_ram_mb=session_ram_mb,
                            prompt_cache_mb=prompt_cache_mb,
                            prompt_cache_disk_mb=prompt_cache_disk_mb, cors_origins=parse_origins(cors_origins),
                            usage_ledger=usage_ledger, otlp_endpoint=otlp_endpoint, trace_content=trace_content,
                            journal=journal, journal_max_age=parse_duration(journal_max_age) or 30 * 86400.0,
                            journal_max_mb=journal_max_mb,
                            data_dir=Path(data_dir).expanduser() if data_dir else default_data_dir())
        specs = [resolve_model(m) for m in settings.models]
        ids = [s.id for s in specs]
        if len(set(ids)) != len(ids):
            raise ValueError(f"two models share an id: {ids}; name them with ID=PATH")
        joiner = None
        if join is not None:
            from hearth.cli import join as fleet

            servable = [m for group in startup_models(settings, specs) for m in group]
            joiner = fleet.Joiner(join, join_key, fleet.node_name(node_name),
                                  fleet.advertise_url(advertise_url, host, port), {
                "kind": "hearth", "models": {m: m for m in servable}, "max_in_flight": parallel,
                "api_key": keys[0] if keys else admin_key, "admin_key": admin_key})
        backend = build_backend(settings, specs)
        at_start, on_demand = startup_models(settings, specs)
    except (ValueError, OSError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e
    setup_logging(settings.log_level, settings.log_format)
    if joiner is not None:
        logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per renewal is noise
    auth = f"{len(settings.keyring)} API key(s)" if settings.keyring else "no API key"
    also = f"; loaded on request: {', '.join(on_demand)}" if on_demand else ""
    typer.echo(f"hearth {__version__}: serving {', '.join(at_start)} on http://{host}:{port} ({auth}){also}",
               err=True)
    node_app = create_app(backend, settings)
    config = uvicorn.Config(node_app, host=settings.host, port=settings.port,
                            log_level=settings.log_level.lower(), timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
                            timeout_keep_alive=KEEP_ALIVE_S, log_config=None, access_log=False)
    server = uvicorn.Server(config)
    uvicorn_exit = server.handle_exit

    def handle_exit(sig: int, frame: object) -> None:
        # uvicorn waits for open connections before the app's shutdown runs: end the runs
        # first, so streams close cleanly with their final events.
        if joiner is not None:
            joiner.stop(timeout=0)  # leave the fleet (the thread does, while the server stops)
        node_of(node_app).batches.stop()  # before the runs end: a batch line cut short is not its answer
        backend.cancel_all()
        uvicorn_exit(sig, frame)  # type: ignore[arg-type]

    server.handle_exit = handle_exit  # type: ignore[method-assign]
    if joiner is not None:
        joiner.start()
    try:
        server.run()
    finally:
        if joiner is not None:
            joiner.stop()


if __name__ == "__main__":
    app()
