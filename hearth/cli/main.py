"""`hearth` command line."""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

from hearth import __version__

app = typer.Typer(help="Hearth: an LLM server that keeps conversations warm.", no_args_is_help=True,
                  add_completion=False)


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
        help="GGUF path, ID=PATH, or 'default' (the embedded SmolLM2-135M-Instruct). Repeatable.")] = None,
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
        help="One KV buffer shared by all sequences.")] = True,
    log_level: Annotated[str, typer.Option(envvar="HEARTH_LOG_LEVEL")] = "info",
) -> None:
    """Serve one or more GGUF models over the OpenAI API.

    Example: hearth serve --port 8000 --parallel 8
    """
    import uvicorn

    from hearth.api.app import create_app
    from hearth.backends.local import EngineSettings, LocalBackend
    from hearth.config import Settings
    from hearth.models import resolve_model

    try:
        settings = Settings(models=model or ["default"], host=host, port=port, ctx=ctx, parallel=parallel,
                            threads=threads, batch=batch, kv_unified=kv_unified, log_level=log_level)
        specs = [resolve_model(m) for m in settings.models]
    except (ValueError, FileNotFoundError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e
    ids = [s.id for s in specs]
    if len(set(ids)) != len(ids):
        typer.echo(f"error: two models share an id: {ids}; name them with ID=PATH", err=True)
        raise typer.Exit(2)
    logging.basicConfig(level=settings.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    backend = LocalBackend(specs, EngineSettings(ctx=settings.ctx, parallel=settings.parallel,
                                                 threads=settings.threads, batch=settings.batch,
                                                 kv_unified=settings.kv_unified))
    typer.echo(f"hearth {__version__}: serving {', '.join(ids)} on http://{host}:{port}", err=True)
    uvicorn.run(create_app(backend), host=settings.host, port=settings.port,
                log_level=settings.log_level.lower(), timeout_graceful_shutdown=5)


if __name__ == "__main__":
    app()
