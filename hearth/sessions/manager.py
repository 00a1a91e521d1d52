"""Sessions: transcripts that own KV, one turn at a time, over any backend with the session-KV
capability (`hearth.backends.base.SessionKV`). `SessionManager` is the one object the routes and
`SessionBackend` hold; it composes four parts, each one concept:

- `registry`: the sessions by id, the tenant namespaces of ids, a session's lock;
- `lifecycle`: made, described, rolled back, resized, deleted;
- `save_load`: a session saved as a snapshot, a snapshot loaded as a session;
- `turns`: a turn over the stored transcript, its reply committed when it ends.

Invariants:
- at most one turn per session runs; others wait on the session's lock (or get 409);
- every operation that touches a session's KV (delete, save, load, rollback, resize) holds the
  lock, and refuses a busy session (409);
- nothing is stored for a turn that never reached the engine (a 4xx, a 429);
- every operation first checks the backend's session-KV capability (`_kv`), so a backend
  without it answers 404 sessions_unsupported everywhere, never a later error; then every lookup
  by id goes through the registry with the caller (another tenant's session is a 404).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hearth.backends.base import Backend, EventStream, SessionKV, require_session_kv
from hearth.chat.types import ChatRequest, Message
from hearth.sessions.lifecycle import Lifecycle
from hearth.sessions.registry import Registry, Session
from hearth.sessions.save_load import SaveLoad
from hearth.sessions.snapshots import MemberLimits, SnapshotStore
from hearth.sessions.store import SessionStore
from hearth.sessions.transcript import message_to_json
from hearth.sessions.turns import Turns
from hearth.tenants import OPEN, Caller


class SessionManager:
    """Sessions over any backend that has the session-KV capability; without it every
    operation answers the contract's one error (404 `sessions_unsupported`)."""

    def __init__(self, backend: Backend, data_dir: Path) -> None:
        self.backend = backend
        self.store = SessionStore(data_dir / "sessions.db")
        self.registry = Registry(self.store)
        self._snapshots = SnapshotStore(data_dir / "snapshots")
        self._lifecycle = Lifecycle(backend, self.registry)
        self._save_load = SaveLoad(backend, self.registry, self._lifecycle, self._snapshots)
        self._turns = Turns(backend, self.registry, self._lifecycle)

    def close(self) -> None:
        self.store.close()

    def _kv(self) -> SessionKV:
        """The backend's session-KV capability; checked first by every operation."""
        return require_session_kv(self.backend)

    def _get(self, sid: str, caller: Caller) -> Session:
        self._kv()
        return self.registry.get(sid, caller)

    @property
    def snapshots(self) -> SnapshotStore:
        self._kv()  # snapshots hold KV: no capability, no snapshots
        return self._snapshots

    # ---- lookups -----------------------------------------------------------------------------

    def owner(self, sid: str, caller: Caller = OPEN) -> str:
        """The owner of a session `caller` sees (404 otherwise)."""
        return self._get(sid, caller).row.owner

    def visible_ids(self, caller: Caller) -> set[str]:
        """The ids of the sessions `caller` sees (no capability needed: none, then)."""
        return {s.id for s in self.registry.visible(caller)}

    async def info(self, sid: str, caller: Caller = OPEN) -> dict[str, Any]:
        return await self._lifecycle.describe(self._get(sid, caller), caller)

    async def list_all(self, caller: Caller = OPEN) -> list[dict[str, Any]]:
        self._kv()
        return await self._lifecycle.describe_all(caller)

    def history(self, sid: str, caller: Caller = OPEN) -> list[dict[str, Any]]:
        return [message_to_json(m) for m in self._get(sid, caller).row.messages]

    # ---- lifecycle ---------------------------------------------------------------------------

    async def create(self, sid: str | None = None, model: str | None = None, max_seq_len: int | None = None,
                     messages: list[Message] | None = None, caller: Caller = OPEN) -> dict[str, Any]:
        return await self._lifecycle.create(sid, model, max_seq_len, messages, caller)

    async def delete(self, sid: str, caller: Caller = OPEN) -> None:
        await self._lifecycle.remove(self._get(sid, caller))

    async def rollback(self, sid: str, keep_messages: int, caller: Caller = OPEN) -> dict[str, Any]:
        return await self._lifecycle.rollback(self._get(sid, caller), keep_messages, caller)

    async def resize(self, sid: str, max_seq_len: int, strategy: str = "reject",
                     caller: Caller = OPEN) -> dict[str, Any]:
        return await self._lifecycle.resize(self._get(sid, caller), max_seq_len, strategy, caller)

    async def resize_next_pow2(self, sid: str, caller: Caller = OPEN) -> dict[str, Any]:
        return await self._lifecycle.resize_next_pow2(self._get(sid, caller), caller)

    # ---- snapshots -----------------------------------------------------------------------------

    async def import_limits(self) -> MemberLimits:
        return await self._save_load.import_limits()

    async def save(self, sid: str, title: str | None = None, description: str | None = None,
                   tags: list[str] | None = None, caller: Caller = OPEN) -> dict[str, Any]:
        return await self._save_load.save(self._get(sid, caller), title, description, tags)

    async def load(self, snap_id: str, sid: str | None = None, force: bool = False,
                   caller: Caller = OPEN) -> dict[str, Any]:
        return await self._save_load.load(snap_id, sid, force, caller)

    # ---- turns ---------------------------------------------------------------------------------

    async def turn(self, req: ChatRequest) -> EventStream:
        return await self._turns.turn(req)
