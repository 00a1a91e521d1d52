"""A session's life outside its turns: made (checked against the model's per-sequence context),
described, rolled back, resized, deleted. Every edit of the KV holds the session's lock and is
refused (409) while a turn runs; the transcript is stored before the KV is cut to match it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from hearth.backends.base import Backend, SessionKV, require_session_kv
from hearth.chat.system_turns import SYSTEM_ROLES
from hearth.chat.types import Message
from hearth.errors import BadRequest, Conflict, HearthError, NotFound
from hearth.sessions.ids import new_session_id, stored_session_id
from hearth.sessions.registry import Registry, Session, exclusive
from hearth.sessions.store import SessionRow
from hearth.tenants import Caller

# Hearth's own two, then superlinear's names, which here all mean "reject" (nothing is dropped).
RESIZE_STRATEGIES = ("reject", "drop_oldest", "auto", "gpu", "disk")


class Lifecycle:
    def __init__(self, backend: Backend, registry: Registry) -> None:
        self.backend = backend
        self.registry = registry

    def _kv(self) -> SessionKV:
        return require_session_kv(self.backend)

    def new(self, sid: str, model: str | None, max_seq_len: int | None, owner: str) -> Session:
        """A session not yet registered nor stored: its model resolved, its max_seq_len checked."""
        model_id = self.backend.resolve(model)
        limit = self.backend.limits(model_id).seq_ctx
        if max_seq_len is None:
            max_seq_len = limit
        if not 16 <= max_seq_len <= limit:
            raise BadRequest(f"max_seq_len must be between 16 and {limit} (the server's per-sequence context)",
                             param="max_seq_len")
        now = time.time()
        return Session(SessionRow(sid, model_id, now, now, max_seq_len, owner=owner))

    async def describe(self, s: Session, caller: Caller) -> dict[str, Any]:
        try:
            kv = await self._kv().kv_info(s.row.model, s.id)
            where, n_tokens = kv.residency, kv.n_tokens
        except HearthError:  # model not loaded (yet), or no longer served: the transcript is still there
            where, n_tokens = "none", 0
        row = s.row
        return {"object": "session", "session_id": caller.shown(s.id), "model": row.model,
                "created_at": int(row.created_at),
                "last_used_at": int(row.last_used_at), "current_pos": n_tokens, "max_seq_len": row.max_seq_len,
                "message_count": len(row.messages), "residency": where, "busy": s.lock.locked(),
                # superlinear's names for the same facts (docs/sessions.md)
                "cache_position": n_tokens, "status": "busy" if s.lock.locked() else "idle"}

    async def describe_all(self, caller: Caller) -> list[dict[str, Any]]:
        """The sessions `caller` sees, most recently used first."""
        ordered = sorted(self.registry.visible(caller), key=lambda s: s.row.last_used_at, reverse=True)
        return list(await asyncio.gather(*(self.describe(s, caller) for s in ordered)))

    async def create(self, sid: str | None, model: str | None, max_seq_len: int | None,
                     messages: list[Message] | None, caller: Caller) -> dict[str, Any]:
        self._kv()
        sid = sid if sid is not None else new_session_id()
        key = stored_session_id(caller, sid)  # another tenant's ids are not in this namespace
        if key in self.registry or self.registry.find(sid, caller) is not None:
            raise Conflict(f"session {sid} already exists", param="session_id", code="session_exists")
        s = self.new(key, model, max_seq_len, caller.tenant)
        if messages:
            s.row.messages = list(messages)
        self.registry.store.save(s.row, replace_messages=True)
        self.registry.add(s)
        return await self.describe(s, caller)

    async def remove(self, s: Session) -> None:
        async with exclusive(s):
            with contextlib.suppress(NotFound):  # its model is no longer served: no KV of it to drop
                await self._kv().drop_kv(s.row.model, s.id)
            self.registry.store.delete(s.id)
            self.registry.discard(s)

    async def rollback(self, s: Session, keep_messages: int, caller: Caller) -> dict[str, Any]:
        async with exclusive(s):
            if not 0 <= keep_messages <= len(s.row.messages):
                raise BadRequest(f"keep_messages must be between 0 and {len(s.row.messages)} "
                                 "(the session's message count)", param="keep_messages")
            s.row.messages = s.row.messages[:keep_messages]
            s.row.last_used_at = time.time()
            self.registry.store.save(s.row, replace_messages=True)
            await self._trim(s)
        return await self.describe(s, caller)  # outside the lock: an idle session is not busy

    async def resize(self, s: Session, max_seq_len: int, strategy: str, caller: Caller) -> dict[str, Any]:
        if strategy not in RESIZE_STRATEGIES:
            raise BadRequest(f"strategy must be one of {', '.join(RESIZE_STRATEGIES)}", param="strategy")
        mode = "drop_oldest" if strategy == "drop_oldest" else "reject"  # superlinear's auto|gpu|disk: no loss
        async with exclusive(s):
            limit = self.backend.limits(s.row.model).seq_ctx
            if not 16 <= max_seq_len <= limit:
                raise BadRequest(f"max_seq_len must be between 16 and {limit} (the server's per-sequence "
                                 "context; start the server with a larger --ctx for more)", param="max_seq_len")
            messages = await self._fitted(s, max_seq_len, mode)
            old_max = s.row.max_seq_len
            s.row.messages, s.row.max_seq_len = messages, max_seq_len
            self.registry.store.save(s.row, replace_messages=True)
            await self._trim(s)
        return {**await self.describe(s, caller), "old_max_seq_len": old_max, "strategy": strategy, "mode": mode}

    async def _fitted(self, s: Session, max_seq_len: int, mode: str) -> list[Message]:
        """The transcript that fits in `max_seq_len`: as it is, or (drop_oldest) without its oldest
        messages after the system message."""
        messages = list(s.row.messages)
        needed = await self._count(s.row.model, messages)
        if needed < max_seq_len:
            return messages
        if mode == "reject":
            raise BadRequest(f"session {s.id} already holds {needed} tokens of transcript, more than "
                             f"max_seq_len {max_seq_len}; roll back first or use strategy drop_oldest",
                             param="max_seq_len")
        head = 1 if messages and messages[0].role in SYSTEM_ROLES else 0
        while len(messages) > head and await self._count(s.row.model, messages) >= max_seq_len:
            del messages[head]
        if await self._count(s.row.model, messages) >= max_seq_len:
            raise BadRequest(f"the system message alone does not fit in {max_seq_len} tokens", param="max_seq_len")
        return messages

    async def resize_next_pow2(self, s: Session, caller: Caller) -> dict[str, Any]:
        limit = self.backend.limits(s.row.model).seq_ctx
        if s.row.max_seq_len >= limit:
            raise BadRequest(f"session {s.id} is already at the server's per-sequence context ({limit} tokens); "
                             "start the server with a larger --ctx", param="max_seq_len")
        return await self.resize(s, min(1 << s.row.max_seq_len.bit_length(), limit), "reject", caller)

    async def _trim(self, s: Session) -> None:
        """Cut the session's KV to what its (shorter) transcript still starts with, so
        `current_pos` never counts dropped turns or exceeds `max_seq_len`."""
        tokens = await self.backend.tokenize_chat(s.row.model, s.row.messages) if s.row.messages else []
        await self._kv().trim_kv(s.row.model, s.id, tokens)

    async def _count(self, model: str, messages: list[Message]) -> int:
        return len(await self.backend.tokenize_chat(model, messages)) if messages else 0
