"""The backend contract: what every protocol module talks to.

A backend turns a `ChatRequest` (or a raw `CompletionRequest`) into a stream of
`ChatEvent`s. `chat()` and `complete()` validate eagerly and raise a `HearthError` before
returning the stream, so the HTTP layer can still answer with a 4xx; once the stream is
returned, problems arrive as a `Finish(reason="error")` and `Done(error=...)`.
Closing the stream (`aclose()`, or cancelling the task that iterates it) cancels the work.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
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

    async def chat(self, req: ChatRequest) -> AsyncIterator[ChatEvent]: ...

    async def complete(self, req: CompletionRequest) -> AsyncIterator[ChatEvent]: ...

    def tokenize(self, model: str | None, text: str, *, add_special: bool = True) -> list[int]: ...

    def tokenize_chat(self, model: str | None, messages: list[Message]) -> list[int]: ...

    def token_pieces(self, model: str | None, tokens: list[int]) -> list[str]: ...

    def detokenize(self, model: str | None, tokens: list[int]) -> str: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...
