"""GET /api/tags, POST /api/show, GET /api/ps, GET /api/version: what a node serves, in Ollama's shapes.

Facts come from the backend's model cards and, where a card names its GGUF file, from the
file's header (read once per file version, no load needed). Decisions:
- `digest`: a catalog model's is its file's SHA-256 (the catalog's); another file's is the
  SHA-256 of its path, size and modification time (hashing a multi-GB file per listing costs
  seconds; this one changes whenever the file does).
- `size_vram` is 0: Hearth runs on the CPU.
- `/api/version` answers the Ollama API version this module follows (clients gate features on
  it), with Hearth's own version beside it.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hearth import catalog, gguf
from hearth.api.context import node
from hearth.backends.base import ModelCard
from hearth.errors import BadRequest
from hearth.http.parsing import OpenBody, read_json, validate
from hearth.protocols import ollama_names as names
from hearth.protocols.ollama_wire import OLLAMA_API_VERSION, hearth_version

EMBEDDING_ARCHS = ("bert", "nomic-bert", "jina-bert-v2", "nomic-bert-moe")

_headers: dict[tuple[str, int], dict[str, Any]] = {}


def header(path: Path) -> dict[str, Any]:
    """The GGUF header of `path` (arrays as counts), cached per modification time; {} if unreadable."""
    try:
        key = (str(path), path.stat().st_mtime_ns)
    except OSError:
        return {}
    got = _headers.get(key)
    if got is None:
        try:
            got = gguf.read_metadata(path)
        except (gguf.GGUFError, OSError, ValueError):
            got = {}
        _headers[key] = got
    return got


def _path(card: ModelCard) -> Path | None:
    p = card.meta.get("path")
    return Path(p) if isinstance(p, str) and p else None


def digest(path: Path | None, model_id: str) -> str:
    for m in catalog.CATALOG.values():
        if path is not None and path == catalog.installed_path(m):
            return m.sha256
    try:
        st = path.stat() if path is not None else None
    except OSError:
        st = None
    ident = f"{path}\0{st.st_size}\0{st.st_mtime_ns}" if st is not None else model_id
    return hashlib.sha256(ident.encode()).hexdigest()


def parameter_size(meta: dict[str, Any], card: ModelCard) -> str:
    label = meta.get("general.size_label")
    if isinstance(label, str) and label:
        return label
    n = card.meta.get("n_params") or meta.get("general.parameter_count")
    if not isinstance(n, int) or n <= 0:
        return ""
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


def details(card: ModelCard, meta: dict[str, Any]) -> dict[str, Any]:
    arch = meta.get("general.architecture") or card.meta.get("architecture") or ""
    quant = gguf.quantization(meta) if meta else str(card.meta.get("quantization") or "")
    return {"parent_model": "", "format": "gguf", "family": arch, "families": [arch] if arch else [],
            "parameter_size": parameter_size(meta, card), "quantization_level": "" if quant == "?" else quant}


def capabilities(meta: dict[str, Any]) -> list[str]:
    arch = meta.get("general.architecture")
    template = meta.get("tokenizer.chat_template")
    template = template if isinstance(template, str) else ""
    if arch in EMBEDDING_ARCHS or (f"{arch}.pooling_type" in meta and not template):
        return ["embedding"]
    out = ["completion"]
    if "tools" in template:
        out.append("tools")
    if "think" in template or "reasoning" in template:
        out.append("thinking")
    return out


def _modified(card: ModelCard, path: Path | None) -> str:
    try:
        return names.from_epoch(path.stat().st_mtime) if path is not None else names.from_epoch(card.created)
    except OSError:
        return names.from_epoch(card.created)


def _size(card: ModelCard, path: Path | None) -> int:
    """The file's size, as Ollama lists a model's (a loaded card's size_bytes counts tensors only)."""
    try:
        if path is not None:
            return path.stat().st_size
    except OSError:
        pass
    size = card.meta.get("size_bytes")
    return size if isinstance(size, int) else 0


def entry(card: ModelCard) -> dict[str, Any]:
    """A model as /api/tags lists it."""
    path = _path(card)
    meta = header(path) if path is not None else {}
    name = names.tagged(card.id)
    return {"name": name, "model": name, "modified_at": _modified(card, path), "size": _size(card, path),
            "digest": digest(path, card.id), "details": details(card, meta)}


async def tags(request: Request) -> Response:
    backend = node(request).backend
    backend.resolve(None)  # 503 while the server starts, as /v1/models
    return JSONResponse({"models": [entry(c) for c in backend.models()]})


def _expires_at(card: ModelCard, default_keep_alive: float) -> str:
    status = card.status or {}
    now = datetime.now(UTC)
    if status.get("pinned"):
        return names.timestamp(now + names.FOREVER)
    left = status.get("expires_in")
    seconds = float(left) if isinstance(left, int | float) else default_keep_alive  # in use: its keep-alive after
    if seconds == float("inf"):
        return names.timestamp(now + names.FOREVER)
    return names.timestamp(now + timedelta(seconds=seconds))


async def ps(request: Request) -> Response:
    ctx = node(request)
    ctx.backend.resolve(None)
    out = []
    for card in ctx.backend.models():
        status = card.status
        if status is not None and status.get("value") != "loaded":
            continue
        item = entry(card)
        loaded = (status or {}).get("loaded_bytes")
        item |= {"size": loaded if isinstance(loaded, int) and loaded > 0 else item["size"],
                 "expires_at": _expires_at(card, ctx.settings.keep_alive), "size_vram": 0,
                 "context_length": card.meta.get("n_ctx") or 0}
        out.append(item)
    return JSONResponse({"models": out})


class ShowIn(OpenBody):
    model: str | None = Field(default=None, min_length=1, max_length=1024)
    name: str | None = Field(default=None, min_length=1, max_length=1024)  # the older name of the field
    verbose: bool = False


def model_info(meta: dict[str, Any], verbose: bool) -> dict[str, Any]:
    """The header's keys as Ollama shows them: arrays as null unless `verbose` asked (Hearth
    keeps only their length then), the template under `template` instead."""
    out: dict[str, Any] = {}
    for k, v in meta.items():
        if k == "tokenizer.chat_template" or k == "GGUF.version":
            continue
        out[k] = (v["array_of"] if verbose else None) if isinstance(v, dict) else v
    return out


async def show(request: Request) -> Response:
    backend = node(request).backend
    body = validate(ShowIn, await read_json(request))
    name = body.model or body.name
    if not name:
        raise BadRequest("model is required", param="model")
    model_id = names.resolve(backend, name)
    card = next(c for c in backend.models() if c.id == model_id)
    path = _path(card)
    meta = header(path) if path is not None else {}
    template = meta.get("tokenizer.chat_template")
    return JSONResponse({
        "license": "", "modelfile": f"# Served by Hearth\nFROM {path or model_id}\n", "parameters": "",
        "template": template if isinstance(template, str) else "",
        "details": details(card, meta), "model_info": model_info(meta, body.verbose),
        "capabilities": capabilities(meta), "modified_at": _modified(card, path),
    })


async def version(request: Request) -> Response:
    return JSONResponse({"version": OLLAMA_API_VERSION, "hearth": hearth_version()})

