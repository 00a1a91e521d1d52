"""A session saved as a snapshot, and a snapshot loaded as a new session (the snapshots
themselves, files and manifests, are `hearth.sessions.snapshots`). A snapshot belongs to the
session's owner, whoever asks for it; a loaded session to the snapshot's owner, in that owner's
namespace of ids."""

from __future__ import annotations

import asyncio
from typing import Any

from hearth.backends.base import Backend, KVState, SessionKV, require_session_kv
from hearth.errors import Conflict, NotFound
from hearth.sessions.ids import new_session_id, stored_session_id
from hearth.sessions.lifecycle import Lifecycle
from hearth.sessions.registry import Registry, Session, exclusive, owner_view
from hearth.sessions.snapshots import MemberLimits, SnapshotCorrupt, SnapshotStore
from hearth.tenants import Caller


class SaveLoad:
    def __init__(self, backend: Backend, registry: Registry, lifecycle: Lifecycle, snapshots: SnapshotStore) -> None:
        self.backend = backend
        self.registry = registry
        self.lifecycle = lifecycle
        self.snapshots = snapshots

    def _kv(self) -> SessionKV:
        return require_session_kv(self.backend)

    async def import_limits(self) -> MemberLimits:
        """What an imported snapshot may hold: the longest sequence of any model loaded here
        (asking a model not loaded would load it: on a server that loads models on request,
        only the loaded ones count, or the default model when none is)."""
        kv = self._kv()
        loaded = [c.id for c in self.backend.models() if c.status is None or c.status.get("value") == "loaded"]
        ids = loaded or [self.backend.resolve(None)]
        return MemberLimits(kv_bytes=max([await kv.max_kv_bytes(mid) for mid in ids]),
                            n_tokens=max(self.backend.limits(mid).seq_ctx for mid in ids))

    async def save(self, s: Session, title: str | None, description: str | None,
                   tags: list[str] | None) -> dict[str, Any]:
        """A snapshot of the session; it belongs to the session's owner (whoever asks for it)."""
        async with exclusive(s):
            kv = self._kv()
            state = await kv.export_kv(s.row.model, s.id) or KVState([], b"")
            identity = await kv.kv_identity(s.row.model)
            session = {"session_id": owner_view(s.row.owner).shown(s.id), "n_tokens": len(state.tokens),
                       "max_seq_len": s.row.max_seq_len,
                       "message_count": len(s.row.messages)}
            return await asyncio.to_thread(
                self.snapshots.create, model=identity.model, engine=identity.engine, session=session,
                messages=list(s.row.messages), tokens=state.tokens, kv=state.data, title=title,
                description=description, tags=tags, owner=s.row.owner)

    async def load(self, snap_id: str, sid: str | None, force: bool, caller: Caller) -> dict[str, Any]:
        """A new session from the snapshot; it belongs to the snapshot's owner."""
        kv = self._kv()
        owner = self.snapshots.owner(snap_id, caller)
        manifest = self.snapshots.get(snap_id)
        model_id = (manifest.get("model") or {}).get("id")
        try:
            model_id = self.backend.resolve(model_id or None)
        except NotFound as e:
            raise Conflict(f"snapshot {snap_id} needs model {model_id!r}, which this server does not serve",
                           code="snapshot_incompatible") from e
        identity = await kv.kv_identity(model_id)
        data = await asyncio.to_thread(self.snapshots.read, snap_id, identity.model, identity.engine)
        sid = sid if sid is not None else new_session_id()
        stored_session_id(caller, sid)  # checked as the caller names it
        # The session is the snapshot's owner's: in that tenant's namespace (the caller's own for
        # a tenant, who sees only its snapshots; the admin loads a tenant's under the tenant's name).
        key = stored_session_id(owner_view(owner), sid)
        limit = self.backend.limits(model_id).seq_ctx
        max_seq_len = min(int((manifest.get("session") or {}).get("max_seq_len") or limit), limit)
        await self._make_room(key, sid, force, caller)
        s = self.lifecycle.new(key, model_id, max_seq_len, owner)
        s.row.messages = data.messages
        async with s.lock:
            self.registry.add(s)
            self.registry.store.save(s.row, replace_messages=True)
            if data.tokens:
                try:
                    await kv.import_kv(model_id, key, KVState(data.tokens, data.kv))
                except ValueError as e:  # its KV is not what its tokens say: no session from it
                    self.registry.discard(s)
                    self.registry.store.delete(key)
                    raise SnapshotCorrupt(f"snapshot {snap_id}: {e}") from e
        return await self.lifecycle.describe(s, caller)

    async def _make_room(self, key: str, sid: str, force: bool, caller: Caller) -> None:
        """Free the stored id `key` for a loaded session: a session there is replaced only with
        force, and only one the caller sees."""
        existing = self.registry.stored(key)
        if existing is None:
            return
        if not caller.sees(existing.row.owner):  # one the admin made in this namespace: left alone
            raise Conflict(f"session {sid} already exists", param="session_id", code="session_exists")
        if not force:
            raise Conflict(f"session {sid} already exists; pass force: true to replace it",
                           param="session_id", code="session_exists")
        await self.lifecycle.remove(existing)
