"""Ollama's embedding endpoints: POST /api/embed ({"model", "input": string | [strings],
"truncate" (default true: an input past the context is cut to it; false: 400), "dimensions",
"keep_alive"} → {"model", "embeddings": [[...]], "total_duration", "load_duration",
"prompt_eval_count"}, durations in nanoseconds) and the older POST /api/embeddings
({"model", "prompt"} → {"embedding": [...]}). Errors are Ollama's `{"error": "..."}` with the
HTTP status (404 for a model the server does not have). The run is the one
hearth.api.embeddings shares with /v1/embeddings (vectors L2-normalised, as Ollama's are)."""

from __future__ import annotations

from typing import Any

from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hearth.api.embeddings import json_response, parse_input, run_embed
from hearth.api.http.run_options import keep_alive
from hearth.backends.base import EmbedRequest
from hearth.errors import BadRequest, HearthError
from hearth.http.parsing import OpenBody, read_json, validate
from hearth.observability.logging import note_error


class EmbedIn(OpenBody):
    model: str | None = None
    input: Any = None
    truncate: bool = True
    dimensions: int | None = Field(default=None, ge=1)
    keep_alive: float | str | None = None
    options: dict[str, Any] | None = None


class EmbeddingsIn(OpenBody):
    model: str | None = None
    prompt: str | None = None
    keep_alive: float | str | None = None
    options: dict[str, Any] | None = None


def _error(e: HearthError) -> JSONResponse:
    note_error(e.status, e.code, e.message)
    return JSONResponse({"error": e.message}, status_code=e.status)


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


async def embed(request: Request) -> Response:
    try:
        body = validate(EmbedIn, await read_json(request))
        if not body.model:
            raise BadRequest("model is required", param="model")
        if body.input is None:
            raise BadRequest("input is required", param="input")
        if isinstance(body.input, list) and body.input and not all(isinstance(v, str) for v in body.input):
            raise BadRequest("input must be a string or a list of strings", param="input")
        req = EmbedRequest(body.model, parse_input(body.input), truncate=body.truncate,
                           dimensions=body.dimensions, keep_alive=keep_alive(body.keep_alive))
        result = await run_embed(request, "ollama_embed", req)
    except HearthError as e:
        return _error(e)
    return json_response({"model": body.model, "embeddings": result.vectors,
                          "total_duration": _ns(result.total_seconds), "load_duration": _ns(result.load_seconds),
                          "prompt_eval_count": result.prompt_tokens})


async def embeddings(request: Request) -> Response:
    """The older endpoint: one `prompt`, one `embedding` (an empty prompt gets an empty vector,
    as Ollama answers). Longer than the context: cut to it, as Ollama's default does."""
    try:
        body = validate(EmbeddingsIn, await read_json(request))
        if not body.model:
            raise BadRequest("model is required", param="model")
        if body.prompt is None or body.prompt == "":
            return JSONResponse({"embedding": []})
        req = EmbedRequest(body.model, [body.prompt], truncate=True, keep_alive=keep_alive(body.keep_alive))
        result = await run_embed(request, "ollama_embeddings", req)
    except HearthError as e:
        return _error(e)
    return json_response({"embedding": result.vectors[0]})
