"""The backend contract: what every protocol module talks to.

A backend turns a `ChatRequest` (or a raw `CompletionRequest`) into a stream of
`ChatEvent`s. `chat()` and `complete()` validate eagerly and raise a `HearthError` before
returning the stream, so the HTTP layer can still answer with a 4xx; once the stream is
returned, problems arrive as a `Finish(reason="error")` and `Done(error=...)`.
Closing the stream (`aclose()`, or cancelling the task that iterates it) cancels the work.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from hearth.chat.types import ChatEvent, ChatRequest, CompletionRequest, Message


@dataclass(slots=True)
class ModelCard:
    id: str
    created: int
    owned_by: str = "hearth"
    meta: dict[str, Any] = field(default_factory=dict)


class Backend(Protocol):
    @property
    def ready(self) -> bool: ...

    def models(self) -> list[ModelCard]: ...

    def resolve(self, model: str | None) -> str:
        """The canonical id for a requested model name; NotFound if there is none."""
        ...

    async def chat(self, req: ChatRequest) -> EventStream: ...

    async def complete(self, req: CompletionRequest) -> EventStream: ...

    def tokenize(self, model: str | None, text: str, *, add_special: bool = True) -> list[int]: ...

    def tokenize_chat(self, model: str | None, messages: list[Message]) -> list[int]: ...

    def tokenize_request(self, req: ChatRequest) -> list[int]:
        """The prompt tokens `chat(req)` would generate from (chat template, tools and all)."""
        ...

    def token_pieces(self, model: str | None, tokens: list[int]) -> list[str]: ...

    def detokenize(self, model: str | None, tokens: list[int]) -> str: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class EventStream:
    """A stream of ChatEvents whose cleanups always run exactly once: when it is exhausted,
    or on `aclose()`, even if it was never iterated (an async generator that never started
    would skip its `finally`, leaking whatever the backend reserved for it)."""

    def __init__(self, events: AsyncIterator[ChatEvent], on_close: list[Callable[[], None]] | None = None) -> None:
        self._events = events
        self._on_close = on_close or []
        self._observers: list[Callable[[ChatEvent], None]] = []
        self._closed = False

    def observe(self, fn: Callable[[ChatEvent], None]) -> None:
        """Call `fn` with every event as it passes (metrics, logging)."""
        self._observers.append(fn)

    def on_close(self, fn: Callable[[], None]) -> None:
        if self._closed:
            fn()
        else:
            self._on_close.append(fn)

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> ChatEvent:
        try:
            ev = await self._events.__anext__()
        except StopAsyncIteration:
            self._cleanup()
            raise
        for fn in self._observers:
            fn(ev)
        return ev

    async def aclose(self) -> None:
        try:
            aclose = getattr(self._events, "aclose", None)
            if aclose is not None:
                await aclose()
        finally:
            self._cleanup()

    def _cleanup(self) -> None:
        if self._closed:
            return
        self._closed = True
        for cb in self._on_close:
            cb()
