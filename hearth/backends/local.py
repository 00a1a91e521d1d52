"""The local backend: chat template → tokens → engine → events, one engine per model."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from hearth.backends.base import ModelCard
from hearth.chat.template import ChatTemplate
from hearth.chat.types import (
    ChatEvent,
    ChatRequest,
    CompletionRequest,
    Done,
    Finish,
    Message,
    Started,
    TextDelta,
    Usage,
)
from hearth.engine import Engine, EngineRequest, SamplingParams
from hearth.engine.runner import Runner
from hearth.engine.types import ContextOverflow
from hearth.errors import BadRequest, ContextLimit, NotFound, Unavailable
from hearth.models import DEFAULT_ALIASES, DEFAULT_MODEL_ID, ModelSpec

log = logging.getLogger("hearth.backend")


@dataclass(slots=True)
class EngineSettings:
    ctx: int | None = None  # tokens per sequence (prompt + completion); None: the model's own
    parallel: int = 4  # sequence slots decoded together
    threads: int | None = None
    batch: int = 512  # tokens per engine step (decode tokens + prefill chunks)
    kv_unified: bool = True


@dataclass(slots=True)
class LocalModel:
    spec: ModelSpec
    runner: Runner
    engine: Engine
    template: ChatTemplate
    tokenize_text: Callable[[str, bool], list[int]]
    card: ModelCard
    aliases: set[str] = field(default_factory=set)


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
        engine = Engine(runner, seq_ctx=seq_ctx, token_budget=self.settings.batch,
                        name=f"engine-{spec.id}")
        engine.start()

        def tokenize_text(text: str, add_special: bool) -> list[int]:
            return runner.tokenize(text, add_special=add_special, parse_special=True)

        aliases = {spec.id, spec.path.name, spec.path.stem, str(spec.path)}
        if spec.id == DEFAULT_MODEL_ID:
            aliases.update(DEFAULT_ALIASES)
        return LocalModel(spec, runner, engine, template, tokenize_text, card, aliases)

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
        if not self._ready:
            raise Unavailable(self.load_error or "the model is still loading; retry shortly",
                              code="model_loading")
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

    # ---- tokens -------------------------------------------------------------------------------

    def render_chat(self, m: LocalModel, req: ChatRequest) -> str:
        return m.template.render(req.messages, tools=req.tools or None, kwargs=req.chat_template_kwargs)

    def tokenize(self, model: str | None, text: str, *, add_special: bool = True) -> list[int]:
        return self.model(model).tokenize_text(text, add_special)

    def tokenize_chat(self, model: str | None, messages: list[Message]) -> list[int]:
        m = self.model(model)
        return m.tokenize_text(m.template.render(messages), False)

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

    async def chat(self, req: ChatRequest) -> AsyncIterator[ChatEvent]:
        m = self.model(req.model)
        text = self.render_chat(m, req)
        # The rendered template carries its own special tokens (BOS included, when it wants one).
        tokens = m.tokenize_text(text, False)
        return self._generate(m, tokens, req.sampling, req.n, req.request_id, req.timeout)

    async def complete(self, req: CompletionRequest) -> AsyncIterator[ChatEvent]:
        m = self.model(req.model)
        if isinstance(req.prompt, str):
            tokens = m.tokenize_text(req.prompt, True)
        else:
            self._check_tokens(m, req.prompt)
            tokens = list(req.prompt)
        return self._generate(m, tokens, req.sampling, req.n, req.request_id, req.timeout)

    def _generate(self, m: LocalModel, tokens: list[int], sampling: SamplingParams, n: int,
                  request_id: str, timeout: float | None) -> AsyncIterator[ChatEvent]:
        deadline = time.monotonic() + timeout if timeout else None
        ereq = EngineRequest(request_id, tokens, sampling, n=n, deadline=deadline)
        try:
            m.engine.validate(ereq)
        except ContextOverflow as e:
            raise ContextLimit(str(e), param="messages") from e
        except ValueError as e:
            raise BadRequest(str(e)) from e
        return _events(m.engine, ereq)


async def _events(engine: Engine, ereq: EngineRequest) -> AsyncIterator[ChatEvent]:
    usage = Usage(prompt_tokens=len(ereq.prompt_tokens))
    started = False
    async for out in engine.generate(ereq):
        if not started:
            started = True
            usage.cached_tokens = out.cached_tokens
            yield Started(out.prompt_tokens, out.cached_tokens)
        for d in out.deltas:
            usage.completion_tokens += len(d.token_ids)
            if d.text or d.logprobs:
                yield TextDelta(d.index, d.text, d.logprobs, len(d.token_ids))
            if d.finish_reason is not None:
                yield Finish(d.index, d.finish_reason.value, d.stop_reason)
        if out.finished:
            yield Done(usage, error=out.error)
