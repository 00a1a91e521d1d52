"""The local backend: chat template → tokens → engine → events, one engine per model.
Which models are in memory is `model_set` (over `loader`); a request made ready for the
engine is `prepare`; its events are `events`; this file is the glue.

Templating and tokenizing run on a small worker pool, never on the event loop: a long prompt
takes seconds to render and tokenize, and /health must answer meanwhile. The vocabulary is
read-only once loaded, so `Runner.tokenize` is safe off the engine thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from hearth.backends.base import (
    Embeddings,
    EmbedRequest,
    EmbedResult,
    EventStream,
    LoadStats,
    ModelCard,
    ModelLimits,
    ModelLoading,
    ModelStats,
    PromptCache,
    SessionKV,
)
from hearth.backends.local.admission import Claim
from hearth.backends.local.embedding import EmbedFactory, llamacpp_embed_factory
from hearth.backends.local.events import admit, cancelled_while_queued, engine_events, parsed, prefilled_usage
from hearth.backends.local.kv import LocalSessionKV
from hearth.backends.local.loader import LoadPolicy, ModelLoader
from hearth.backends.local.model import EngineSettings, LocalModel, RunnerFactory, llamacpp_factory
from hearth.backends.local.model_set import AnyModel, ModelSet
from hearth.backends.local.prepare import Prepared, checked, prepare, render_chat, validate
from hearth.backends.local.prompt_cache import LocalPromptCache
from hearth.chat.output import OutputParser
from hearth.chat.system_turns import place_system_turns
from hearth.chat.types import ChatRequest, CompletionRequest, Message
from hearth.engine import EngineRequest
from hearth.engine.fair_share import parse_class
from hearth.engine.thinking import ThinkBudget
from hearth.engine.types import SamplingParams
from hearth.errors import NotFound, Unavailable
from hearth.models import ModelSpec

log = logging.getLogger("hearth.backend")

T = TypeVar("T")

TOKENIZER_THREADS = 2  # concurrent template/tokenize jobs; more only queue behind the 2 cores
# Embedding inputs up to this many characters (or token ids) in all are tokenised on the event
# loop: a few µs of WordPiece against the ~0.1-0.3 ms a hop to the pool and back costs (issue 37,
# one short input per request); at most ~0.5 ms on the loop.
INLINE_TOKENIZE = 2048


class LocalBackend:
    """`specs` are loaded at start and kept (`--model`); `available` models are loaded when a
    request names them and unloaded when idle, under `policy` (hearth.backends.local.loader);
    `preload` ids of those are loaded at start too (the default model, when no --model is
    given), then follow the policy like the others."""

    def __init__(self, specs: list[ModelSpec], settings: EngineSettings | None = None,
                 factory: RunnerFactory = llamacpp_factory, *, available: list[ModelSpec] | None = None,
                 policy: LoadPolicy | None = None, preload: list[str] | None = None,
                 embed_factory: EmbedFactory = llamacpp_embed_factory) -> None:
        self.settings = settings or EngineSettings()
        self._set = ModelSet(specs, available or [], self.settings, factory, policy, embed_factory)
        self._preload = [s.id for s in specs] + [p for p in preload or [] if p not in {s.id for s in specs}]
        self._ready = False
        self._load_error: str | None = None
        self._expiry: asyncio.Task[None] | None = None
        self._tokenizer = ThreadPoolExecutor(TOKENIZER_THREADS, thread_name_prefix="hearth-tokens")
        self._session_kv = LocalSessionKV(self._set)
        self._prompt_cache = LocalPromptCache(self._set)

    # ---- lifecycle --------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def load_error(self) -> str | None:
        return self._load_error

    @property
    def loader(self) -> ModelLoader[AnyModel]:
        return self._set.loader

    async def start(self) -> None:
        """Load the models named at start (in worker threads, so /health answers 503 meanwhile),
        then unload idle models as their keep-alive runs out. A request that comes meanwhile
        waits for its model's load as it would for an on-demand one (`_holding`)."""
        for model_id in self._preload:
            try:
                await self._set.loader.load(model_id)
            except Exception as e:
                error = self._set.loader.entry(model_id).error
                self._load_error = f"{model_id}: {error}" if error else f"{type(e).__name__}: {e}"
                log.exception("model loading failed")
                break
        else:
            self._ready = True
        self._expiry = asyncio.create_task(self._set.loader.run_expiry())

    def cancel_all(self) -> None:
        for m in self._set.loaded().values():
            m.admission.close()
            m.engine.abort_all()

    async def stop(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            await asyncio.wait({self._expiry})
        await self._set.loader.close()
        self._ready = False
        self._tokenizer.shutdown(wait=False, cancel_futures=True)

    # ---- models -------------------------------------------------------------------------------

    def models(self) -> list[ModelCard]:
        return self._set.cards()

    def _check_started(self) -> None:
        """A failed start-up load is every request's 503. One still under way is not: a request
        needs its model only through `ModelSet.acquire`, which joins that load (as it joins an
        on-demand one), and names and limits are read without loading anything."""
        if self._load_error:
            raise Unavailable(f"the model failed to load: {self._load_error}", code="model_load_failed")

    def model(self, name: str | None) -> LocalModel:
        """The model `name` stands for, if it is loaded now (Unavailable if not): for tools and
        tests that look inside it; requests go through `_holding`, which loads it."""
        self._check_started()
        m = self._set.loaded_model(name)
        if m is None:
            raise Unavailable(f"model {self._set.resolve(name)!r} is not loaded", code="model_not_loaded")
        return m

    def resolve(self, model: str | None) -> str:
        self._check_started()
        return self._set.resolve(model)

    def limits(self, model: str | None) -> ModelLimits:
        self._check_started()
        return self._set.limits(model)

    def is_loaded(self, model: str | None) -> bool:
        if self._load_error:
            return True  # no wait to stream through: the request's 503 comes before its first byte
        try:
            return self._set.loaded_model(model) is not None
        except NotFound:
            return True

    async def load_model(self, model: str, keep_alive: float | None = None) -> ModelCard:
        """POST /models/load: the model loaded now, kept for `keep_alive` (else the default)."""
        self._check_started()
        model_id = self._set.resolve(model)
        await self._set.loader.load(model_id, keep_alive)
        return self._set.card(self._set.loader.entry(model_id))

    async def unload_model(self, model: str) -> bool:
        """POST /models/unload: the model unloaded now; False if it was not loaded."""
        self._check_started()
        return await self._set.loader.unload(self._set.resolve(model))

    def add_model(self, spec: ModelSpec) -> None:
        """A model installed while the server runs (POST /api/pull): servable on demand from now on."""
        self._set.add(spec)

    async def remove_model(self, model: str) -> None:
        """Forget a model whose file is about to be deleted (DELETE /api/delete): unloaded first."""
        self._check_started()
        await self._set.remove(self._set.resolve(model))

    def stats(self) -> dict[str, ModelStats]:
        out = {}
        for mid, m in self._set.loaded().items():
            e, s, g = m.engine, m.engine.stats, m.runner.grammar_stats()
            held = e.swap.bytes_held()
            out[mid] = ModelStats(
                running=e.running, waiting=m.admission.waiting + e.waiting, kv_tokens=e.slots.kv_tokens,
                slots_busy=e.slots.n_busy, swapped_ram_bytes=held.session_ram,
                paused_kv_ram_bytes=held.paused_ram, paused_kv_disk_bytes=held.paused_disk,
                prompt_tokens=s.prompt_tokens,
                cached_tokens=s.cached_tokens, generated_tokens=s.generated_tokens, steps=s.steps,
                finished=s.finished, cancelled=s.cancelled, swap_outs=s.swap_outs, swap_ins=s.swap_ins,
                drafted_tokens=s.drafted_tokens, accepted_tokens=s.accepted_tokens,
                interrupted_decodes=s.interrupted_decodes, kv_reprefills=s.kv_reprefills,
                grammar_cache_hits=g.hits, grammar_cache_misses=g.misses, paused=len(e.preempt.paused),
                preemptions=e.preempt.pauses, tenants=m.admission.fair.snapshot(),
                queued_by_class={c.tier: n for c, n in m.admission.by_class().items() if n},
                paused_by_class=e.preempt.by_class())
        return out

    def load_stats(self) -> dict[str, LoadStats]:
        """Per model id, every servable model: its loads, load seconds and the memory it holds."""
        return {e.spec.id: LoadStats(loaded=e.state == "loaded", loads=e.loads, load_failures=e.load_failures,
                                     load_seconds=e.load_seconds,
                                     loaded_bytes=e.loaded_bytes if e.state == "loaded" else 0)
                for e in self._set.loader.entries()}

    @property
    def session_kv(self) -> SessionKV:
        return self._session_kv

    @property
    def prompt_cache(self) -> PromptCache:
        return self._prompt_cache

    @property
    def model_loading(self) -> ModelLoading:
        return self

    @property
    def embeddings(self) -> Embeddings:
        return self

    # ---- embeddings ---------------------------------------------------------------------------

    async def embed(self, req: EmbedRequest) -> EmbedResult:
        """Vectors from an embedding model, loaded on demand like any model and held while its
        inputs are tokenised (in the pool) and decoded (its engine packs them with other
        requests' into shared calls)."""
        self._check_started()
        arrived = time.monotonic()
        m = await self._set.acquire_embedder(req.model, req.timeout, req.cancel)
        if m is None:
            raise Unavailable("the request was cancelled while its model loaded", code="cancelled")
        loaded = time.monotonic()
        try:
            m.check_dimensions(req.dimensions)  # before the tokenizing work
            if sum(len(x) for x in req.inputs) <= INLINE_TOKENIZE:  # the hop costs more than the work
                seqs = m.sequences(req.inputs, req.truncate)
            else:
                seqs = await self._off_loop(lambda: m.sequences(req.inputs, req.truncate))
            vectors = await m.run(seqs, req)
        finally:
            self._set.release(m.spec.id, req.keep_alive)
        return EmbedResult(m.spec.id, vectors, sum(len(s) for s in seqs), loaded - arrived,
                           time.monotonic() - arrived)

    # ---- tokens -------------------------------------------------------------------------------

    async def _off_loop(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._tokenizer, fn)

    async def tokenize(self, model: str | None, text: str, *, add_special: bool = True) -> list[int]:
        self._check_started()
        async with self._set.using(model) as m:
            m.check_fits(text)  # here too, so a refusal does not queue behind other tokenizing
            return await self._off_loop(lambda: m.tokenize_text(text, add_special))

    async def tokenize_chat(self, model: str | None, messages: list[Message]) -> list[int]:
        self._check_started()
        async with self._set.using(model) as m:
            return await self._off_loop(
                lambda: m.tokenize_text(m.template.render(place_system_turns(messages, m.late_system)), False))

    async def tokenize_prompt(self, req: ChatRequest) -> list[int]:
        self._check_started()
        async with self._set.using(req.model) as m:
            return await self._off_loop(lambda: m.tokenize_text(render_chat(m, req), False))

    async def token_pieces(self, model: str | None, tokens: list[int]) -> list[str]:
        self._check_started()
        async with self._set.using(model) as m:
            return await self._off_loop(lambda: [m.runner.token_text(t).decode("utf-8", errors="replace")
                                                 for t in checked(m, tokens)])

    async def detokenize(self, model: str | None, tokens: list[int]) -> str:
        self._check_started()
        async with self._set.using(model) as m:
            return await self._off_loop(
                lambda: b"".join(m.runner.token_text(t) for t in checked(m, tokens)).decode("utf-8", "replace"))

    # ---- generation ---------------------------------------------------------------------------

    async def chat(self, req: ChatRequest) -> EventStream:
        async def run(m: LocalModel) -> EventStream:
            def off_loop() -> tuple[Prepared, EngineRequest]:
                prep = prepare(m, req)
                return prep, self._checked(m, prep.tokens, req, params=prep.params, think=prep.think,
                                           keep_tokens=prep.keep_tokens)

            prep, ereq = await self._off_loop(off_loop)
            return await self._generate(m, ereq, req, parsers=prep.parsers, prefilled=prep.prefilled)

        return await self._holding(req, run)

    async def _holding(self, req: ChatRequest | CompletionRequest,
                       run: Callable[[LocalModel], Awaitable[EventStream]]) -> EventStream:
        """`run` on the request's model, loaded first if it is not (the wait bounded by the
        request's time cap, and ended by its cancel token); the model is held until the
        stream closes, then kept for the request's keep_alive."""
        self._check_started()
        m = await self._set.acquire(req.model, req.timeout, req.cancel)
        if m is None:
            return EventStream(cancelled_while_queued(0, req.n))
        model_id = m.spec.id
        try:
            stream = await run(m)
        except BaseException:
            self._set.release(model_id, req.keep_alive)
            raise
        stream.on_close(lambda: self._set.release(model_id, req.keep_alive))
        return stream

    async def complete(self, req: CompletionRequest) -> EventStream:
        async def run(m: LocalModel) -> EventStream:
            prompt = req.prompt
            if isinstance(prompt, str):
                m.check_fits(prompt)

            def off_loop() -> EngineRequest:
                tokens = m.tokenize_text(prompt, True) if isinstance(prompt, str) else \
                    list(checked(m, prompt, "prompt"))
                return self._checked(m, tokens, req)

            return await self._generate(m, await self._off_loop(off_loop), req)

        return await self._holding(req, run)

    def _checked(self, m: LocalModel, tokens: list[int], req: ChatRequest | CompletionRequest, *,
                 params: SamplingParams | None = None, think: ThinkBudget | None = None,
                 keep_tokens: int = 0) -> EngineRequest:
        """The engine request, validated (a 4xx raised here), its prompt's cached blocks read
        from the disk. Runs in the tokenizer pool, in the same hop as the prompt's tokenizing:
        each hop between the event loop and a thread is a wake-up on both sides, which a busy
        loop (a batch beside) makes slow."""
        # Only the session manager passes a request with `session` on to the backend, with the
        # whole transcript in it: the session owns the KV the engine request builds.
        owner = req.session.session_id if isinstance(req, ChatRequest) and req.session else None
        max_len = req.max_len if isinstance(req, ChatRequest) else None
        ereq = EngineRequest(req.request_id, tokens, params or req.sampling, n=req.n, max_time=req.timeout or None,
                             cache_prompt=req.cache_prompt, think=think, owner=owner, max_len=max_len,
                             repetition=req.repetition,
                             cache_key=req.cache_key if isinstance(req, ChatRequest) else None,
                             keep_tokens=keep_tokens, cache_ns=req.cache_ns, tenant=req.tenant,
                             priority=int(parse_class(req.priority or "default")))
        validate(m, ereq, "messages" if isinstance(req, ChatRequest) else "prompt", self.settings.strict_max_tokens)
        cache = m.engine.cache
        if cache is not None and owner is None and req.cache_prompt:
            # The prompt's cached blocks come off the disk here, in the pool: the engine thread
            # only joins blocks already in RAM.
            cache.prefetch(tokens[:-1], req.cache_ns)
        return ereq

    async def _generate(self, m: LocalModel, ereq: EngineRequest, req: ChatRequest | CompletionRequest, *,
                        parsers: list[OutputParser] | None = None, prefilled: int = 0) -> EventStream:
        """Wait for a slot (429 if none comes), then hand back the stream. The time cap counts
        from the first generated token (llama-server's t_max_predict_ms): the queue has its own
        bound (--max-wait), and a long prompt's prefill is never cut."""
        n, cancel, tokens = req.n, req.cancel, ereq.prompt_tokens
        claim = Claim(req.tenant, req.weight, parse_class(req.priority or "default"))
        if not await admit(m.admission, n, cancel, None, claim):
            return EventStream(cancelled_while_queued(len(tokens), n))
        events = engine_events(m.engine, ereq, cancel)
        if parsers:
            events = parsed(events, parsers)
        if prefilled:
            events = prefilled_usage(events, prefilled)
        return EventStream(events, on_close=[lambda: m.admission.release(n, claim)])
