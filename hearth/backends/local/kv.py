"""The local backend's session-KV capability: a session's KV in this process's engines (a slot,
host RAM or disk), moved by calls that run on the engine thread between steps."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from hearth.backends.base import KVIdentity, KVInfo, KVState, Residency
from hearth.backends.local.model import LocalModel
from hearth.engine import Engine
from hearth.errors import Conflict
from hearth.hashing import sha256_file

T = TypeVar("T")

_RESIDENCY: dict[str, Residency] = {"resident": "resident", "host": "host", "disk": "disk"}


class LocalSessionKV:
    def __init__(self, lookup: Callable[[str | None], LocalModel]) -> None:
        self._lookup = lookup
        self._model_sha: dict[str, str] = {}

    async def kv_info(self, model: str, session_id: str) -> KVInfo:
        # A racy read of the engine's tables from this thread: good enough for reporting.
        where, n_tokens = self._lookup(model).engine.kv_where(session_id)
        return KVInfo(_RESIDENCY.get(where, "none"), n_tokens)

    async def export_kv(self, model: str, session_id: str) -> KVState | None:
        got = await self._on_engine(model, session_id, lambda e: e.export_kv(session_id))
        return KVState(*got) if got is not None else None

    async def import_kv(self, model: str, session_id: str, state: KVState) -> None:
        await self._on_engine(model, session_id, lambda e: e.import_kv(session_id, state.tokens, state.data))

    async def drop_kv(self, model: str, session_id: str) -> None:
        await self._on_engine(model, session_id, lambda e: e.drop_kv(session_id))

    async def trim_kv(self, model: str, session_id: str, tokens: list[int]) -> int:
        return await self._on_engine(model, session_id, lambda e: e.trim_kv(session_id, tokens))

    async def kv_identity(self, model: str) -> KVIdentity:
        m = self._lookup(model)
        sha = self._model_sha.get(m.spec.id)
        if sha is None:  # hashing a multi-GB file takes seconds: once, off the loop
            sha = self._model_sha[m.spec.id] = await asyncio.to_thread(sha256_file, m.spec.path)
        identity: dict[str, Any] = {"id": m.spec.id, "sha256": sha, "arch": m.card.meta.get("architecture"),
                                    "n_ctx_train": m.card.meta.get("n_ctx_train")}
        # The runner's fingerprint is the one description of what KV bytes depend on (swap files
        # are checked against it too); its kv_type comes from the llama.cpp context.
        return KVIdentity(identity, dict(m.runner.fingerprint))

    async def max_kv_bytes(self, model: str) -> int:
        m = self._lookup(model)
        return m.runner.state_bytes_bound(m.engine.seq_ctx)

    async def _on_engine(self, model: str, session_id: str, fn: Callable[[Engine], T]) -> T:
        engine = self._lookup(model).engine
        try:
            return await asyncio.wrap_future(engine.call(lambda: fn(engine)))
        except RuntimeError as e:  # its last turn is still leaving the engine, or the engine stops
            raise Conflict(f"session {session_id} is busy: {e}; retry shortly", param="session_id",
                           code="session_busy") from e
