"""Sessions: transcripts that own KV, one turn at a time.

A turn takes the stored transcript, adds the request's new messages, and hands the whole
conversation to the backend with `session` still set, so the session owns the engine
request's KV: the engine finds the
longest common token prefix between the rendered prompt and the tokens in the session's KV
(wherever that KV is: in a slot, in RAM, on disk) and prefills only the rest. The reply is
recorded from the event stream and committed with the new messages when the turn ends, by
whatever path (done, cancelled, failed, client gone), so the transcript always describes the
tokens in the KV up to reconciliation.

Invariants:
- at most one turn per session runs; others wait on the session's lock (or get 409);
- every operation that touches a session's KV (delete, save, load, rollback) holds the lock;
- nothing is stored for a turn that never reached the engine (a 4xx, a 429).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hearth.backends.base import EventStream
from hearth.backends.local import LocalBackend, LocalModel
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
from hearth.errors import BadRequest, Conflict, ContextLimit, NotFound
from hearth.sessions.ids import check_session_id, new_session_id
from hearth.sessions.snapshots import SnapshotStore
from hearth.sessions.store import SessionRow, SessionStore
from hearth.sessions.transcript import message_to_json

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


class SessionManager:
    def __init__(self, backend: LocalBackend, data_dir: Path) -> None:
        self.backend = backend
        self.store = SessionStore(data_dir / "sessions.db")
        self.snapshots = SnapshotStore(data_dir / "snapshots")
        self._sessions: dict[str, _Session] = {s.id: _Session(s) for s in self.store.load_all()}
        self._model_sha: dict[str, str] = {}

    def close(self) -> None:
        self.store.close()

    # ---- lookups -----------------------------------------------------------------------------

    def _get(self, sid: str) -> _Session:
        s = self._sessions.get(check_session_id(sid))
        if s is None:
            raise NotFound(f"session {sid} not found", param="session_id", code="session_not_found")
        return s

    def _model(self, s: _Session) -> LocalModel:
        return self.backend.model(s.row.model)

    def info(self, sid: str) -> dict[str, Any]:
        return self._describe(self._get(sid))

    def _describe(self, s: _Session) -> dict[str, Any]:
        try:
            where, n_tokens = self._model(s).engine.kv_where(s.id)
        except Exception:  # model not loaded (yet): the transcript is still there
            where, n_tokens = "none", 0
        row = s.row
        return {"object": "session", "session_id": s.id, "model": row.model, "created_at": int(row.created_at),
                "last_used_at": int(row.last_used_at), "current_pos": n_tokens, "max_seq_len": row.max_seq_len,
                "message_count": len(row.messages), "residency": where, "busy": s.lock.locked(),
                # superlinear's names for the same facts (docs/sessions.md)
                "cache_position": n_tokens, "status": "busy" if s.lock.locked() else "idle"}

    def list(self) -> list[dict[str, Any]]:
        ordered = sorted(self._sessions.values(), key=lambda s: s.row.last_used_at, reverse=True)
        return [self._describe(s) for s in ordered]

    def history(self, sid: str) -> list[dict[str, Any]]:
        return [message_to_json(m) for m in self._get(sid).row.messages]

    # ---- lifecycle ---------------------------------------------------------------------------

    def create(self, sid: str | None = None, model: str | None = None, max_seq_len: int | None = None,
               messages: list[Message] | None = None) -> dict[str, Any]:
        sid = check_session_id(sid) if sid is not None else new_session_id()
        if sid in self._sessions:
            raise Conflict(f"session {sid} already exists", param="session_id", code="session_exists")
        s = self._new(sid, model, max_seq_len)
        if messages:
            s.row.messages = list(messages)
        self.store.save(s.row, replace_messages=True)
        self._sessions[sid] = s
        return self._describe(s)

    def _new(self, sid: str, model: str | None, max_seq_len: int | None) -> _Session:
        m = self.backend.model(model)
        limit = m.engine.seq_ctx
        if max_seq_len is None:
            max_seq_len = limit
        if not 16 <= max_seq_len <= limit:
            raise BadRequest(f"max_seq_len must be between 16 and {limit} (the server's per-sequence context)",
                             param="max_seq_len")
        now = time.time()
        return _Session(SessionRow(sid, m.spec.id, now, now, max_seq_len))

    async def delete(self, sid: str) -> None:
        s = self._get(sid)
        async with self._exclusive(s):
            await self._engine_call(s, lambda e: e.drop_kv(s.id))
            self.store.delete(s.id)
            del self._sessions[s.id]

    async def rollback(self, sid: str, keep_messages: int) -> dict[str, Any]:
        s = self._get(sid)
        async with self._exclusive(s):
            if not 0 <= keep_messages <= len(s.row.messages):
                raise BadRequest(f"keep_messages must be between 0 and {len(s.row.messages)} "
                                 "(the session's message count)", param="keep_messages")
            s.row.messages = s.row.messages[:keep_messages]
            s.row.last_used_at = time.time()
            self.store.save(s.row, replace_messages=True)
            await self._trim(s)
        return self._describe(s)  # outside the lock: an idle session is not busy

    async def resize(self, sid: str, max_seq_len: int, strategy: str = "reject") -> dict[str, Any]:
        s = self._get(sid)
        if strategy not in RESIZE_STRATEGIES:
            raise BadRequest(f"strategy must be one of {', '.join(RESIZE_STRATEGIES)}", param="strategy")
        mode = "drop_oldest" if strategy == "drop_oldest" else "reject"  # superlinear's auto|gpu|disk: no loss
        async with self._exclusive(s):
            m = self._model(s)
            limit = m.engine.seq_ctx
            if not 16 <= max_seq_len <= limit:
                raise BadRequest(f"max_seq_len must be between 16 and {limit} (the server's per-sequence "
                                 "context; start the server with a larger --ctx for more)", param="max_seq_len")
            messages = list(s.row.messages)
            needed = self._count(m, messages)
            if needed >= max_seq_len:
                if mode == "reject":
                    raise BadRequest(f"session {s.id} already holds {needed} tokens of transcript, more than "
                                     f"max_seq_len {max_seq_len}; roll back first or use strategy drop_oldest",
                                     param="max_seq_len")
                head = 1 if messages and messages[0].role in SYSTEM_ROLES else 0
                while len(messages) > head and self._count(m, messages) >= max_seq_len:
                    del messages[head]
                if self._count(m, messages) >= max_seq_len:
                    raise BadRequest(f"the system message alone does not fit in {max_seq_len} tokens",
                                     param="max_seq_len")
            old_max = s.row.max_seq_len
            s.row.messages, s.row.max_seq_len = messages, max_seq_len
            self.store.save(s.row, replace_messages=True)
            await self._trim(s)
        return {**self._describe(s), "old_max_seq_len": old_max, "strategy": strategy, "mode": mode}

    async def _trim(self, s: _Session) -> None:
        """Cut the session's KV to what its (shorter) transcript still starts with, so
        `current_pos` never counts dropped turns or exceeds `max_seq_len`."""
        m = self._model(s)
        tokens = m.tokenize_text(m.template.render(s.row.messages), False) if s.row.messages else []
        await self._engine_call(s, lambda e: e.trim_kv(s.id, tokens))

    async def resize_next_pow2(self, sid: str) -> dict[str, Any]:
        s = self._get(sid)
        limit = self._model(s).engine.seq_ctx
        if s.row.max_seq_len >= limit:
            raise BadRequest(f"session {s.id} is already at the server's per-sequence context ({limit} tokens); "
                             "start the server with a larger --ctx", param="max_seq_len")
        return await self.resize(sid, min(1 << s.row.max_seq_len.bit_length(), limit))

    @staticmethod
    def _count(m: LocalModel, messages: list[Message]) -> int:
        return len(m.tokenize_text(m.template.render(messages), False)) if messages else 0

    # ---- snapshots -----------------------------------------------------------------------------

    def _model_identity(self, m: LocalModel) -> dict[str, Any]:
        sha = self._model_sha.get(m.spec.id)
        if sha is None:
            h = hashlib.sha256()
            with m.spec.path.open("rb") as f:
                while block := f.read(1 << 20):
                    h.update(block)
            sha = self._model_sha[m.spec.id] = h.hexdigest()
        return {"id": m.spec.id, "sha256": sha, "arch": m.card.meta.get("architecture"),
                "n_ctx_train": m.card.meta.get("n_ctx_train")}

    @staticmethod
    def _engine_identity(m: LocalModel) -> dict[str, Any]:
        return {**m.runner.fingerprint, "kv_type": "f16"}  # type: ignore[attr-defined]

    async def save(self, sid: str, title: str | None = None, description: str | None = None,
                   tags: list[str] | None = None) -> dict[str, Any]:
        s = self._get(sid)
        async with self._exclusive(s):
            m = self._model(s)
            got = await self._engine_call(s, lambda e: e.export_kv(s.id))
            tokens, kv = got if got is not None else ([], b"")
            model = await asyncio.to_thread(self._model_identity, m)
            session = {"session_id": s.id, "n_tokens": len(tokens), "max_seq_len": s.row.max_seq_len,
                       "message_count": len(s.row.messages)}
            return await asyncio.to_thread(
                self.snapshots.create, model=model, engine=self._engine_identity(m), session=session,
                messages=list(s.row.messages), tokens=tokens, kv=kv, title=title, description=description,
                tags=tags)

    async def load(self, snap_id: str, sid: str | None = None, force: bool = False) -> dict[str, Any]:
        manifest = self.snapshots.get(snap_id)
        model_id = (manifest.get("model") or {}).get("id")
        try:
            m = self.backend.model(model_id)
        except NotFound as e:
            raise Conflict(f"snapshot {snap_id} needs model {model_id!r}, which this server does not serve",
                           code="snapshot_incompatible") from e
        model = await asyncio.to_thread(self._model_identity, m)
        data = await asyncio.to_thread(self.snapshots.read, snap_id, model, self._engine_identity(m))
        sid = check_session_id(sid) if sid is not None else new_session_id()
        max_seq_len = min(int((manifest.get("session") or {}).get("max_seq_len") or m.engine.seq_ctx),
                          m.engine.seq_ctx)
        existing = self._sessions.get(sid)
        if existing is not None:
            if not force:
                raise Conflict(f"session {sid} already exists; pass force: true to replace it",
                               param="session_id", code="session_exists")
            await self.delete(sid)
        s = self._new(sid, m.spec.id, max_seq_len)
        s.row.messages = data.messages
        async with s.lock:
            self._sessions[sid] = s
            self.store.save(s.row, replace_messages=True)
            if data.tokens:
                await self._engine_call(s, lambda e: e.import_kv(sid, data.tokens, data.kv))
        return self._describe(s)

    # ---- turns ---------------------------------------------------------------------------------

    async def chat(self, req: ChatRequest) -> EventStream:
        """A request: stateless straight to the backend, or a turn of its session."""
        if req.session is None:
            return await self.backend.chat(req)
        turn = req.session
        sid = check_session_id(turn.session_id)
        if req.n != 1:
            raise BadRequest("a session turn has one reply: n must be 1", param="n")
        model_id = self.backend.resolve(req.model)
        s = self._sessions.get(sid)
        if s is None:  # the first turn creates the session (stored when the turn runs)
            s = self._new(sid, model_id, None)
            s.persisted = False
            self._sessions[sid] = s
        elif s.row.model != model_id:
            raise BadRequest(f"session {sid} belongs to model {s.row.model}, not {model_id}", param="model")
        if s.lock.locked() and not turn.wait:
            raise Conflict(f"session {sid} is busy with another turn", param="session_id", code="session_busy")
        await s.lock.acquire()
        try:
            base, new = self._merge(s, req.messages, turn.replace_system)
            full = replace(req, messages=[*base, *new], max_len=s.row.max_seq_len)
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
        commit = self._committer(s, base, new, reply, turn.discard_thinking, replaced=base is not s.row.messages)
        stream.observe(reply)
        stream.observe(lambda ev: commit() if isinstance(ev, Done) else None)
        stream.on_close(commit)
        return stream

    def _forget_unborn(self, s: _Session) -> None:
        """A first turn that never ran leaves nothing behind."""
        if not s.persisted and not s.lock.locked() and self._sessions.get(s.id) is s:
            del self._sessions[s.id]

    def _committer(self, s: _Session, base: list[Message], new: list[Message], reply: _Reply,
                   discard_thinking: bool, replaced: bool) -> Callable[[], None]:
        done = False

        def commit() -> None:
            nonlocal done
            if done:
                return
            done = True
            try:
                if reply.started:
                    s.row.messages = [*base, *new, reply.message(discard_thinking)]
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

    async def _engine_call(self, s: _Session, fn: Callable[[Any], Any]) -> Any:
        engine = self._model(s).engine
        try:
            return await asyncio.wrap_future(engine.call(lambda: fn(engine)))
        except RuntimeError as e:  # its last turn is still leaving the engine
            raise Conflict(f"session {s.id} is busy: {e}; retry shortly", param="session_id",
                           code="session_busy") from e

