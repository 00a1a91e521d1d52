"""Sessions: transcripts that own KV, one turn at a time, over any backend with the session-KV
capability (`hearth.backends.base.SessionKV`).

A turn takes the stored transcript, adds the request's new messages, and hands the whole
conversation to the backend with `session` still set, so the session owns the KV the backend
builds: the local engine finds the longest common token prefix between the rendered prompt and
the tokens in the session's KV (wherever that KV is: in a slot, in RAM, on disk) and prefills
only the rest. The reply is recorded from the event stream and committed with the new messages
when the turn ends, by whatever path (done, cancelled, failed, client gone), so the transcript
always describes the tokens in the KV up to reconciliation.

Invariants:
- at most one turn per session runs; others wait on the session's lock (or get 409);
- every operation that touches a session's KV (delete, save, load, rollback) holds the lock;
- nothing is stored for a turn that never reached the engine (a 4xx, a 429);
- every lookup by id goes through `_find` with the caller: another tenant's session is the same
  404 as one that does not exist (hearth.tenants). A tenant's session ids are its own namespace
  (stored as `t<hash>.<id>`, `Caller.session_key`): an id another tenant holds is free for it,
  exactly as an id nobody holds, and the tenant sees its sessions under its own ids. The admin
  names a session by its stored id, or by its tenant's name for it when one tenant only has it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hearth.backends.base import Backend, EventStream, KVState, SessionKV, require_session_kv
from hearth.chat.continuation import merged
from hearth.chat.types import (
    ChatEvent,
    ChatRequest,
    Done,
    Message,
    ReasoningDelta,
    Started,
    TextDelta,
    ToolCall,
    ToolCallDelta,
)
from hearth.errors import BadRequest, Conflict, ContextLimit, HearthError, NotFound
from hearth.sessions.ids import check_session_id, new_session_id, stored_session_id
from hearth.sessions.snapshots import MemberLimits, SnapshotCorrupt, SnapshotStore
from hearth.sessions.store import SessionRow, SessionStore
from hearth.sessions.transcript import message_to_json
from hearth.tenants import ADMIN, OPEN, Caller

# Hearth's own two, then superlinear's names, which here all mean "reject" (nothing is dropped).
RESIZE_STRATEGIES = ("reject", "drop_oldest", "auto", "gpu", "disk")

log = logging.getLogger("hearth.sessions")

SYSTEM_ROLES = ("system", "developer")


@dataclass(slots=True)
class _Session:
    row: SessionRow
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    persisted: bool = True  # False for a session made by a first turn that has not run yet

    @property
    def id(self) -> str:
        return self.row.id


class _Reply:
    """What candidate 0 said, gathered from the events as they pass."""

    def __init__(self) -> None:
        self.started = False
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, ToolCall] = {}

    def __call__(self, ev: ChatEvent) -> None:
        if isinstance(ev, Started):
            self.started = True
        elif isinstance(ev, TextDelta) and ev.index == 0:
            self.text.append(ev.text)
        elif isinstance(ev, ReasoningDelta) and ev.index == 0:
            self.reasoning.append(ev.text)
        elif isinstance(ev, ToolCallDelta) and ev.index == 0:
            call = self.calls.setdefault(ev.call_index, ToolCall(ev.id or "", ev.name or "", ""))
            call.arguments += ev.arguments

    def message(self, discard_thinking: bool) -> Message:
        calls = [self.calls[k] for k in sorted(self.calls)] or None
        reasoning = "".join(self.reasoning) or None
        return Message("assistant", "".join(self.text), tool_calls=calls,
                       reasoning=None if discard_thinking else reasoning)


def owner_view(owner: str) -> Caller:
    """How the owner of a session names it (a snapshot's manifest records that name)."""
    return OPEN if owner == ADMIN else Caller(owner, owner)


class SessionManager:
    """Sessions over any backend that has the session-KV capability; without it every
    operation answers the contract's one error (404 `sessions_unsupported`)."""

    def __init__(self, backend: Backend, data_dir: Path) -> None:
        self.backend = backend
        self.store = SessionStore(data_dir / "sessions.db")
        self._snapshots = SnapshotStore(data_dir / "snapshots")
        self._sessions: dict[str, _Session] = {s.id: _Session(s) for s in self.store.load_all()}

    def close(self) -> None:
        self.store.close()

    def _kv(self) -> SessionKV:
        """The backend's session-KV capability; checked first by every operation, so a backend
        without it answers 404 sessions_unsupported everywhere, never a later error."""
        return require_session_kv(self.backend)

    @property
    def snapshots(self) -> SnapshotStore:
        self._kv()  # snapshots hold KV: no capability, no snapshots
        return self._snapshots

    # ---- lookups -----------------------------------------------------------------------------

    def _find(self, sid: str, caller: Caller) -> _Session | None:
        """The session `caller` names `sid`, if it sees one: a tenant's ids are its own namespace
        (hearth.tenants, `Caller.session_key`); one stored before namespaces is found by its
        plain id."""
        key = stored_session_id(caller, sid)
        s = self._sessions.get(key)
        if s is None and not caller.admin:
            s = self._sessions.get(caller.shown(key))
        if s is None and caller.admin:  # a tenant's session by the name its tenant gives it, if one only
            named = [t for t in self._sessions.values() if t.id == owner_view(t.row.owner).session_key(sid)]
            if len(named) > 1:
                raise Conflict(f"{len(named)} tenants have a session {sid}: name it by its stored id "
                               "(GET /v1/sessions lists them)", param="session_id", code="session_ambiguous")
            s = named[0] if named else None
        return s if s is not None and caller.sees(s.row.owner) else None

    def _get(self, sid: str, caller: Caller) -> _Session:
        self._kv()
        s = self._find(sid, caller)
        if s is None:
            raise NotFound(f"session {sid} not found", param="session_id", code="session_not_found")
        return s

    def owner(self, sid: str, caller: Caller = OPEN) -> str:
        """The owner of a session `caller` sees (404 otherwise)."""
        return self._get(sid, caller).row.owner

    def visible_ids(self, caller: Caller) -> set[str]:
        """The ids of the sessions `caller` sees (no capability needed: none, then)."""
        return {sid for sid, s in self._sessions.items() if caller.sees(s.row.owner)}

    async def info(self, sid: str, caller: Caller = OPEN) -> dict[str, Any]:
        return await self._describe(self._get(sid, caller), caller)

    async def _describe(self, s: _Session, caller: Caller) -> dict[str, Any]:
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

    async def list_all(self, caller: Caller = OPEN) -> list[dict[str, Any]]:
        self._kv()
        visible = [s for s in self._sessions.values() if caller.sees(s.row.owner)]
        ordered = sorted(visible, key=lambda s: s.row.last_used_at, reverse=True)
        return list(await asyncio.gather(*(self._describe(s, caller) for s in ordered)))

    def history(self, sid: str, caller: Caller = OPEN) -> list[dict[str, Any]]:
        return [message_to_json(m) for m in self._get(sid, caller).row.messages]

    # ---- lifecycle ---------------------------------------------------------------------------

    async def create(self, sid: str | None = None, model: str | None = None, max_seq_len: int | None = None,
                     messages: list[Message] | None = None, caller: Caller = OPEN) -> dict[str, Any]:
        self._kv()
        sid = sid if sid is not None else new_session_id()
        key = stored_session_id(caller, sid)  # another tenant's ids are not in this namespace
        if key in self._sessions or self._find(sid, caller) is not None:
            raise Conflict(f"session {sid} already exists", param="session_id", code="session_exists")
        s = self._new(key, model, max_seq_len, caller.tenant)
        if messages:
            s.row.messages = list(messages)
        self.store.save(s.row, replace_messages=True)
        self._sessions[key] = s
        return await self._describe(s, caller)

    def _new(self, sid: str, model: str | None, max_seq_len: int | None, owner: str) -> _Session:
        model_id = self.backend.resolve(model)
        limit = self.backend.limits(model_id).seq_ctx
        if max_seq_len is None:
            max_seq_len = limit
        if not 16 <= max_seq_len <= limit:
            raise BadRequest(f"max_seq_len must be between 16 and {limit} (the server's per-sequence context)",
                             param="max_seq_len")
        now = time.time()
        return _Session(SessionRow(sid, model_id, now, now, max_seq_len, owner=owner))

    async def delete(self, sid: str, caller: Caller = OPEN) -> None:
        await self._remove(self._get(sid, caller))

    async def _remove(self, s: _Session) -> None:
        async with self._exclusive(s):
            await self._drop_kv(s)
            self.store.delete(s.id)
            del self._sessions[s.id]

    async def _drop_kv(self, s: _Session) -> None:
        with contextlib.suppress(NotFound):  # its model is no longer served: no KV of it to drop
            await self._kv().drop_kv(s.row.model, s.id)

    async def rollback(self, sid: str, keep_messages: int, caller: Caller = OPEN) -> dict[str, Any]:
        s = self._get(sid, caller)
        async with self._exclusive(s):
            if not 0 <= keep_messages <= len(s.row.messages):
                raise BadRequest(f"keep_messages must be between 0 and {len(s.row.messages)} "
                                 "(the session's message count)", param="keep_messages")
            s.row.messages = s.row.messages[:keep_messages]
            s.row.last_used_at = time.time()
            self.store.save(s.row, replace_messages=True)
            await self._trim(s)
        return await self._describe(s, caller)  # outside the lock: an idle session is not busy

    async def resize(self, sid: str, max_seq_len: int, strategy: str = "reject",
                     caller: Caller = OPEN) -> dict[str, Any]:
        s = self._get(sid, caller)
        if strategy not in RESIZE_STRATEGIES:
            raise BadRequest(f"strategy must be one of {', '.join(RESIZE_STRATEGIES)}", param="strategy")
        mode = "drop_oldest" if strategy == "drop_oldest" else "reject"  # superlinear's auto|gpu|disk: no loss
        async with self._exclusive(s):
            limit = self.backend.limits(s.row.model).seq_ctx
            if not 16 <= max_seq_len <= limit:
                raise BadRequest(f"max_seq_len must be between 16 and {limit} (the server's per-sequence "
                                 "context; start the server with a larger --ctx for more)", param="max_seq_len")
            messages = list(s.row.messages)
            needed = await self._count(s.row.model, messages)
            if needed >= max_seq_len:
                if mode == "reject":
                    raise BadRequest(f"session {s.id} already holds {needed} tokens of transcript, more than "
                                     f"max_seq_len {max_seq_len}; roll back first or use strategy drop_oldest",
                                     param="max_seq_len")
                head = 1 if messages and messages[0].role in SYSTEM_ROLES else 0
                while len(messages) > head and await self._count(s.row.model, messages) >= max_seq_len:
                    del messages[head]
                if await self._count(s.row.model, messages) >= max_seq_len:
                    raise BadRequest(f"the system message alone does not fit in {max_seq_len} tokens",
                                     param="max_seq_len")
            old_max = s.row.max_seq_len
            s.row.messages, s.row.max_seq_len = messages, max_seq_len
            self.store.save(s.row, replace_messages=True)
            await self._trim(s)
        return {**await self._describe(s, caller), "old_max_seq_len": old_max, "strategy": strategy, "mode": mode}

    async def _trim(self, s: _Session) -> None:
        """Cut the session's KV to what its (shorter) transcript still starts with, so
        `current_pos` never counts dropped turns or exceeds `max_seq_len`."""
        tokens = await self.backend.tokenize_chat(s.row.model, s.row.messages) if s.row.messages else []
        await self._kv().trim_kv(s.row.model, s.id, tokens)

    async def resize_next_pow2(self, sid: str, caller: Caller = OPEN) -> dict[str, Any]:
        s = self._get(sid, caller)
        limit = self.backend.limits(s.row.model).seq_ctx
        if s.row.max_seq_len >= limit:
            raise BadRequest(f"session {s.id} is already at the server's per-sequence context ({limit} tokens); "
                             "start the server with a larger --ctx", param="max_seq_len")
        return await self.resize(sid, min(1 << s.row.max_seq_len.bit_length(), limit), caller=caller)

    async def _count(self, model: str, messages: list[Message]) -> int:
        return len(await self.backend.tokenize_chat(model, messages)) if messages else 0

    # ---- snapshots -----------------------------------------------------------------------------

    async def import_limits(self) -> MemberLimits:
        """What an imported snapshot may hold: the longest sequence of any model loaded here
        (asking a model not loaded would load it: on a server that loads models on request,
        only the loaded ones count, or the default model when none is)."""
        kv = self._kv()
        loaded = [c.id for c in self.backend.models() if c.status is None or c.status.get("value") == "loaded"]
        ids = loaded or [self.backend.resolve(None)]
        return MemberLimits(kv_bytes=max([await kv.max_kv_bytes(mid) for mid in ids]),
                            n_tokens=max(self.backend.limits(mid).seq_ctx for mid in ids))

    async def save(self, sid: str, title: str | None = None, description: str | None = None,
                   tags: list[str] | None = None, caller: Caller = OPEN) -> dict[str, Any]:
        """A snapshot of the session; it belongs to the session's owner (whoever asks for it)."""
        s = self._get(sid, caller)
        async with self._exclusive(s):
            kv = self._kv()
            state = await kv.export_kv(s.row.model, s.id) or KVState([], b"")
            identity = await kv.kv_identity(s.row.model)
            session = {"session_id": owner_view(s.row.owner).shown(s.id), "n_tokens": len(state.tokens),
                       "max_seq_len": s.row.max_seq_len,
                       "message_count": len(s.row.messages)}
            return await asyncio.to_thread(
                self._snapshots.create, model=identity.model, engine=identity.engine, session=session,
                messages=list(s.row.messages), tokens=state.tokens, kv=state.data, title=title,
                description=description, tags=tags, owner=s.row.owner)

    async def load(self, snap_id: str, sid: str | None = None, force: bool = False,
                   caller: Caller = OPEN) -> dict[str, Any]:
        """A new session from the snapshot; it belongs to the snapshot's owner."""
        kv = self._kv()
        owner = self._snapshots.owner(snap_id, caller)
        manifest = self._snapshots.get(snap_id)
        model_id = (manifest.get("model") or {}).get("id")
        try:
            model_id = self.backend.resolve(model_id or None)
        except NotFound as e:
            raise Conflict(f"snapshot {snap_id} needs model {model_id!r}, which this server does not serve",
                           code="snapshot_incompatible") from e
        identity = await kv.kv_identity(model_id)
        data = await asyncio.to_thread(self._snapshots.read, snap_id, identity.model, identity.engine)
        sid = sid if sid is not None else new_session_id()
        stored_session_id(caller, sid)  # checked as the caller names it
        # The session is the snapshot's owner's: in that tenant's namespace (the caller's own for
        # a tenant, who sees only its snapshots; the admin loads a tenant's under the tenant's name).
        key = stored_session_id(owner_view(owner), sid)
        limit = self.backend.limits(model_id).seq_ctx
        max_seq_len = min(int((manifest.get("session") or {}).get("max_seq_len") or limit), limit)
        existing = self._sessions.get(key)
        if existing is not None:
            if not caller.sees(existing.row.owner):  # one the admin made in this namespace: left alone
                raise Conflict(f"session {sid} already exists", param="session_id", code="session_exists")
            if not force:
                raise Conflict(f"session {sid} already exists; pass force: true to replace it",
                               param="session_id", code="session_exists")
            await self._remove(existing)
        s = self._new(key, model_id, max_seq_len, owner)
        s.row.messages = data.messages
        async with s.lock:
            self._sessions[key] = s
            self.store.save(s.row, replace_messages=True)
            if data.tokens:
                try:
                    await kv.import_kv(model_id, key, KVState(data.tokens, data.kv))
                except ValueError as e:  # its KV is not what its tokens say: no session from it
                    del self._sessions[key]
                    self.store.delete(key)
                    raise SnapshotCorrupt(f"snapshot {snap_id}: {e}") from e
        return await self._describe(s, caller)

    # ---- turns ---------------------------------------------------------------------------------

    async def turn(self, req: ChatRequest) -> EventStream:
        """A turn of the session `req.session` names (`SessionBackend.chat` sends only those here)."""
        turn = req.session
        if turn is None:
            raise ValueError("a session turn needs req.session")
        self._kv()
        sid = check_session_id(turn.session_id)
        if req.n != 1:
            raise BadRequest("a session turn has one reply: n must be 1", param="n")
        model_id = self.backend.resolve(req.model)
        s = self._find(sid, turn.caller)  # a tenant's ids are its own namespace: another's is not found
        if s is None and not turn.create:  # a caller that knows the session exists (the gateway)
            raise NotFound(f"session {sid} not found (session_create is false)", param="session_id",
                           code="session_not_found")
        if s is None:  # the first turn creates the session (stored when the turn runs)
            key = stored_session_id(turn.caller, sid)
            if key in self._sessions:  # one the admin made in this namespace: left alone
                raise Conflict(f"session {sid} already exists", param="session_id", code="session_exists")
            s = self._new(key, model_id, None, turn.caller.tenant)
            s.persisted = False
            self._sessions[key] = s
        elif s.row.model != model_id:
            raise BadRequest(f"session {sid} belongs to model {s.row.model}, not {model_id}", param="model")
        if s.lock.locked() and not turn.wait:
            raise Conflict(f"session {sid} is busy with another turn", param="session_id", code="session_busy")
        await s.lock.acquire()
        try:
            base, new = self._merge(s, req.messages, turn.replace_system)
            if req.continue_final and not (new and new[-1].role == "assistant"):
                raise BadRequest("continue_final_message needs the turn's new messages to end with the assistant's "
                                 "partial answer", param="continue_final_message")
            # the backend keeps the session's KV under its stored id
            full = replace(req, messages=[*base, *new], max_len=s.row.max_seq_len,
                           session=replace(turn, session_id=s.id))
            try:
                stream = await self.backend.chat(full)
            except ContextLimit as e:
                raise ContextLimit(
                    f"{e.message} The session {sid} allows {s.row.max_seq_len} tokens (max_seq_len): raise it with "
                    f"POST /v1/sessions/{sid}/resize (or /resize/next_pow2), or drop old messages with "
                    f"POST /v1/sessions/{sid}/rollback.", n_prompt=e.n_prompt, limit=e.limit,
                    max_tokens=e.max_tokens, param="messages") from e
        except BaseException:
            s.lock.release()
            self._forget_unborn(s)
            raise
        reply = _Reply()
        commit = self._committer(s, base, new, reply, turn.discard_thinking, replaced=base is not s.row.messages,
                                 continued=req.continue_final)
        stream.observe(reply)
        stream.observe(lambda ev: commit() if isinstance(ev, Done) else None)
        stream.on_close(commit)
        return stream

    def _forget_unborn(self, s: _Session) -> None:
        """A first turn that never ran leaves nothing behind."""
        if not s.persisted and not s.lock.locked() and self._sessions.get(s.id) is s:
            del self._sessions[s.id]

    def _committer(self, s: _Session, base: list[Message], new: list[Message], reply: _Reply,
                   discard_thinking: bool, replaced: bool, continued: bool = False) -> Callable[[], None]:
        done = False

        def commit() -> None:
            nonlocal done
            if done:
                return
            done = True
            try:
                if reply.started:
                    answer = reply.message(discard_thinking)
                    if continued:  # the stored answer is the partial one and its continuation, whole
                        partial = new[-1]
                        answer = merged(replace(partial, reasoning=None) if discard_thinking else partial, answer)
                        s.row.messages = [*base, *new[:-1], answer]
                    else:
                        s.row.messages = [*base, *new, answer]
                    s.row.last_used_at = time.time()
                    tail = s.row.messages[len(base):]
                    self.store.save(s.row, replace_messages=replaced or not s.persisted, append=tail)
                    s.persisted = True
            except Exception:
                log.exception("could not store the turn of session %s", s.id)
            finally:
                s.lock.release()
                self._forget_unborn(s)

        return commit

    @staticmethod
    def _merge(s: _Session, messages: list[Message], replace_system: bool) -> tuple[list[Message], list[Message]]:
        """(stored transcript to build on, new messages). A leading system message equal to
        the stored one is dropped; a different one needs replace_system once there are messages."""
        stored = s.row.messages
        if not messages or messages[0].role not in SYSTEM_ROLES:
            return stored, list(messages)
        system, rest = messages[0], list(messages[1:])
        have = stored[0] if stored and stored[0].role in SYSTEM_ROLES else None
        if have is not None and have.content == system.content:
            return stored, rest
        if not stored:
            return stored, [system, *rest]
        if not replace_system:
            raise Conflict(f"session {s.id} already has "
                           f"{'a different system message' if have else 'messages and no system message'}; "
                           "send replace_system: true to replace it", param="messages", code="system_mismatch")
        body = stored[1:] if have is not None else stored
        return [system, *body], rest

    # ---- helpers -------------------------------------------------------------------------------

    @staticmethod
    def _exclusive(s: _Session) -> asyncio.Lock:
        """The session's lock, for `async with`; busy sessions are refused, not waited for."""
        if s.lock.locked():
            raise Conflict(f"session {s.id} is busy with a turn", param="session_id", code="session_busy")
        return s.lock
