"""The local backend's session-KV capability: a session's KV in this process's engines (a slot,
host RAM or disk), moved by calls that run on the engine thread between steps.

A session's model may not be loaded: its KV is then on disk (the engine wrote it there when
the model was unloaded). Where it is and dropping it need no model (the swap file is read or
removed); exporting, importing and trimming it load the model, as a turn would."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from hearth.backends.base import KVIdentity, KVInfo, KVState, Residency
from hearth.backends.local.model_set import ModelSet
from hearth.engine import Engine
from hearth.engine.swap import check_owner, read_kv_header
from hearth.errors import Conflict
from hearth.hashing import sha256_file

T = TypeVar("T")

_RESIDENCY: dict[str, Residency] = {"resident": "resident", "host": "host", "disk": "disk"}


class LocalSessionKV:
    def __init__(self, models: ModelSet) -> None:
        self._models = models
        self._model_sha: dict[str, str] = {}

    def _swap_file(self, model: str, session_id: str) -> Path | None:
        """Where the session's KV is written when its model is unloaded (None: RAM only)."""
        folder = self._models.swap_dir(self._models.resolve(model))
        check_owner(session_id)
        return folder / f"{session_id}.kv" if folder is not None else None

    async def kv_info(self, model: str, session_id: str) -> KVInfo:
        m = self._models.loaded_model(model)
        if m is None:  # not loaded: its KV, if it has any, is in its swap file
            path = self._swap_file(model, session_id)
            try:
                n_tokens = read_kv_header(path) if path is not None and path.is_file() else None
            except (OSError, ValueError):
                n_tokens = None
            return KVInfo("disk", n_tokens) if n_tokens is not None else KVInfo("none", 0)
        # A racy read of the engine's tables from this thread: good enough for reporting.
        where, n_tokens = m.engine.residency.kv_where(session_id)
        return KVInfo(_RESIDENCY.get(where, "none"), n_tokens)

    async def export_kv(self, model: str, session_id: str) -> KVState | None:
        got = await self._on_engine(model, session_id, lambda e: e.residency.export_kv(session_id))
        return KVState(*got) if got is not None else None

    async def import_kv(self, model: str, session_id: str, state: KVState) -> None:
        await self._on_engine(model, session_id, lambda e: e.residency.import_kv(session_id, state.tokens, state.data))

    async def drop_kv(self, model: str, session_id: str) -> None:
        if self._models.loader.entry(self._models.resolve(model)).state == "unloaded":
            # no engine owns its files now: remove it here rather than load the model to drop it
            path = self._swap_file(model, session_id)
            if path is not None:
                path.unlink(missing_ok=True)
            return
        await self._on_engine(model, session_id, lambda e: e.residency.drop_kv(session_id))

    async def trim_kv(self, model: str, session_id: str, tokens: list[int]) -> int:
        return await self._on_engine(model, session_id, lambda e: e.residency.trim_kv(session_id, tokens))

    async def kv_identity(self, model: str) -> KVIdentity:
        async with self._models.using(model) as m:
            sha = self._model_sha.get(m.spec.id)
            if sha is None:  # hashing a multi-GB file takes seconds: once, off the loop
                sha = self._model_sha[m.spec.id] = await asyncio.to_thread(sha256_file, m.spec.path)
            identity: dict[str, Any] = {"id": m.spec.id, "sha256": sha, "arch": m.card.meta.get("architecture"),
                                        "n_ctx_train": m.card.meta.get("n_ctx_train")}
            # The runner's fingerprint is the one description of what KV bytes depend on (swap files
            # are checked against it too); its kv_type comes from the llama.cpp context.
            return KVIdentity(identity, dict(m.runner.fingerprint))

    async def max_kv_bytes(self, model: str) -> int:
        async with self._models.using(model) as m:
            return m.runner.state_bytes_bound(m.engine.seq_ctx)

    async def _on_engine(self, model: str, session_id: str, fn: Callable[[Engine], T]) -> T:
        async with self._models.using(model) as m:  # held: it is not unloaded under the call
            engine = m.engine
            try:
                return await asyncio.wrap_future(engine.call(lambda: fn(engine)))
            except RuntimeError as e:  # its last turn is still leaving the engine, or the engine stops
                raise Conflict(f"session {session_id} is busy: {e}; retry shortly", param="session_id",
                               code="session_busy") from e
