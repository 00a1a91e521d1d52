"""POST /v1/embeddings (OpenAI's shape), and the run every embeddings endpoint shares (Ollama's
/api/embed and /api/embeddings are hearth.api.ollama.embed).

`input` is a string, a list of strings, a list of token ids, or a list of lists of ids, as
OpenAI's API takes it; `encoding_format` "float" (lists of numbers) or "base64" (the vector's
little-endian float32 bytes, base64: what the openai SDK asks for by default and decodes);
`dimensions` only where the model allows it (hearth.backends.local.embedding). An input longer
than the model's context is a 400 `context_length_exceeded`, as OpenAI answers.

The backend is held while the inputs are embedded; the client leaving cancels the work (the
engine drops the inputs it has not decoded yet).
"""

from __future__ import annotations

import base64
import time
from typing import Any, Literal

import numpy as np
from pydantic import Field
from starlette.requests import Request
from starlette.responses import Response

from hearth.api.context import node
from hearth.api.http.runs import time_cap
from hearth.api.http.usage_tap import record_embedding
from hearth.backends.base import EmbedRequest, EmbedResult, require_embeddings
from hearth.chat.cancel import CancelToken
from hearth.errors import BadRequest
from hearth.http.auth import caller
from hearth.http.parsing import OpenBody, read_json, validate
from hearth.http.sse import json_bytes, until_disconnect

MAX_INPUTS = 2048  # OpenAI's cap on the inputs of one request

Inputs = list[str | list[int]]


class EmbeddingsIn(OpenBody):
    model: str | None = None
    input: Any = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None


def parse_input(value: Any, param: str = "input") -> Inputs:
    """OpenAI's four shapes of `input` as a list of texts or token lists; BadRequest otherwise."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        raise BadRequest(f"{param} must be a string, a list of strings, a list of token ids or a list of "
                         "lists of token ids, and not empty", param=param)
    if len(value) > MAX_INPUTS:
        raise BadRequest(f"{param} has {len(value)} items; at most {MAX_INPUTS} per request", param=param)
    if all(isinstance(v, str) for v in value):
        return list(value)
    if all(_is_id(v) for v in value):
        return [list(value)]
    if all(isinstance(v, list) and v and all(_is_id(t) for t in v) for v in value):
        return [list(v) for v in value]
    raise BadRequest(f"{param} must be a string, a list of strings, a list of token ids or a list of non-empty "
                     "lists of token ids (not a mix)", param=param)


def _is_id(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


async def run_embed(request: Request, endpoint: str, req: EmbedRequest) -> EmbedResult:
    """The backend's vectors for `req`, cancelled if the client leaves; timed for /metrics."""
    ctx = node(request)
    embeddings = require_embeddings(ctx.backend)
    token = CancelToken()
    arrived = time.monotonic()
    full = EmbedRequest(req.model, req.inputs, req.truncate, req.dimensions, req.keep_alive,
                        time_cap(ctx.settings, None), token, req.request_id)
    try:
        result = await until_disconnect(request, lambda: embeddings.embed(full), lambda: token.cancel("disconnect"))
    except BaseException:
        if token.reason is not None:
            ctx.metrics.cancellations.labels(token.reason).inc()
        raise
    ctx.metrics.e2e.labels(endpoint).observe(time.monotonic() - arrived)
    ctx.metrics.embedded_inputs.labels(endpoint).inc(len(result.vectors))
    ctx.metrics.embedded_tokens.labels(endpoint).inc(result.prompt_tokens)
    if ctx.ledger is not None or ctx.tracing is not None:
        record_embedding(ctx.ledger, ctx.tracing, caller(request), endpoint, result.model, req.request_id or "",
                         result.prompt_tokens, arrived, request.headers.get("traceparent"))
    return result


def encode_base64(vector: list[float]) -> str:
    """OpenAI's base64 encoding: the float32 values' little-endian bytes."""
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


async def embeddings(request: Request) -> Response:
    body = validate(EmbeddingsIn, await read_json(request))
    if body.input is None:
        raise BadRequest("input is required", param="input")
    inputs = parse_input(body.input)
    result = await run_embed(request, "embeddings", EmbedRequest(body.model, inputs, dimensions=body.dimensions))
    b64 = body.encoding_format == "base64"
    data = [{"object": "embedding", "index": i, "embedding": encode_base64(v) if b64 else v}
            for i, v in enumerate(result.vectors)]
    return json_response({"object": "list", "data": data, "model": result.model,
                          "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens}})


def json_response(body: dict[str, Any]) -> Response:
    """A 200 JSON answer encoded by orjson: the vectors are most of it, and the stdlib's float
    repr took ~0.14 ms per 384-value vector on the event loop (orjson: ~0.007 ms), a 36 ms stall
    for a 256-input request. The numbers are the same shortest round-trip reprs."""
    return Response(json_bytes(body), media_type="application/json")
