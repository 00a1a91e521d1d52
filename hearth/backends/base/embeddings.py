"""The embeddings capability: vectors from an embedding model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from hearth.chat.cancel import CancelToken


@dataclass(frozen=True, slots=True)
class EmbedRequest:
    """Vectors for `inputs` (texts, or token-id lists used as they are) from an embedding model.
    An input past the model's context is refused (ContextLimit, 400) unless `truncate` (Ollama's
    default) cuts it to the context. `dimensions`: the length the client wants (None: the
    model's own; another length is a 400 unless the model is declared Matryoshka)."""

    model: str | None
    inputs: list[str | list[int]]
    truncate: bool = False
    dimensions: int | None = None
    keep_alive: float | None = None  # Ollama's meaning (seconds; 0 now; negative forever)
    timeout: float | None = None  # bounds the wait for the model's load
    cancel: CancelToken | None = None  # set (the client left): the work is dropped
    request_id: str = ""


@dataclass(frozen=True, slots=True)
class EmbedResult:
    model: str  # the model's id
    vectors: list[list[float]]  # one per input, in order, L2-normalised
    prompt_tokens: int  # every input's tokens, special tokens included
    load_seconds: float  # time waiting for the model's load (Ollama's load_duration)
    total_seconds: float


class Embeddings(Protocol):
    """A backend that serves embedding models (hearth.backends.local.embedding)."""

    async def embed(self, req: EmbedRequest) -> EmbedResult:
        """The vectors, or: NotFound (unknown model), BadRequest (a chat model, a bad input
        or `dimensions`), ContextLimit (an input too long, `truncate` off), Unavailable."""
        ...
