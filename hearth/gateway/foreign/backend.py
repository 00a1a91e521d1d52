"""A `Backend` over `openai`-kind upstreams (vLLM, SGLang, llama-server, llama-cpp-python's
server, Ollama): it speaks OpenAI chat / completions to them, so the node's own protocol layer
(`hearth.api`, mounted by the gateway for these models) serves Anthropic Messages and
Responses clients in front of them, tool calls and reasoning included, and keeps Responses
chains (`previous_response_id`) in the gateway's data dir.

Routing, admission and retries before the first byte are the pool's, as for Hearth nodes.
Once the stream is returned, a chat answer whose upstream breaks goes on on another upstream
of its alias where one can continue it (failover/openai.py); otherwise, and for an error the
engine reports itself, it becomes `Finish(reason="error")` + `Done(error=...)`, which each
protocol's serializer turns into its own terminal error.
These engines keep no sessions: `session_kv` is None, so `session_id` is a 404
`sessions_unsupported`, as on any server without sessions.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
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
    ChatEvent,
    ChatRequest,
    CompletionRequest,
    Done,
    Finish,
    Message,
    ReasoningDelta,
    Started,
    StopKind,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from hearth.errors import BadRequest, NotFound, Unavailable
from hearth.gateway.failover.openai import Continuer, Echo, Held, joined_usage, post_stream
from hearth.gateway.failover.retry import RETRY_STATUSES
from hearth.gateway.fleet.health import counts_as_failure
from hearth.gateway.fleet.pool import Pool
from hearth.gateway.foreign.wire import chat_json, chunk_events, refusal, sampling_json, usage_of
from hearth.gateway.routing.affinity import Affinity
from hearth.gateway.routing.prefixes import prefix_hashes
from hearth.gateway.upstream.http import Answer, HttpxSender, Sender, Stalled, lines_of, within
from hearth.sessions.transcript import message_to_json

log = logging.getLogger("hearth.gateway")

SEQ_CTX = 131072  # what the gateway lets through; the upstream enforces its own context
NO_TOKENIZER = "token counting is not available for models served by OpenAI-compatible upstreams"
# How long the close of a finished stream waits for the bytes after [DONE] (the body's end: the
# last chunk of a chunked body, usually in the same packet). The connection goes back to the
# client's pool only when its response was read to the end; closed before that, it is closed, and
# every request opened a new connection (issue 39 item 8: a third of the gateway's CPU at 64
# clients, and a socket in TIME_WAIT per request).
DRAIN_S = 1.0


async def _drained(lines: AsyncIterator[str]) -> None:
    """`lines` read to the end (at most DRAIN_S; what they say is not used), so that their
    connection can be kept alive; an error or the time running out only means it is not."""
    try:
        async with asyncio.timeout(DRAIN_S):
            async for _ in lines:
                pass
    except (TimeoutError, httpx.HTTPError, Stalled):
        pass


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
        go_on = Continuer(self.pool, self.http, alias, body, hashes, req.continue_final) \
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
        """Retry before the first byte, as for Hearth nodes; then stream."""
        tried: set[str] = set()
        last = "no upstream could take the request"
        for _ in range(len(self.pool.nodes)):
            lease = await self.pool.acquire(alias, Affinity("none"), hashes, hashes[-1][1] if hashes else 1, tried)
            node = lease.node
            tried.add(node.name)
            try:
                resp = await post_stream(self.http, self.pool, node, path, body(node.up.models[alias]))
            except httpx.TransportError as e:
                self.pool.release(lease, False)
                last = f"{node.name}: {type(e).__name__}"
                self.pool.metrics.retries.labels("connect").inc()
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
                    continue
                self.pool.release(lease, False if counts_as_failure(resp.status_code) else None)
                raise refusal(resp.status_code, text)
            node.prefixes.add(hashes)
            held = Held(self.pool, lease)  # released by the EventStream's close, even if it never starts
            if go_on is not None:
                go_on.tried.add(node.name)
            events = self._events(held, resp, completion, cancel or CancelToken(), timeout, choices, go_on)
            return EventStream(events, on_close=[held.close])
        raise Unavailable(f"every upstream failed: {last}", code="upstream_failed", retry_after=2)

    def _spawn_close(self, resp: Answer) -> None:
        task = asyncio.ensure_future(resp.aclose())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _events(self, held: Held, resp: Answer, completion: bool, cancel: CancelToken,
                      timeout: float | None, choices: int, go_on: Continuer | None) -> AsyncIterator[ChatEvent]:
        """`held.ok` tells the stream's close how it ended. A cancel (or the time cap) closes the
        upstream response, which stops the upstream's work; the stream then ends `cancelled`
        (`length` with stop reason `timeout` for the cap, counted from the first generated token).
        A stream that breaks (transport error, stall, closed without a finish) goes on on
        another upstream through `go_on` where it can (failover/openai.py), at most
        --migration-limit times; else it ends with Finish(error) + Done(error)."""
        loop = asyncio.get_running_loop()
        node = held.node
        current = [resp]  # the response a cancel closes: the continuation's once there is one
        cancel.on_cancel(lambda: loop.call_soon_threadsafe(lambda: self._spawn_close(current[0])))
        # The time cap counts from the first generated token, as on a Hearth node (its prefill is never cut).
        cap: asyncio.TimerHandle | None = None
        metrics = self.pool.metrics
        usage = Usage()  # the current part's report
        finished: set[int] = set()
        chunks = 0  # the current part's content chunks: its completion tokens when it reports no usage
        before = 0  # content chunks of the earlier parts (the partial answer a continuation was given)
        text = ""  # the answer's text so far (choice 0): what a continuation is given
        plain = True  # only text so far: reasoning and tool calls are not continued
        moves = 0
        echo = Echo("")  # a continuation's repetition of the partial answer it was given, dropped
        cut_at: float | None = None
        drain: AsyncIterator[str] | None = None  # the answer's lines past [DONE]: read to the end at the close
        try:
            yield Started(0)
            while True:
                stall = self.pool.settings.stall_timeout_for(node.up)  # none unless the TOML sets one
                try:
                    lines = within(lines_of(current[0]), stall)
                    async for line in lines:
                        node.last_bytes = self.pool.clock()
                        if not line.startswith("data:"):
                            continue
                        payload = line[5:].strip()
                        if payload == "[DONE]":
                            drain = lines
                            break
                        data = json.loads(payload)
                        if isinstance(data, dict) and data.get("error"):
                            raise _UpstreamError(str(data["error"]))
                        for ev in (e for raw in chunk_events(data, completion) for e in echo.feed(raw)):
                            if cut_at is not None:
                                metrics.stream_migration_seconds.observe(time.monotonic() - cut_at)
                                cut_at = None
                            if isinstance(ev, Finish):
                                finished.add(ev.index)
                            elif isinstance(ev, TextDelta | ReasoningDelta | ToolCallDelta):
                                if cap is None and timeout:
                                    cap = loop.call_later(timeout, cancel.cancel, "timeout")
                                chunks += 1
                                if isinstance(ev, TextDelta) and ev.index == 0:
                                    text += ev.text
                                else:
                                    plain = False
                            yield ev
                        usage = usage_of(data) or usage
                    if not finished:
                        raise _Cut("the upstream ended the stream without a finish reason")
                    held.ok = True
                    yield Done(joined_usage(usage, before, chunks))
                    return
                except (httpx.HTTPError, ValueError, _Cut, _UpstreamError, Stalled, RuntimeError) as e:
                    if cancel.cancelled:
                        # The time cap ends the output as max_tokens does: "length", named.
                        cut = (Finish(i, "length", StopKind.TIMEOUT) if cancel.reason == "timeout"
                               else Finish(i, "cancelled") for i in range(choices) if i not in finished)
                        for fin in cut:
                            yield fin
                        yield Done(joined_usage(usage, before, chunks))
                        return
                    message = f"the upstream node {node.name} failed mid-stream: {e}"
                    # An in-band error is the engine's own answer, not a dead engine: not continued.
                    stop = isinstance(e, _UpstreamError) or go_on is None
                    if not stop and (finished or not plain or moves >= self.pool.settings.migration_limit):
                        metrics.stream_migrations.labels("limit" if plain and not finished
                                                         else "nothing_to_continue").inc()
                        stop = True
                    if stop or go_on is None:
                        held.ok = False
                        yield Finish(0, "error")
                        yield Done(joined_usage(usage, before, chunks), error=message)
                        return
                    log.warning("upstream %s broke mid-stream: %s", node.name, e)
                    cut_at = time.monotonic()
                    held.release(False)
                    await current[0].aclose()
                    moved = await go_on.open(text, before + chunks)
                    if moved is None:
                        yield Finish(0, "error")
                        yield Done(joined_usage(usage, before, chunks), error=message)
                        return
                    log.info("the stream from %s continues on %s", node.name, moved[0].node.name)
                    held.lease, current[0], echo = moved
                    node = moved[0].node
                    moves += 1
                    before, chunks, usage = before + chunks, 0, Usage()
                    if cancel.cancelled:  # it came while the continuation was opening
                        self._spawn_close(current[0])
        finally:
            if cap is not None:
                cap.cancel()
            if drain is not None and held.ok:
                await _drained(drain)
            await current[0].aclose()

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


class _UpstreamError(Exception):
    """The engine reported an error in its stream."""


class _Cut(Exception):
    """The stream ended without its finish."""
