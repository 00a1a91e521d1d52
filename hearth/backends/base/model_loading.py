"""The model-loading capability: models loaded when requests name them, idle ones unloaded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from hearth.backends.base.model_info import ModelCard
from hearth.models import ModelSpec


@dataclass(frozen=True, slots=True)
class LoadStats:
    """One servable model's loads, for /metrics."""

    loaded: bool
    loads: int  # loads that succeeded
    load_failures: int
    load_seconds: float  # all loads together
    loaded_bytes: int  # memory its load took, measured (process RSS after minus before); 0 unloaded


class ModelLoading(Protocol):
    """A backend that loads models when requests name them and unloads idle ones
    (hearth.backends.local.loader): counters, and loading or unloading one on request."""

    def load_stats(self) -> dict[str, LoadStats]:
        """Per model id. Cheap and non-blocking: called at every /metrics scrape."""
        ...

    def is_loaded(self, model: str | None) -> bool:
        """Whether a request for `model` finds it loaded now; True for a name that is not a
        model (the request's own error says so) and while the server starts."""
        ...

    async def load_model(self, model: str, keep_alive: float | None = None) -> ModelCard:
        """Load `model` now (if it is not loaded) and keep it for `keep_alive` seconds from now
        (Ollama's meaning: 0 now, negative forever; None: the server's default); its card."""
        ...

    async def unload_model(self, model: str) -> bool:
        """Unload `model` now; False if it was not loaded. Conflict while requests use it."""
        ...

    def add_model(self, spec: ModelSpec) -> None:
        """Serve `spec` on demand from now on (a model installed while the server runs)."""
        ...

    async def remove_model(self, model: str) -> None:
        """Stop serving `model` (its file is about to be deleted): unloaded first; Conflict while
        requests use it, or for a pinned or default model."""
        ...
