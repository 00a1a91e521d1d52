"""`hearth models`: the models available on this machine, read from their GGUF headers."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from hearth.cli import gguf
from hearth.cli.client import CLIError
from hearth.cli.common import JsonOpt, cli_errors, console, human_bytes, print_json
from hearth.models import DEFAULT_ALIASES, resolve_model


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


@cli_errors
def models(
    model: Annotated[list[str] | None, typer.Option(
        "--model", "-m", envvar="HEARTH_MODEL",
        help="Also list this GGUF path (or ID=PATH), as `serve --model` takes it. Repeatable.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List the models available locally, with size, quantization and context length.

    The embedded default and the GGUF files you name; the facts come from each GGUF header, so
    nothing is loaded.

    Example: hearth models --model ~/models/qwen2.5-0.5b-instruct-q4_k_m.gguf
    """
    names = ["default", *[m for m in (model or []) if m not in DEFAULT_ALIASES]]
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
