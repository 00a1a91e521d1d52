"""POST /v1/prompt-cache/blocks: a generation request's prompt-cache blocks, for a router.

The body is `{"path": <a generation path>, "body": <that request's body>}`. The inner body is
read by the protocol's own reader, the one generation uses (`read_chat`, `read_messages`,
`read_response`, `read_completion`), and tokenized as generation would (the backend's
`tokenize_prompt`: template, tools, system placement; `tokenize` for a completion prompt),
on the backend's tokenizer pool, never the engine thread. So the blocks are exactly those the
request's prompt would be cached under, and a body generation refuses is refused here with
the same 4xx, in the inner path's protocol envelope.

Only the body is read: a session's transcript (`session_id`) is not prepended, and a
completion with several prompts answers for its first. The answer is the prompt's full blocks
(`PromptBlocks`); a node keys blocks per model, so a router asks one node per chain `root`.
"""

from __future__ import annotations

from typing import Any, Literal

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hearth.api.anthropic.messages import read_messages
from hearth.api.context import NodeContext, node
from hearth.api.openai.chat import read_chat
from hearth.api.openai.completions import read_completion
from hearth.api.openai.responses import read_response
from hearth.api.openai.responses_store import ScopedResponses
from hearth.backends.base import require_prompt_cache
from hearth.errors import HearthError
from hearth.fleet_protocol import BlocksAnswer
from hearth.http.auth import caller
from hearth.http.errors import ApiError, protocol_of, respond
from hearth.http.parsing import OpenBody, read_json, validate
from hearth.tenants import OPEN, Caller

PATHS = {"/v1/chat/completions": "chat", "/chat/completions": "chat", "/v1/messages": "messages",
         "/v1/responses": "responses", "/responses": "responses", "/v1/completions": "completions",
         "/completions": "completions"}


class BlocksIn(OpenBody):
    path: Literal["/v1/chat/completions", "/chat/completions", "/v1/messages", "/v1/responses", "/responses",
                  "/v1/completions", "/completions"]
    body: dict[str, Any]


async def prompt_of(ctx: NodeContext, path: str, data: dict[str, Any], who: Caller = OPEN
                    ) -> tuple[str | None, list[int]]:
    """(the model asked for, the prompt's tokens) of a generation request to `path`."""
    backend, kind = ctx.backend, PATHS[path]
    if kind == "completions":
        body, prompts = read_completion(data)
        first = prompts[0]
        if isinstance(first, str):
            return body.model, await backend.tokenize(body.model, first, add_special=True)
        return body.model, first
    if kind == "chat":
        creq = read_chat(data, "blocks", ctx.settings)[1]
    elif kind == "messages":
        creq = read_messages(data, "blocks", ctx.settings)[1]
    else:
        creq = read_response(data, ScopedResponses(ctx.responses, who), "blocks", ctx.settings).creq
    return creq.model, await backend.tokenize_prompt(creq)


async def blocks(request: Request) -> Response:
    ctx = node(request)
    outer = validate(BlocksIn, await read_json(request))
    cache = require_prompt_cache(ctx.backend)
    try:
        who = caller(request)
        model, tokens = await prompt_of(ctx, outer.path, outer.body, who)
        salt = outer.body.get("cache_salt")  # checked as generation checks it, by prompt_of
        found = await cache.cache_blocks(model, tokens, who.namespace(salt if isinstance(salt, str) else None))
    except HearthError as e:  # what generation would answer, in the inner path's envelope
        return respond(outer.path, ApiError.of(e, protocol_of(outer.path)))
    answer = BlocksAnswer(object="prompt_cache.blocks", model=found.model, root=found.root,
                          block_tokens=found.block_tokens, n_tokens=found.n_tokens, blocks=found.blocks,
                          tails=found.tails)
    return JSONResponse(answer)
