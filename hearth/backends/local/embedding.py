"""Embedding models in the local backend: which GGUFs are embedding models, loading one (its
runner and its embedding engine thread), and turning a request's inputs into vectors.

A GGUF is an embedding model when its header declares a pooling type (`<arch>.pooling_type`
other than none, as sentence-transformers conversions, nomic-embed and bge do) or non-causal
attention (`<arch>.attention.causal` false: an encoder such as BERT). Such a model is served by
`EmbedEngine` (hearth.engine.embed), never by the chat engine, and is loaded, kept and unloaded
by the same loader as chat models (--models-max, the RAM budget, keep-alive, `hearth ps`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from hearth.backends.base import EmbedRequest, ModelCard
from hearth.backends.local.model import EngineSettings
from hearth.engine.embed import EmbedEngine, EmbedRunner, normalize
from hearth.errors import BadRequest, ContextLimit
from hearth.models import ModelSpec


def is_embedding_header(meta: dict[str, Any]) -> bool:
    """Whether GGUF metadata describes an embedding model (see the module's docstring)."""
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        return False
    pooling = meta.get(f"{arch}.pooling_type")
    return (isinstance(pooling, int) and pooling > 0) or meta.get(f"{arch}.attention.causal") is False


class TokenizingRunner(EmbedRunner, Protocol):
    n_ctx_train: int
    seq_ctx: int

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]: ...


EmbedFactory = Callable[[ModelSpec, EngineSettings], tuple[TokenizingRunner, ModelCard]]


def llamacpp_embed_factory(spec: ModelSpec, settings: EngineSettings) -> tuple[TokenizingRunner, ModelCard]:
    from hearth.backends.llamacpp.embed_runner import LlamaCppEmbedRunner

    runner = LlamaCppEmbedRunner(spec.path, seq_ctx=settings.ctx, n_batch=settings.batch,
                                 n_threads=settings.threads)
    card = ModelCard(id=spec.id, created=int(spec.path.stat().st_mtime), meta={
        "path": str(spec.path), "description": runner.description, "n_params": runner.n_params,
        "size_bytes": runner.size_bytes, "n_ctx_train": runner.n_ctx_train, "n_ctx": runner.seq_ctx,
        "n_vocab": runner.n_vocab, "architecture": runner.architecture, "embedding": True,
        "n_embd": runner.n_embd, "pooling": runner.pooling, "capabilities": ["embedding"],
    })
    return runner, card


@dataclass(slots=True)
class EmbeddingModel:
    spec: ModelSpec
    runner: TokenizingRunner
    engine: EmbedEngine
    card: ModelCard
    aliases: set[str] = field(default_factory=set)
    # Models trained so that a vector's first k values are themselves an embedding (Matryoshka):
    # only they may answer a smaller `dimensions`, truncated and normalised again. None is
    # declared so yet; all-MiniLM-L6-v2 is not one.
    matryoshka: bool = False

    @property
    def seq_ctx(self) -> int:
        return self.runner.seq_ctx

    @property
    def n_embd(self) -> int:
        return self.runner.n_embd

    def sequences(self, inputs: list[str | list[int]], truncate: bool) -> list[list[int]]:
        """Each input's tokens (a text tokenised with the model's special tokens; token ids as
        given), checked: ids in the vocabulary, none empty, none past the context unless
        `truncate` (then cut to the context, the last special token kept). Blocking: the pool."""
        limit = self.seq_ctx
        out = []
        for i, item in enumerate(inputs):
            if isinstance(item, str):
                tokens = self.runner.tokenize(item, add_special=True)
            else:
                tokens = list(item)
                n_vocab = getattr(self.runner, "n_vocab", None)
                bad = [t for t in tokens if t < 0 or (n_vocab is not None and t >= n_vocab)]
                if bad:
                    raise BadRequest(f"input[{i}] has token id {bad[0]} outside the vocabulary", param="input")
            if not tokens:
                raise BadRequest(f"input[{i}] is empty: it has no tokens to embed", param="input")
            if len(tokens) > limit:
                if not truncate:
                    raise ContextLimit(f"input[{i}] has {len(tokens)} tokens, more than the model's context "
                                       f"length of {limit}; shorten it", n_prompt=len(tokens), limit=limit,
                                       param="input")
                tokens = tokens[:limit - 1] + tokens[-1:] if isinstance(item, str) else tokens[:limit]
            out.append(tokens)
        return out

    def check_dimensions(self, dimensions: int | None) -> int | None:
        """The length to cut vectors to (None: keep them whole); BadRequest if the model cannot."""
        if dimensions is None or dimensions == self.n_embd:
            return None
        if not self.matryoshka:
            raise BadRequest(f"model {self.spec.id!r} does not support dimensions: its vectors have "
                             f"{self.n_embd} values and it was not trained to be cut shorter", param="dimensions")
        if not 1 <= dimensions < self.n_embd:
            raise BadRequest(f"dimensions must be between 1 and {self.n_embd}", param="dimensions")
        return dimensions

    async def run(self, seqs: list[list[int]], req: EmbedRequest) -> list[list[float]]:
        """The vectors of `seqs`, L2-normalised (after the cut to `dimensions`, if any)."""
        keep = self.check_dimensions(req.dimensions)
        job = self.engine.submit(seqs)
        if req.cancel is not None:
            req.cancel.on_cancel(job.cancelled.set)
        try:
            vectors = await asyncio.wrap_future(job.future)
        except BaseException:
            job.cancelled.set()  # the request's task was cancelled: drop its work
            raise
        return [normalize(v[:keep] if keep else v).tolist() for v in vectors]


def load_embedding_model(spec: ModelSpec, settings: EngineSettings, factory: EmbedFactory) -> EmbeddingModel:
    """Build the runner and start its engine thread (blocking: a worker thread)."""
    runner, card = factory(spec, settings)
    engine = EmbedEngine(runner, name=f"embed-{spec.id}")
    engine.start()
    aliases = {spec.id, spec.path.name, spec.path.stem, str(spec.path), *spec.aliases}
    return EmbeddingModel(spec, runner, engine, card, aliases)


def unload_embedding_model(m: EmbeddingModel) -> None:
    m.engine.stop()
    m.runner.close()


def elapsed(since: float) -> float:
    return time.monotonic() - since
