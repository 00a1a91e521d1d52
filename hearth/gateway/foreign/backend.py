"""A `Backend` over `openai`-kind upstreams (vLLM, SGLang, llama-server, llama-cpp-python's
server, Ollama): it speaks OpenAI chat / completions to them, so the node's own protocol layer
(`hearth.api`, mounted by the gateway for these models) serves Anthropic Messages and
Responses clients in front of them, tool calls and reasoning included, and keeps Responses
chains (`previous_response_id`) in the gateway's data dir.

Routing, admission and retries before the first byte are the pool's, as for Hearth nodes, and
so are the turn's ledger row and spans (foreign/turn.py: each attempt, each failover, the counts).
Once the stream is returned, a chat answer whose upstream breaks goes on on another upstream
of its alias where one can continue it (foreign/stream.py, failover/openai.py); otherwise, and for an error the
engine reports itself, it becomes `Finish(reason="error")` + `Done(error=...)`, which each
protocol's serializer turns into its own terminal error.
These engines keep no sessions: `session_kv` is None, so `session_id` is a 404
`sessions_unsupported`, as on any server without sessions.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import httpx

from hearth.backends.base import (
    Embeddings,
    EventStream,
    ModelCard,
    ModelLimits,
    ModelLoading,
    ModelStats,
    PromptCache,
    SessionKV,
)
from hearth.chat.cancel import CancelToken
from hearth.chat.types import (
    ChatRequest,
    CompletionRequest,
    Message,
)
from hearth.errors import BadRequest, HearthError, NotFound, Unavailable
from hearth.gateway.failover.openai import Continuer, Held, post_stream
from hearth.gateway.failover.retry import RETRY_STATUSES
from hearth.gateway.fleet.health import counts_as_failure
from hearth.gateway.fleet.pool import Pool
from hearth.gateway.foreign.stream import UpstreamStream
from hearth.gateway.foreign.turn import CURRENT, ForeignTurn, StreamReport
from hearth.gateway.foreign.wire import chat_json, refusal, sampling_json
from hearth.gateway.routing.affinity import Affinity
from hearth.gateway.routing.prefixes import prefix_hashes
from hearth.gateway.upstream.http import Answer, HttpxSender, Sender
from hearth.sessions.transcript import message_to_json

log = logging.getLogger("hearth.gateway")

SEQ_CTX = 131072  # what the gateway lets through; the upstream enforces its own context
NO_TOKENIZER = "token counting is not available for models served by OpenAI-compatible upstreams"


class OpenAIUpstreamBackend:
    """The backend contract over the pool's `openai`-kind nodes."""

    def __init__(self, pool: Pool, client: httpx.AsyncClient, http: Sender | None = None) -> None:
        self.pool = pool
        self.client = client
        self.http = http or HttpxSender(client)  # generation requests (the app's fast client)
        self._created = int(time.time())
        self._closing: set[asyncio.Future[None]] = set()

    def aliases(self) -> list[str]:
        """Aliases served only by openai-kind upstreams (the ones this backend answers for)."""
        return [a for a, ups in self.pool.aliases().items() if all(u.kind == "openai" for u in ups)]

    # lifecycle
    @property
    def ready(self) -> bool:
        return True

    @property
    def load_error(self) -> str | None:
        return None

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def cancel_all(self) -> None:
        return None

    # models
    def models(self) -> list[ModelCard]:
        return [ModelCard(a, self._created, "hearth-gateway") for a in self.aliases()]

    def resolve(self, model: str | None) -> str:
        aliases = self.aliases()
        if model in aliases:
            return str(model)
        if not model and aliases:
            return aliases[0]
        raise NotFound(f"The model {model!r} does not exist", param="model", code="model_not_found")

    def limits(self, model: str | None) -> ModelLimits:
        alias = self.resolve(model)
        parallel = sum(u.max_in_flight for u in self.pool.aliases()[alias])
        return ModelLimits(SEQ_CTX, max(1, parallel))

    # generation
    async def chat(self, req: ChatRequest) -> EventStream:
        alias = self.resolve(req.model)
        hashes = prefix_hashes(alias, [message_to_json(m) for m in req.messages])

        def body(model: str) -> dict[str, Any]:
            return chat_json(req, model)

        # One answer per request can go on elsewhere (failover/openai.py); n > 1 cannot.
        turn = CURRENT.get()
        go_on = Continuer(self.pool, self.http, alias, body, hashes, req.continue_final,
                          watch=turn.watch if turn is not None else None) \
            if req.n == 1 and self.pool.settings.migration_limit else None
        return await self._open(alias, "/v1/chat/completions", body, hashes, completion=False, cancel=req.cancel,
                                timeout=req.timeout, choices=req.n, go_on=go_on)

    async def complete(self, req: CompletionRequest) -> EventStream:
        if not isinstance(req.prompt, str):
            raise BadRequest("token-id prompts are not supported for models served by OpenAI-compatible upstreams",
                             param="prompt")
        alias = self.resolve(req.model)
        prompt = req.prompt
        hashes = prefix_hashes(alias, [{"prompt": prompt}])
        return await self._open(alias, "/v1/completions",
                                lambda model: {"model": model, "prompt": prompt, "stream": True,
                                               "stream_options": {"include_usage": True}, **sampling_json(req)},
                                hashes, completion=True, cancel=req.cancel, timeout=req.timeout, choices=req.n)

    async def _open(self, alias: str, path: str, body: Callable[[str], dict[str, Any]],
                    hashes: list[tuple[str, int]], completion: bool, cancel: CancelToken | None,
                    timeout: float | None, choices: int, go_on: Continuer | None = None) -> EventStream:
        """Retry before the first byte, as for Hearth nodes; then stream. The turn watched
        (foreign/turn.py), if any, is told of each attempt and of a refusal."""
        turn = CURRENT.get()
        try:
            return await self._attempts(alias, path, body, hashes, completion, cancel or CancelToken(), timeout,
                                        choices, go_on, turn)
        except HearthError as e:
            if turn is not None:
                turn.failed(e.message)
            raise

    async def _attempts(self, alias: str, path: str, body: Callable[[str], dict[str, Any]],
                        hashes: list[tuple[str, int]], completion: bool, cancel: CancelToken,
                        timeout: float | None, choices: int, go_on: Continuer | None,
                        turn: ForeignTurn | None) -> EventStream:
        tried: set[str] = set()
        last = "no upstream could take the request"
        watch = turn.watch if turn is not None else None
        for _ in range(len(self.pool.nodes)):
            since = time.monotonic()
            lease = await self.pool.acquire(alias, Affinity("none"), hashes, hashes[-1][1] if hashes else 1, tried)
            node = lease.node
            tried.add(node.name)
            if watch is not None:
                watch.routed(lease, since)
            try:
                resp = await post_stream(self.http, self.pool, node, path, body(node.up.models[alias]),
                                         watch.sending(node.name) if watch is not None else None)
            except httpx.TransportError as e:
                self.pool.release(lease, False)
                last = f"{node.name}: {type(e).__name__}"
                self.pool.metrics.retries.labels("connect").inc()
                if watch is not None:
                    watch.retried(node.name, last)
                continue
            except BaseException:
                self.pool.release(lease, None)
                raise
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                await resp.aclose()
                if resp.status_code in RETRY_STATUSES:
                    self.pool.release(lease, False if counts_as_failure(resp.status_code) else None)
                    last = f"{node.name} answered {resp.status_code}"
                    self.pool.metrics.retries.labels(f"status_{resp.status_code}").inc()
                    if watch is not None:
                        watch.retried(node.name, last)
                    continue
                self.pool.release(lease, False if counts_as_failure(resp.status_code) else None)
                raise refusal(resp.status_code, text)
            node.prefixes.add(hashes)
            held = Held(self.pool, lease)  # released by the EventStream's close, even if it never starts
            if go_on is not None:
                go_on.tried.add(node.name)
            stream = UpstreamStream(self.pool, held, completion, cancel, timeout, choices, go_on,
                                    self._spawn_close, watch)
            events = EventStream(stream.events(resp), on_close=[held.close])
            if turn is not None:  # its counts and how it ended, to the turn's ledger row and spans
                report = turn.stream()
                events.observe(report)
                events.on_close(functools.partial(_closed, report, stream, cancel))
            return events
        raise Unavailable(f"every upstream failed: {last}", code="upstream_failed", retry_after=2)

    def _spawn_close(self, resp: Answer) -> None:
        task = asyncio.ensure_future(resp.aclose())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    # tokens: these engines' tokenizers are not reachable through the OpenAI API
    async def tokenize(self, model: str | None, text: str, *, add_special: bool = True) -> list[int]:
        raise BadRequest(NO_TOKENIZER)

    async def tokenize_chat(self, model: str | None, messages: list[Message]) -> list[int]:
        raise BadRequest(NO_TOKENIZER)

    async def tokenize_prompt(self, req: ChatRequest) -> list[int]:
        raise BadRequest(NO_TOKENIZER)

    async def token_pieces(self, model: str | None, tokens: list[int]) -> list[str]:
        raise BadRequest(NO_TOKENIZER)

    async def detokenize(self, model: str | None, tokens: list[int]) -> str:
        raise BadRequest(NO_TOKENIZER)

    def stats(self) -> dict[str, ModelStats]:
        return {}

    @property
    def session_kv(self) -> SessionKV | None:
        return None

    @property
    def prompt_cache(self) -> PromptCache | None:
        return None  # the engine behind keeps its own cache, if any

    @property
    def model_loading(self) -> ModelLoading | None:
        return None  # the engines behind load their own models

    @property
    def embeddings(self) -> Embeddings | None:
        return None  # not through this backend: the gateway routes /v1/embeddings to a node over HTTP


def _closed(report: StreamReport, stream: UpstreamStream, cancel: CancelToken) -> None:
    """A stream's close, to its turn: what it produced (all of it when it closed before its end)."""
    report.closed(stream.account.done().usage, cancel.reason)
