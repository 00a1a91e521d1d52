"""The local backend's models: every servable one by name, and the loader that keeps some of
them in memory (hearth.backends.local.loader). What the backend asks of a model goes through
here: a name resolved without loading anything, a model held for a request (`acquire` /
`release`, or `using`), its card and limits whether it is loaded or not.

Embedding models (hearth.backends.local.embedding) share the loader with chat models, so
--models-max, the RAM budget and keep-alive count them alike; which kind a model is comes from
its GGUF header, read without loading it, so a chat request for an embedding model (and the
reverse) is refused before anything loads."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from hearth import gguf
from hearth.backends.base import ModelCard, ModelLimits
from hearth.backends.local.embedding import (
    EmbeddingModel,
    EmbedFactory,
    is_embedding_header,
    llamacpp_embed_factory,
    load_embedding_model,
    unload_embedding_model,
)
from hearth.backends.local.loader import Entry, LoadPolicy, ModelLoader
from hearth.backends.local.model import (
    EngineSettings,
    LocalModel,
    RunnerFactory,
    load_model,
    model_folder,
    process_rss,
    unload_model,
)
from hearth.backends.local.warmup import ready_model
from hearth.chat.cancel import CancelToken
from hearth.errors import BadRequest, Conflict, NotFound, Unavailable
from hearth.models import ModelSpec

log = logging.getLogger("hearth.backend")

AnyModel = LocalModel | EmbeddingModel


def aliases(spec: ModelSpec) -> list[str]:
    """The names a request may use for a model: its id, its file's name, stem and path, its aliases."""
    return [spec.id, spec.path.name, spec.path.stem, str(spec.path), *spec.aliases]


class ModelSet:
    def __init__(self, pinned: list[ModelSpec], available: list[ModelSpec], settings: EngineSettings,
                 factory: RunnerFactory, policy: LoadPolicy | None = None,
                 embed_factory: EmbedFactory = llamacpp_embed_factory) -> None:
        specs = list(pinned) + [s for s in available if s.id not in {p.id for p in pinned}]
        if not specs:
            raise ValueError("at least one model is needed")
        self.settings = settings
        self.default_id = specs[0].id  # what a request without a model gets
        self._specs = {s.id: s for s in specs}
        self._names: dict[str, str] = {}
        for s in specs:  # an id always names its own model; other names go to the first that has them
            self._names[s.id] = s.id
        for s in specs:
            for name in aliases(s):
                self._names.setdefault(name, s.id)
        self._headers: dict[str, dict[str, Any]] = {}

        def load(spec: ModelSpec) -> AnyModel:
            if self.is_embedding(spec.id):
                return load_embedding_model(spec, settings, embed_factory)
            return ready_model(load_model(spec, settings, factory), settings)

        def unload(m: AnyModel) -> None:
            if isinstance(m, EmbeddingModel):
                unload_embedding_model(m)
            else:
                unload_model(m)

        self.loader: ModelLoader[AnyModel] = ModelLoader(specs, load, unload, policy=policy,
                                                         pinned={s.id for s in pinned}, measure=process_rss)

    # ---- names ----------------------------------------------------------------------------------

    def resolve(self, name: str | None) -> str:
        """The id of the model `name` stands for (None or "": the default); NotFound if none."""
        if not name:
            return self.default_id
        model_id = self._names.get(name)
        if model_id is None:
            raise NotFound(f"The model '{name}' does not exist. Available: {', '.join(self._specs)}",
                           param="model", code="model_not_found")
        return model_id

    def add(self, spec: ModelSpec) -> None:
        """A model installed while the server runs: its names resolve from now on."""
        if spec.id in self._specs:
            return
        self._specs[spec.id] = spec
        self._names[spec.id] = spec.id
        for name in aliases(spec):
            self._names.setdefault(name, spec.id)
        self.loader.add(spec)

    async def remove(self, model_id: str) -> None:
        """Forget a model (its file is about to be deleted); Conflict for the default one or one in use."""
        if model_id == self.default_id:
            raise Conflict(f"model {model_id!r} is this server's default model", param="model", code="model_pinned")
        await self.loader.remove(model_id)
        del self._specs[model_id]
        self._names = {k: v for k, v in self._names.items() if v != model_id}

    def loaded(self) -> dict[str, LocalModel]:
        """The chat models in memory (the ones with an engine, KV and a prompt cache)."""
        return {mid: m for mid, m in self.loader.loaded().items() if isinstance(m, LocalModel)}

    def loaded_embedders(self) -> dict[str, EmbeddingModel]:
        return {mid: m for mid, m in self.loader.loaded().items() if isinstance(m, EmbeddingModel)}

    def is_embedding(self, model_id: str) -> bool:
        """Whether the model is an embedding model (from its GGUF header; no load needed)."""
        return bool(self._header(self._specs[model_id]).get("embedding"))

    def loaded_model(self, name: str | None) -> LocalModel | None:
        return self.loaded().get(self.resolve(name))

    def swap_dir(self, model_id: str) -> Path | None:
        """Where the model's sessions' swapped KV lives (whether it is loaded or not)."""
        kv_dir = self.settings.kv_dir
        return kv_dir / model_folder(self._specs[model_id]) if kv_dir is not None else None

    # ---- holding a model for a request ------------------------------------------------------------

    async def acquire(self, name: str | None, timeout: float | None = None,
                      cancel: CancelToken | None = None) -> LocalModel | None:
        """The model, loaded (its load started if needed), held until `release`; None if `cancel`
        was set while it loaded. The wait is bounded by `timeout` (503 model_loading past it).
        An embedding model is refused (400) before anything loads."""
        model_id = self.resolve(name)
        if self.is_embedding(model_id):
            raise BadRequest(f"model {model_id!r} is an embedding model: it does not support chat or text "
                             "completion (use /v1/embeddings)", param="model", code="model_not_supported")
        m = await self._acquire(model_id, timeout, cancel)
        assert m is None or isinstance(m, LocalModel)
        return m

    async def acquire_embedder(self, name: str | None, timeout: float | None = None,
                               cancel: CancelToken | None = None) -> EmbeddingModel | None:
        """`acquire` for an embedding model; a chat model is refused (400) before anything loads."""
        model_id = self.resolve(name)
        if not self.is_embedding(model_id):
            raise BadRequest(f"model {model_id!r} does not support embeddings: it is a chat model; name an "
                             "embedding model (e.g. all-minilm-l6-v2)", param="model", code="model_not_supported")
        m = await self._acquire(model_id, timeout, cancel)
        assert m is None or isinstance(m, EmbeddingModel)
        return m

    async def _acquire(self, model_id: str, timeout: float | None, cancel: CancelToken | None) -> AnyModel | None:
        if self.loader.entry(model_id).state == "loaded":  # the common case: no task, no wait
            return await self.loader.acquire(model_id)
        if cancel is not None and cancel.cancelled:
            return None
        waiting = asyncio.ensure_future(self.loader.acquire(model_id))
        if cancel is not None:
            loop = asyncio.get_running_loop()
            cancel.on_cancel(lambda: loop.call_soon_threadsafe(waiting.cancel))
        try:
            done, _ = await asyncio.wait({waiting}, timeout=timeout)
        except asyncio.CancelledError:  # the request's own task: its client left
            waiting.cancel()
            await asyncio.wait({waiting})
            self._undo(waiting, model_id)
            raise
        if not done:
            waiting.cancel()
            await asyncio.wait({waiting})
            if not self._undo(waiting, model_id):
                raise Unavailable(f"model {model_id!r} did not load within the request's time cap ({timeout:g} s); "
                                  "retry shortly", code="model_loading")
        if waiting.cancelled():
            return None  # cancel (POST /v1/cancel) while it loaded
        model = waiting.result()  # a failed load raises here: Unavailable naming the model
        if cancel is not None and cancel.cancelled:  # loaded in the same instant it was cancelled
            self.release(model_id)
            return None
        return model

    def _undo(self, waiting: asyncio.Future[AnyModel], model_id: str) -> bool:
        """A wait given up: if it had got the model after all, hand it back. True if it had."""
        if waiting.done() and not waiting.cancelled() and waiting.exception() is None:
            self.release(model_id)
            return True
        return False

    def release(self, model_id: str, keep_alive: float | None = None) -> None:
        self.loader.release(model_id, keep_alive)

    @contextlib.asynccontextmanager
    async def using(self, name: str | None) -> AsyncIterator[LocalModel]:
        """The model, loaded and held for the block (token work, session KV, the prompt cache)."""
        model = await self.acquire(name)
        assert model is not None  # no cancel token: never None
        try:
            yield model
        finally:
            self.release(model.spec.id)

    # ---- what clients see --------------------------------------------------------------------------

    def _header(self, spec: ModelSpec) -> dict[str, Any]:
        """Facts from the GGUF header (read once: no load needed); {} for a file without one."""
        got = self._headers.get(spec.id)
        if got is None:
            try:
                meta = gguf.read_metadata(spec.path)
                got = {"n_ctx_train": gguf.context_length(meta), "architecture": meta.get("general.architecture"),
                       "quantization": gguf.quantization(meta), "description": meta.get("general.name"),
                       "embedding": is_embedding_header(meta) or None}
            except (gguf.GGUFError, OSError, ValueError) as e:
                got = {"error": f"unreadable GGUF header: {e}"}
            self._headers[spec.id] = got
        return got

    def limits(self, name: str | None) -> ModelLimits:
        """A loaded model's own limits; for one not loaded, what it will have: --ctx capped by
        its training context (as the runner does), --parallel sequences."""
        model_id = self.resolve(name)
        m = self.loaded().get(model_id)
        if m is not None:
            return m.limits
        trained = self._header(self._specs[model_id]).get("n_ctx_train")
        ctx = self.settings.ctx
        seq_ctx = min(ctx, trained) if ctx and trained else (ctx or trained or 4096)
        return ModelLimits(int(seq_ctx), self.settings.parallel)

    def card(self, e: Entry[AnyModel]) -> ModelCard:
        spec = e.spec
        status: dict[str, Any] = {"value": e.state, "pinned": e.pinned, "users": e.users, "loads": e.loads,
                                  "load_seconds": round(e.load_seconds, 3)}
        expires = self.loader.expires_at(e)
        if expires is not None:
            status["expires_in"] = round(max(0.0, expires - self.loader.clock()), 1)  # seconds
        if e.state == "loaded":
            status["loaded_bytes"] = e.loaded_bytes
        if e.error:
            status["error"] = e.error
        if e.state == "loaded" and e.model is not None:
            meta = dict(e.model.card.meta)
            created = e.model.card.created
        else:
            size = spec.path.stat().st_size if spec.path.is_file() else 0
            meta = {"path": str(spec.path), "size_bytes": size, "n_ctx": self.limits(spec.id).seq_ctx,
                    "parallel": self.settings.parallel, "kv_type": self.settings.kv_type,
                    **{k: v for k, v in self._header(spec).items() if v is not None}}
            created = int(spec.path.stat().st_mtime) if spec.path.exists() else 0
        meta["aliases"] = [a for a in dict.fromkeys(spec.aliases) if a != spec.id]
        return ModelCard(id=spec.id, created=created, meta=meta, status=status)

    def cards(self) -> list[ModelCard]:
        return [self.card(e) for e in self.loader.entries()]
