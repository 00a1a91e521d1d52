"""The session-KV capability: where a session's KV lives, and moving it between backends and
snapshots."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

Residency = Literal["resident", "host", "disk", "none"]


@dataclass(frozen=True, slots=True)
class KVInfo:
    """Where a session's KV lives and how many tokens it holds: `resident` in a slot, `host`
    RAM or `disk` after a swap-out, `none` (never ran, dropped, or on a backend that lost it)."""

    residency: Residency
    n_tokens: int


@dataclass(frozen=True, slots=True)
class KVState:
    """A session's KV as it moves between backends and snapshots: the exact token ids it holds
    and the engine's opaque bytes for them (llama.cpp seq-state here). Raw bytes only: never
    pickled, never parsed above the backend."""

    tokens: list[int]
    data: bytes


@dataclass(frozen=True, slots=True)
class KVIdentity:
    """What KV bytes depend on. A snapshot saved under one identity loads only where
    `model["sha256"]` and the whole `engine` dict are equal (409 otherwise).

    model:  {id, sha256 (of the weights file, 64 lowercase hex digits), arch, n_ctx_train}
    engine: the runner's fingerprint: engine build, KV layout and KV type (`kv_type`)."""

    model: dict[str, Any]
    engine: dict[str, Any]


class SessionKV(Protocol):
    """The session-KV capability, keyed by (model id, session id). Session ids are already
    validated (`hearth.ids.is_session_id`). A session's KV must not be in use by a running turn
    when it is exported, imported or dropped: those raise `Conflict(code="session_busy")`
    then. A remote backend implements each method with one HTTP call to the node holding
    the session."""

    async def kv_info(self, model: str, session_id: str) -> KVInfo: ...

    async def export_kv(self, model: str, session_id: str) -> KVState | None:
        """A copy of the session's tokens and KV bytes, wherever they live; None if it has none."""
        ...

    async def import_kv(self, model: str, session_id: str, state: KVState) -> None:
        """Make `state` the session's KV (replacing any), used from its next turn on.
        ValueError if the bytes do not fit this engine."""
        ...

    async def drop_kv(self, model: str, session_id: str) -> None:
        """Forget the session's KV, wherever it lives (a no-op if there is none)."""
        ...

    async def trim_kv(self, model: str, session_id: str, tokens: list[int]) -> int:
        """Cut the session's KV to its common prefix with `tokens` (its transcript after a
        rollback or resize); returns how many tokens it keeps (0 if it has none)."""
        ...

    async def kv_identity(self, model: str) -> KVIdentity: ...

    async def max_kv_bytes(self, model: str) -> int:
        """At most how many bytes `export_kv` gives for a session as long as the model's
        longest sequence: imported KV past this is refused before it is read."""
        ...
