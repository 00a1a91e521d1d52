"""The `Backend` Protocol, and the `require_...` functions that turn a missing optional
capability into the one 404 the API answers with."""

from __future__ import annotations

from typing import Protocol, TypeVar

from hearth.backends.base.embeddings import Embeddings
from hearth.backends.base.model_info import ModelCard, ModelLimits, ModelStats
from hearth.backends.base.model_loading import ModelLoading
from hearth.backends.base.prompt_cache import PromptCache
from hearth.backends.base.session_kv import SessionKV
from hearth.backends.base.stream import EventStream
from hearth.chat.types import ChatRequest, CompletionRequest, Message
from hearth.errors import NotFound

T = TypeVar("T")


class Backend(Protocol):
    # lifecycle
    @property
    def ready(self) -> bool: ...

    @property
    def load_error(self) -> str | None:
        """Why the backend could not start (health answers 503 with it), or None."""
        ...

    async def start(self) -> None:
        """Load or connect. Runs in the background while the server already answers (/health
        says 503 until `ready`); a failure is recorded in `load_error`, not raised."""
        ...

    async def stop(self) -> None: ...

    def cancel_all(self) -> None:
        """Shutting down: end every run now with its final event (finish_reason "cancelled");
        requests still waiting for a slot get 503. Callable from a signal handler."""
        ...

    # models
    def models(self) -> list[ModelCard]: ...

    def resolve(self, model: str | None) -> str:
        """The canonical id for a requested model name (None or "": the default model);
        NotFound if there is none, Unavailable while loading."""
        ...

    def limits(self, model: str | None) -> ModelLimits: ...

    # generation
    async def chat(self, req: ChatRequest) -> EventStream:
        """A chat turn. With `req.session` set (only the session manager sets it) `messages` is
        the whole transcript and the session owns the KV the request builds."""
        ...

    async def complete(self, req: CompletionRequest) -> EventStream: ...

    # tokens (off the event loop)
    async def tokenize(self, model: str | None, text: str, *, add_special: bool = True) -> list[int]: ...

    async def tokenize_chat(self, model: str | None, messages: list[Message]) -> list[int]:
        """The chat template's tokens for `messages` (no generation prompt, no tools)."""
        ...

    async def tokenize_prompt(self, req: ChatRequest) -> list[int]:
        """The prompt tokens `chat(req)` would start from, template and tools and all (/tokenize
        with messages; Anthropic's count_tokens is their number)."""
        ...

    async def token_pieces(self, model: str | None, tokens: list[int]) -> list[str]: ...

    async def detokenize(self, model: str | None, tokens: list[int]) -> str: ...

    # observability
    def stats(self) -> dict[str, ModelStats]:
        """Per model id. Cheap and non-blocking: called at every /metrics scrape."""
        ...

    # capabilities
    @property
    def session_kv(self) -> SessionKV | None:
        """The session-KV capability, or None if this backend has none."""
        ...

    @property
    def prompt_cache(self) -> PromptCache | None:
        """The prompt-cache capability, or None if this backend has none."""
        ...

    @property
    def model_loading(self) -> ModelLoading | None:
        """The model-loading capability, or None if this backend keeps its models loaded."""
        ...

    @property
    def embeddings(self) -> Embeddings | None:
        """The embeddings capability, or None if this backend serves no embedding models."""
        ...


def _required(part: T | None, message: str, code: str) -> T:
    """A backend's optional part, or the 404 that says the routes needing it are not available."""
    if part is None:
        raise NotFound(message, code=code)
    return part


def require_session_kv(backend: Backend) -> SessionKV:
    return _required(backend.session_kv, "this server keeps no sessions: its backend cannot hold a session's KV, "
                     "so the sessions and snapshots APIs (and session_id on requests) are not available",
                     "sessions_unsupported")


def require_prompt_cache(backend: Backend) -> PromptCache:
    return _required(backend.prompt_cache, "this server keeps no prompt cache: its backend has none, so the "
                     "prompt-cache routes are not available", "prompt_cache_unsupported")


def require_model_loading(backend: Backend) -> ModelLoading:
    return _required(backend.model_loading, "this server does not load or unload models on request: its backend "
                     "keeps its models loaded", "model_loading_unsupported")


def require_embeddings(backend: Backend) -> Embeddings:
    return _required(backend.embeddings, "this server does not compute embeddings: its backend has no "
                     "embedding models", "embeddings_unsupported")
