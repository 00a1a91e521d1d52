"""Models, health, tokenizer endpoints and metrics.

/tokenize with `messages` is a chat request that stops before generating: the body (less the
tokenize fields) is read as a Chat Completions body and turned into the same ChatRequest, so
tools, tool_choice, reasoning_effort and chat_template_kwargs shape the prompt exactly as they
do in chat, and its count is chat's `prompt_tokens`.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hearth.api.context import node
from hearth.api.openai.chat import ChatCompletionIn, ToolIn, to_chat_request
from hearth.api.openai.messages import MessageIn
from hearth.backends.base import ModelCard
from hearth.errors import BadRequest
from hearth.http.auth import caller
from hearth.http.parsing import OpenBody, read_json, validate
from hearth.observability.logging import note_error


def _card(c: ModelCard) -> dict[str, Any]:
    out = {"id": c.id, "object": "model", "created": c.created, "owned_by": c.owned_by, "meta": c.meta}
    if c.status is not None:
        out["status"] = c.status
    return out


async def list_models(request: Request) -> Response:
    backend = node(request).backend
    backend.resolve(None)  # 503 when the start-up load failed
    return JSONResponse({"object": "list", "data": [_card(c) for c in backend.models()]})


async def get_model(request: Request) -> Response:
    backend = node(request).backend
    model_id = backend.resolve(request.path_params["model"])
    card = next(c for c in backend.models() if c.id == model_id)
    return JSONResponse(_card(card))


async def metrics(request: Request) -> Response:
    return Response(node(request).metrics.render(), media_type="text/plain; version=0.0.4")


async def health(request: Request) -> Response:
    backend = node(request).backend
    if backend.ready:
        return JSONResponse({"status": "ok"})
    error = backend.load_error
    if error:
        note_error(503, "model_load_failed", error)
        return JSONResponse({"status": "error", "error": error}, status_code=503)
    note_error(503, "model_loading", "the model is still loading")
    return JSONResponse({"status": "loading"}, status_code=503)


class TokenizeIn(OpenBody):
    model: str | None = None
    content: str | None = None
    prompt: str | None = None  # vLLM's name for content
    messages: list[MessageIn] | None = None
    # with messages, these and every other Chat Completions field shape the prompt as in chat
    tools: list[ToolIn] | None = None
    tool_choice: str | dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_special: bool = True
    with_pieces: bool = False


TOKENIZE_ONLY = ("content", "prompt", "add_special", "with_pieces")


class DetokenizeIn(OpenBody):
    model: str | None = None
    tokens: list[int] = Field(max_length=1_000_000)


async def tokenize(request: Request) -> Response:
    backend = node(request).backend
    data = await read_json(request)
    body = validate(TokenizeIn, data)
    text = body.content if body.content is not None else body.prompt
    if body.messages is not None:
        if text is not None:
            raise BadRequest("give either content or messages, not both")
        chat = validate(ChatCompletionIn, {k: v for k, v in data.items() if k not in TOKENIZE_ONLY})
        tokens = await backend.tokenize_prompt(to_chat_request(chat, "tokenize"))
    elif text is not None:
        tokens = await backend.tokenize(body.model, text, add_special=body.add_special)
    else:
        raise BadRequest("content (a string) or messages is required", param="content")
    out: dict[str, Any] = {"tokens": tokens, "count": len(tokens)}
    if body.with_pieces:
        out["tokens"] = [{"id": t, "piece": p}
                         for t, p in zip(tokens, await backend.token_pieces(body.model, tokens), strict=True)]
    return JSONResponse(out)


async def detokenize(request: Request) -> Response:
    backend = node(request).backend
    body = validate(DetokenizeIn, await read_json(request))
    return JSONResponse({"content": await backend.detokenize(body.model, body.tokens)})


class CancelIn(OpenBody):
    cancel_id: str | None = Field(default=None, min_length=1, max_length=256)
    session_id: str | None = Field(default=None, min_length=1, max_length=256)
    completion_id: str | None = Field(default=None, min_length=1, max_length=256)
    response_id: str | None = Field(default=None, min_length=1, max_length=256)
    message_id: str | None = Field(default=None, min_length=1, max_length=256)


async def cancel(request: Request) -> Response:
    """Stop in-flight runs. A cancel_id is matched alone (and remembered for 30 s if its run has
    not registered yet); otherwise every run named by session or id is cancelled."""
    body = validate(CancelIn, await read_json(request))
    ids = [i for i in (body.completion_id, body.response_id, body.message_id) if i]
    if body.cancel_id is None and body.session_id is None and not ids:
        raise BadRequest("name what to cancel: cancel_id, session_id, completion_id, response_id or message_id")
    who = caller(request)
    sid = who.session_key(body.session_id) if body.session_id is not None else None  # as runs register it
    n = node(request).cancels.cancel(cancel_id=body.cancel_id, session_id=sid, ids=ids, scope=who.scope)
    return JSONResponse({"cancelled": n})
