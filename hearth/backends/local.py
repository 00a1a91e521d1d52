"""The local backend: chat template → tokens → engine → events, one engine per model."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from hearth.backends.admission import AdmissionQueue
from hearth.backends.base import EventStream, ModelCard
from hearth.chat.cancel import CancelToken
from hearth.chat.output import OutputParser
from hearth.chat.reasoning import ReasoningParser, opens_thinking, template_kwargs, think_markers
from hearth.chat.system_turns import place_system_turns, renders_late_system
from hearth.chat.template import ChatTemplate
from hearth.chat.tool_parsers import PARSERS
from hearth.chat.tools import OutputPlan, as_text_messages, knows_tools, plan_output, resolve_parser
from hearth.chat.types import (
    ChatEvent,
    ChatRequest,
    CompletionRequest,
    Done,
    Finish,
    Message,
    Started,
    TextDelta,
    Timings,
    Usage,
)
from hearth.engine import Engine, EngineRequest
from hearth.engine.runner import Runner
from hearth.engine.swap import SwapStore
from hearth.engine.thinking import ThinkBudget
from hearth.engine.types import ContextOverflow, FinishReason, SamplingParams
from hearth.errors import BadRequest, ContextLimit, NotFound, Unavailable
from hearth.models import ModelSpec

log = logging.getLogger("hearth.backend")


@dataclass(slots=True)
class EngineSettings:
    ctx: int | None = None  # tokens per sequence (prompt + completion); None: the model's own
    parallel: int = 4  # sequence slots decoded together
    threads: int | None = None
    batch: int = 512  # tokens per engine step (decode tokens + prefill chunks)
    # One KV stream per sequence (not one buffer shared by all): each sequence attends only to
    # its own cells, which is faster, and where other traffic left its cells cannot change this
    # sequence's logits, so temperature 0 is reproducible. Same memory either way.
    kv_unified: bool = False
    max_waiting: int = 64  # requests queued for a slot before new ones get 429
    max_wait: float = 60.0  # seconds a request may queue before it gets 429
    tool_parser: str = "auto"  # auto (from the chat template) or a name in hearth.chat.tool_parsers
    kv_dir: Path | None = None  # where swapped session KV spills (per model); None: RAM only
    session_ram_mb: int = 2048  # host RAM for swapped-out session KV before it spills to disk
    prompt_cache_mb: int = 1024  # host RAM for stateless prompts' KV pushed out of their slot
    clamp_max_tokens: bool = False  # lower a max_tokens past the context to what is left (else 400)


@dataclass(slots=True)
class LocalModel:
    spec: ModelSpec
    runner: Runner
    engine: Engine
    template: ChatTemplate
    tokenize_text: Callable[[str, bool], list[int]]
    card: ModelCard
    admission: AdmissionQueue
    aliases: set[str] = field(default_factory=set)
    tool_parser: str = "hermes"
    native_tools: bool = False  # the template renders tools (else Hearth describes them as text)
    late_system: bool = True  # the template renders a system message after a user message, in place
    think: tuple[str, str] = ("<think>", "</think>")


RunnerFactory = Callable[[ModelSpec, EngineSettings], tuple[Runner, ModelCard, ChatTemplate]]


def llamacpp_factory(spec: ModelSpec, settings: EngineSettings) -> tuple[Runner, ModelCard, ChatTemplate]:
    from hearth.backends.llamacpp import LlamaCppRunner

    runner = LlamaCppRunner(spec.path, seq_ctx=settings.ctx, n_seq_max=settings.parallel,
                            n_batch=settings.batch, n_threads=settings.threads,
                            kv_unified=settings.kv_unified)
    info = runner.info
    card = ModelCard(id=spec.id, created=int(spec.path.stat().st_mtime), meta={
        "path": str(spec.path), "description": info.description, "n_params": info.n_params,
        "size_bytes": info.size_bytes, "n_ctx_train": info.n_ctx_train, "n_ctx": runner.seq_ctx,
        "n_vocab": info.n_vocab, "architecture": info.architecture, "parallel": settings.parallel,
    })
    template = ChatTemplate(info.chat_template, bos_token=info.bos_token, eos_token=info.eos_token)
    return runner, card, template


class LocalBackend:
    def __init__(self, specs: list[ModelSpec], settings: EngineSettings | None = None,
                 factory: RunnerFactory = llamacpp_factory) -> None:
        if not specs:
            raise ValueError("at least one model is needed")
        self.specs = specs
        self.settings = settings or EngineSettings()
        self._factory = factory
        self._models: dict[str, LocalModel] = {}
        self._ready = False
        self.load_error: str | None = None

    # ---- lifecycle --------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._ready

    async def start(self) -> None:
        """Load every model (in a worker thread, so /health answers 503 meanwhile)."""
        try:
            for spec in self.specs:
                t0 = time.monotonic()
                model = await asyncio.to_thread(self._load, spec)
                self._models[spec.id] = model
                log.info("loaded %s from %s in %.1fs", spec.id, spec.path, time.monotonic() - t0)
            self._ready = True
        except Exception as e:
            self.load_error = f"{type(e).__name__}: {e}"
            log.exception("model loading failed")

    def _load(self, spec: ModelSpec) -> LocalModel:
        runner, card, template = self._factory(spec, self.settings)
        seq_ctx = int(card.meta.get("n_ctx") or runner.n_ctx_train)
        kv_dir = self.settings.kv_dir
        swap = SwapStore(kv_dir / re.sub(r"[^A-Za-z0-9._-]", "_", spec.id) if kv_dir else None,
                         self.settings.session_ram_mb << 20, runner.fingerprint,
                         prefix_budget=self.settings.prompt_cache_mb << 20)
        engine = Engine(runner, seq_ctx=seq_ctx, token_budget=self.settings.batch, swap=swap,
                        name=f"engine-{spec.id}")
        engine.start()

        def tokenize_text(text: str, add_special: bool) -> list[int]:
            return runner.tokenize(text, add_special=add_special, parse_special=True)

        aliases = {spec.id, spec.path.name, spec.path.stem, str(spec.path), *spec.aliases}
        admission = AdmissionQueue(runner.n_seq_max, self.settings.max_waiting, self.settings.max_wait)
        return LocalModel(spec, runner, engine, template, tokenize_text, card, admission, aliases,
                          tool_parser=resolve_parser(self.settings.tool_parser, template),
                          native_tools=knows_tools(template), late_system=renders_late_system(template),
                          think=think_markers(template.source))

    def cancel_all(self) -> None:
        """Shutting down: end every run now, so each client gets its final event
        (finish_reason "cancelled") instead of a connection cut mid-stream; requests still
        waiting for a slot get 503."""
        for m in self._models.values():
            m.admission.close()
            m.engine.abort_all()

    async def stop(self) -> None:
        for m in self._models.values():
            await asyncio.to_thread(m.engine.stop)
            close = getattr(m.runner, "close", None)
            if close is not None:
                close()
        self._models.clear()
        self._ready = False

    # ---- lookups ----------------------------------------------------------------------------

    def models(self) -> list[ModelCard]:
        return [m.card for m in self._models.values()]

    def model(self, name: str | None) -> LocalModel:
        if self.load_error:
            raise Unavailable(f"the model failed to load: {self.load_error}", code="model_load_failed")
        if not self._ready:
            raise Unavailable("the model is still loading; retry shortly", code="model_loading")
        if not name:
            return next(iter(self._models.values()))
        for m in self._models.values():
            if name in m.aliases:
                return m
        raise NotFound(f"The model '{name}' does not exist. Available: "
                       f"{', '.join(self._models)}", param="model", code="model_not_found")

    def resolve(self, model: str | None) -> str:
        return self.model(model).spec.id

    def engine(self, model: str | None) -> Engine:
        return self.model(model).engine

    def engines(self) -> dict[str, Engine]:
        return {mid: m.engine for mid, m in self._models.items()}

    def load(self) -> dict[str, tuple[int, int]]:
        """Per model: (sequences running, requests waiting for a slot)."""
        return {mid: (m.engine.running, m.admission.waiting + m.engine.waiting) for mid, m in self._models.items()}

    # ---- tokens -------------------------------------------------------------------------------

    def render_chat(self, m: LocalModel, req: ChatRequest) -> str:
        return self._render(m, req, plan_output(req, m.tool_parser))

    @staticmethod
    def _render(m: LocalModel, req: ChatRequest, plan: OutputPlan) -> str:
        kwargs = template_kwargs(req)
        messages = place_system_turns(req.messages, m.late_system)
        if m.native_tools:
            return m.template.render(messages, tools=plan.tools_in_prompt or None, kwargs=kwargs)
        return m.template.render(as_text_messages(messages, plan.tools_in_prompt), kwargs=kwargs)

    def tokenize(self, model: str | None, text: str, *, add_special: bool = True) -> list[int]:
        return self.model(model).tokenize_text(text, add_special)

    def tokenize_chat(self, model: str | None, messages: list[Message]) -> list[int]:
        m = self.model(model)
        return m.tokenize_text(m.template.render(place_system_turns(messages, m.late_system)), False)

    def tokenize_request(self, req: ChatRequest) -> list[int]:
        """The prompt tokens `chat(req)` would generate from: same rendering, tools included."""
        m = self.model(req.model)
        return m.tokenize_text(self.render_chat(m, req), False)

    def token_pieces(self, model: str | None, tokens: list[int]) -> list[str]:
        m = self.model(model)
        self._check_tokens(m, tokens)
        return [m.runner.token_text(t).decode("utf-8", errors="replace") for t in tokens]

    def detokenize(self, model: str | None, tokens: list[int]) -> str:
        m = self.model(model)
        self._check_tokens(m, tokens)
        return b"".join(m.runner.token_text(t) for t in tokens).decode("utf-8", errors="replace")

    @staticmethod
    def _check_tokens(m: LocalModel, tokens: list[int]) -> None:
        for t in tokens:
            if not 0 <= t < m.runner.n_vocab:
                raise BadRequest(f"token id {t} is out of range [0, {m.runner.n_vocab})", param="tokens")

    # ---- generation ---------------------------------------------------------------------------

    async def chat(self, req: ChatRequest) -> EventStream:
        m = self.model(req.model)
        plan = plan_output(req, m.tool_parser)
        text = self._render(m, req, plan)
        # The rendered template carries its own special tokens (BOS included, when it wants one).
        tokens = m.tokenize_text(text, False)
        params = self._constrain(m, req.sampling, plan.grammar, "tool_choice" if plan.parser else "response_format")
        start, end = m.think
        inside = opens_thinking(text, start)
        think = None
        if req.reasoning.budget is not None:
            try:
                think = ThinkBudget(req.reasoning.budget, m.tokenize_text(end, False), start.encode(), end.encode(),
                                    starts_inside=inside)
            except ValueError as e:
                raise BadRequest(str(e), param="reasoning_budget") from e
        # Under a grammar the output is JSON or a forced call, never thinking.
        parsers = [OutputParser(i, None if params.grammar else ReasoningParser(start, end, inside=inside),
                                PARSERS[plan.parser](req.tools) if plan.parser else None, req.parallel_tool_calls)
                   for i in range(req.n)]
        return await self._generate(m, tokens, req, params=params, think=think, parsers=parsers)

    @staticmethod
    def _constrain(m: LocalModel, sampling: SamplingParams, grammar: str | None, source: str) -> SamplingParams:
        """Sampling with the plan's grammar, checked now so a bad one is a 400, not an error later."""
        if grammar is not None and sampling.grammar is not None:
            raise BadRequest("a grammar cannot be combined with response_format or a forced tool_choice",
                             param="grammar")
        params = replace(sampling, grammar=grammar) if grammar is not None else sampling
        check = getattr(m.runner, "check_grammar", None)
        if params.grammar is not None and check is not None:
            try:
                check(params.grammar)
            except ValueError as e:
                raise BadRequest(str(e), param="grammar" if sampling.grammar else source) from e
        return params

    async def complete(self, req: CompletionRequest) -> EventStream:
        m = self.model(req.model)
        if isinstance(req.prompt, str):
            tokens = m.tokenize_text(req.prompt, True)
        else:
            self._check_tokens(m, req.prompt)
            tokens = list(req.prompt)
        return await self._generate(m, tokens, req)

    async def _generate(self, m: LocalModel, tokens: list[int], req: ChatRequest | CompletionRequest, *,
                        params: SamplingParams | None = None, think: ThinkBudget | None = None,
                        parsers: list[OutputParser] | None = None) -> EventStream:
        """Validate (4xx now), wait for a slot (429 if none comes), then hand back the stream.
        The wall-clock cap counts from arrival, so time spent queued is part of it."""
        n, cancel = req.n, req.cancel
        deadline = time.monotonic() + req.timeout if req.timeout else None
        # Only the session manager passes a request with `session` on to the backend, with the
        # whole transcript in it: the session owns the KV the engine request builds.
        owner = req.session.session_id if isinstance(req, ChatRequest) and req.session else None
        max_len = req.max_len if isinstance(req, ChatRequest) else None
        ereq = EngineRequest(req.request_id, tokens, params or req.sampling, n=n, deadline=deadline,
                             cache_prompt=req.cache_prompt, think=think, owner=owner, max_len=max_len,
                             repetition=req.repetition)
        try:
            try:
                m.engine.validate(ereq)
            except ContextOverflow as e:
                if not (self.settings.clamp_max_tokens and e.max_tokens is not None and e.n_prompt < e.limit):
                    raise
                # --clamp-max-tokens: what is left of the context instead of a refusal
                ereq.params = replace(ereq.params, max_tokens=e.limit - e.n_prompt)
                m.engine.validate(ereq)
        except ContextOverflow as e:
            raise ContextLimit(str(e), n_prompt=e.n_prompt, limit=e.limit, max_tokens=e.max_tokens,
                               param="messages" if isinstance(req, ChatRequest) else "prompt") from e
        except ValueError as e:
            raise BadRequest(str(e)) from e
        if not await _admit(m.admission, n, cancel, req.timeout):
            return EventStream(_cancelled_while_queued(len(tokens), n))
        events = _events(m.engine, ereq, cancel)
        if parsers:
            events = _parsed(events, parsers)
        return EventStream(events, on_close=[lambda: m.admission.release(n)])


async def _admit(admission: AdmissionQueue, n: int, cancel: CancelToken | None, timeout: float | None) -> bool:
    """Wait for `n` slots (the request's own time cap bounds the wait too); False if the run
    was cancelled while it waited."""
    if cancel is None:
        await admission.acquire(n, timeout)
        return True
    if cancel.cancelled:
        return False
    loop = asyncio.get_running_loop()
    acquiring = asyncio.ensure_future(admission.acquire(n, timeout))
    cancel.on_cancel(lambda: loop.call_soon_threadsafe(acquiring.cancel))
    try:
        await acquiring
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if cancel.cancelled and not (task and task.cancelling()):
            return False
        raise
    if cancel.cancelled:  # granted in the same instant it was cancelled
        admission.release(n)
        return False
    return True


async def _cancelled_while_queued(n_prompt: int, n: int) -> AsyncIterator[ChatEvent]:
    yield Started(n_prompt)
    for i in range(n):
        yield Finish(i, FinishReason.CANCELLED.value)
    yield Done(Usage(prompt_tokens=n_prompt))


async def _events(engine: Engine, ereq: EngineRequest, cancel: CancelToken | None) -> AsyncIterator[ChatEvent]:
    usage = Usage(prompt_tokens=len(ereq.prompt_tokens))
    started = False
    placed = first_token = last_token = 0.0

    def watch_cancel() -> None:
        if cancel is not None:
            cancel.on_cancel(lambda: engine.abort(ereq.request_id))

    async for out in engine.generate(ereq, after_submit=watch_cancel):
        now = time.monotonic()
        if not started:
            started, placed = True, now
            usage.cached_tokens = out.cached_tokens
            yield Started(out.prompt_tokens, out.cached_tokens)
        for d in out.deltas:
            if d.token_ids:
                first_token, last_token = first_token or now, now
            usage.completion_tokens += len(d.token_ids)
            if d.text or d.logprobs:
                yield TextDelta(d.index, d.text, d.logprobs, len(d.token_ids))
            if d.finish_reason is not None:
                yield Finish(d.index, d.finish_reason.value, d.stop_reason)
        if out.finished:
            timings = Timings(usage.cached_tokens, usage.prompt_tokens - usage.cached_tokens,
                              ((first_token or now) - placed) * 1000, usage.completion_tokens,
                              (last_token - first_token) * 1000)
            yield Done(usage, error=out.error, timings=timings)


async def _parsed(events: AsyncIterator[ChatEvent], parsers: list[OutputParser]) -> AsyncIterator[ChatEvent]:
    """Engine text → reasoning, tool calls and text, per candidate."""
    try:
        async for ev in events:
            if isinstance(ev, TextDelta):
                for out in parsers[ev.index].feed(ev.text, ev.logprobs, ev.n_tokens):
                    yield out
            elif isinstance(ev, Finish):
                for out in parsers[ev.index].finish(ev.reason, ev.stop_reason):
                    yield out
            else:
                yield ev
    finally:
        await events.aclose()  # type: ignore[attr-defined]
