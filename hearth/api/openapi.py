"""`GET /openapi.json`: an OpenAPI 3.1 document for every route, built from the models the
handlers validate requests with and the answer models next to each protocol (`hearth.api.wire`
lists them and says why they are models while the handlers build dicts).

One table, `hearth.api.operations.OPERATIONS`, says per route what it takes and what it answers
(status → shape). A test checks that every route of the app is in it, and the schema fuzzer
checks real answers against the document. Errors are documented in the envelope of the route's
protocol: Anthropic's on /v1/messages*, Ollama's on /api/*, OpenAI's everywhere else, and either
on /v1/prompt-cache/blocks (it answers in the envelope of the generation path its body names).
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hearth.api import web
from hearth.api.anthropic import wire as anthropic_wire
from hearth.api.ollama import wire as ollama_wire
from hearth.api.openai import wire as openai_wire
from hearth.api.operations import OPERATIONS, Operation
from hearth.api.wire import control

# POST /v1/files: OpenAI's multipart upload of a batch's JSONL
UPLOAD_FORM = {"type": "object", "required": ["file", "purpose"], "properties": {
    "file": {"type": "string", "format": "binary", "description": "The JSONL: one request a line"},
    "purpose": {"type": "string", "enum": ["batch"]}}}

ERROR_TEXT = {400: "Invalid request", 401: "Missing or invalid API key", 403: "Needs the admin key",
              404: "Not found", 409: "Conflict (busy session, existing id, incompatible snapshot)",
              413: "Body larger than the limit", 422: "Corrupt snapshot or archive",
              429: "Too many requests waiting (see Retry-After)", 500: "Generation failed in the engine",
              410: "No longer kept (a background response's events)",
              503: "Model loading or server shutting down"}

PARAM_SCHEMAS: dict[str, dict[str, Any]] = {"name": {"type": "string", "enum": sorted(web.FILES)},
                                            "limit": {"type": "integer", "minimum": 1, "maximum": 100_000},
                                            "stream": {"type": "boolean"},
                                            "starting_after": {"type": "integer", "minimum": 0}}


def openapi_path(route_path: str) -> str:
    return re.sub(r"\{(\w+):\w+\}", r"{\1}", route_path)


Refs = dict[type[BaseModel], dict[str, Any]]
# One server-sent event (each `data` is a JSON chunk of the protocol's stream, or [DONE]).
SSE_EVENT = {"type": "object", "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
             "required": ["data"]}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _ok(op: Operation, ref: Refs) -> dict[str, Any]:
    if op.ok is None:  # this document
        return {"description": "OpenAPI 3.1 document", "content": _json({"type": "object"})}
    if isinstance(op.ok, type):
        content = _json(ref[op.ok])
        if op.streams and op.ollama:  # one JSON object a line
            content["application/x-ndjson"] = {"schema": {"type": "string"}}
            return {"description": "NDJSON unless stream is false", "content": content}
        if op.streams:
            content["text/event-stream"] = {"schema": SSE_EVENT}
        return {"description": "Server-sent events when stream is true" if op.streams else "OK", "content": content}
    if op.ok == "empty":
        return {"description": "Done (no body)"}
    media = {"tar": "application/x-tar", "text": "text/plain", "html": "text/html", "jsonl": "application/jsonl"}
    if op.ok == "static":
        return {"description": "The file", "content": {
            t: {"schema": {"type": "string"}} for t in ("text/html", "text/javascript", "text/css")}}
    schema = {"type": "string", "format": "binary"} if op.ok == "tar" else {"type": "string"}
    return {"description": "OK", "content": {media[op.ok]: {"schema": schema}}}


def _operation(op: Operation, ref: Refs) -> dict[str, Any]:
    envelope = anthropic_wire.AnthropicError if op.anthropic else ollama_wire.OllamaError if op.ollama else None
    error = ref[envelope or openai_wire.OpenAIError]
    if op.either_envelope:
        error = {"anyOf": [ref[openai_wire.OpenAIError], ref[anthropic_wire.AnthropicError]]}
    responses: dict[str, Any] = {str(op.status): _ok(op, ref)}
    for code in op.errors:
        responses[str(code)] = {"description": ERROR_TEXT[code], "content": _json(error)}
    if op.path == "/health":
        responses["503"] = {"description": "Loading, or the model failed to load",
                            "content": _json(ref[control.Health])}
    if op.ok in ("html", "static"):
        responses["304"] = {"description": "Not modified (If-None-Match)"}
    out: dict[str, Any] = {"summary": op.summary, "tags": [op.tag], "responses": responses,
                           "operationId": f"{op.method.lower()}_{re.sub(r'[^A-Za-z0-9]+', '_', op.path).strip('_')}"}
    parameters = [{"name": name, "in": "path", "required": True, "description": text,
                   "schema": PARAM_SCHEMAS.get(name, {"type": "string"})} for name, text in op.params.items()]
    parameters += [{"name": name, "in": "query", "required": False, "description": text,
                    "schema": PARAM_SCHEMAS.get(name, {"type": "string"})} for name, text in op.query.items()]
    if parameters:
        out["parameters"] = parameters
    if op.body == "multipart":
        out["requestBody"] = {"required": True, "content": {"multipart/form-data": {"schema": UPLOAD_FORM}}}
    elif op.body == "tar":
        out["requestBody"] = {"required": True, "content": {
            "application/x-tar": {"schema": {"type": "string", "format": "binary"}}}}
    elif op.body is not None:
        out["requestBody"] = {"required": op.body_required, "content": _json(ref[op.body])}
    return out


@cache
def document() -> dict[str, Any]:
    requests = {op.body for op in OPERATIONS if isinstance(op.body, type)}
    responses = {op.ok for op in OPERATIONS if isinstance(op.ok, type)}
    responses |= {openai_wire.OpenAIError, anthropic_wire.AnthropicError, ollama_wire.OllamaError, control.Health}
    models: list[tuple[type[BaseModel], JsonSchemaMode]] = [
        *((m, "validation") for m in sorted(requests, key=lambda m: m.__name__)),
        *((m, "serialization") for m in sorted(responses, key=lambda m: m.__name__))]
    schemas, defs = models_json_schema(models, ref_template="#/components/schemas/{model}")
    ref: Refs = {model: schema for (model, _), schema in schemas.items() if issubclass(model, BaseModel)}
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        paths.setdefault(openapi_path(op.path), {})[op.method.lower()] = _operation(op, ref)
    from hearth import __version__

    return {
        "openapi": "3.1.0",
        "info": {"title": "Hearth", "version": __version__,
                 "description": "OpenAI Chat Completions, Responses and Completions, Anthropic Messages, and "
                                "Hearth's sessions, snapshots and prompt cache, over llama.cpp."},
        "paths": paths,
        "components": {
            "schemas": defs.get("$defs", {}),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"},
                                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"}},
        },
        "security": [{"bearer": []}, {"apiKey": []}, {}],
    }


async def openapi_json(request: Request) -> Response:
    return JSONResponse(document())
