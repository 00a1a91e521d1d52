"""The backend the protocols call: sessions as a decorator around the real backend.

`SessionBackend` implements the `Backend` contract over an inner backend and the
`SessionManager` that keeps the sessions of that backend. `chat()` goes to the manager when
the request names a session (`req.session`), straight to the inner backend otherwise; every
other call (completions, tokens, models, lifecycle, the session-KV capability) is the inner
backend's. So every protocol, legacy completions included, calls one object, and a protocol
never has to know whether a request is a session turn.

The manager itself holds the inner backend, never this decorator: a turn's whole-transcript
request must reach the engine, not come back here.
"""

from __future__ import annotations

from hearth.backends.base import (
    Backend,
    Embeddings,
    EventStream,
    ModelCard,
    ModelLimits,
    ModelLoading,
    ModelStats,
    PromptCache,
    SessionKV,
)
from hearth.chat.types import ChatRequest, CompletionRequest, Message
from hearth.sessions.manager import SessionManager


class SessionBackend:
    def __init__(self, inner: Backend, sessions: SessionManager) -> None:
        self.inner = inner
        self.sessions = sessions

    # generation: the one place a request becomes a session turn
    async def chat(self, req: ChatRequest) -> EventStream:
        if req.session is None:
            return await self.inner.chat(req)
        return await self.sessions.turn(req)

    async def complete(self, req: CompletionRequest) -> EventStream:
        return await self.inner.complete(req)

    # everything else is the inner backend's
    @property
    def ready(self) -> bool:
        return self.inner.ready

    @property
    def load_error(self) -> str | None:
        return self.inner.load_error

    async def start(self) -> None:
        await self.inner.start()

    async def stop(self) -> None:
        await self.inner.stop()

    def cancel_all(self) -> None:
        self.inner.cancel_all()

    def models(self) -> list[ModelCard]:
        return self.inner.models()

    def resolve(self, model: str | None) -> str:
        return self.inner.resolve(model)

    def limits(self, model: str | None) -> ModelLimits:
        return self.inner.limits(model)

    async def tokenize(self, model: str | None, text: str, *, add_special: bool = True) -> list[int]:
        return await self.inner.tokenize(model, text, add_special=add_special)

    async def tokenize_chat(self, model: str | None, messages: list[Message]) -> list[int]:
        return await self.inner.tokenize_chat(model, messages)

    async def tokenize_prompt(self, req: ChatRequest) -> list[int]:
        return await self.inner.tokenize_prompt(req)

    async def token_pieces(self, model: str | None, tokens: list[int]) -> list[str]:
        return await self.inner.token_pieces(model, tokens)

    async def detokenize(self, model: str | None, tokens: list[int]) -> str:
        return await self.inner.detokenize(model, tokens)

    def stats(self) -> dict[str, ModelStats]:
        return self.inner.stats()

    @property
    def session_kv(self) -> SessionKV | None:
        return self.inner.session_kv

    @property
    def prompt_cache(self) -> PromptCache | None:
        return self.inner.prompt_cache

    @property
    def model_loading(self) -> ModelLoading | None:
        return self.inner.model_loading

    @property
    def embeddings(self) -> Embeddings | None:
        return self.inner.embeddings
