"""A session's turn: the stored transcript, the request's new messages after it, and the whole
conversation handed to the backend with `session` still set, so the session owns the KV the
backend builds (the local engine prefills only what the session's KV does not already start
with, wherever that KV is: a slot, RAM, disk). The reply is recorded from the event stream and
committed with the new messages when the turn ends, by whatever path (done, cancelled, failed,
client gone), so the transcript always describes the tokens in the KV up to reconciliation.

Invariants: at most one turn per session runs (others wait on its lock, or get 409); the lock is
released exactly once, by the commit; nothing is stored for a turn that never reached the engine
(a 4xx, a 429), and a session its first turn would have made is then forgotten."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

from hearth.backends.base import Backend, EventStream, require_session_kv
from hearth.chat.continuation import merged
from hearth.chat.system_turns import SYSTEM_ROLES
from hearth.chat.types import (
    ChatEvent,
    ChatRequest,
    Done,
    Message,
    ReasoningDelta,
    SessionTurn,
    Started,
    TextDelta,
    ToolCall,
    ToolCallDelta,
)
from hearth.errors import BadRequest, Conflict, ContextLimit, NotFound
from hearth.sessions.ids import check_session_id, stored_session_id
from hearth.sessions.lifecycle import Lifecycle
from hearth.sessions.registry import Registry, Session

log = logging.getLogger("hearth.sessions")


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


class Turns:
    def __init__(self, backend: Backend, registry: Registry, lifecycle: Lifecycle) -> None:
        self.backend = backend
        self.registry = registry
        self.lifecycle = lifecycle

    async def turn(self, req: ChatRequest) -> EventStream:
        """A turn of the session `req.session` names (`SessionBackend.chat` sends only those here)."""
        turn = req.session
        if turn is None:
            raise ValueError("a session turn needs req.session")
        require_session_kv(self.backend)
        sid = check_session_id(turn.session_id)
        if req.n != 1:
            raise BadRequest("a session turn has one reply: n must be 1", param="n")
        s = self._session(sid, turn, self.backend.resolve(req.model))
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
            self.registry.forget_unborn(s)
            raise
        reply = _Reply()
        commit = self._committer(s, base, new, reply, turn.discard_thinking, replaced=base is not s.row.messages,
                                 continued=req.continue_final)
        stream.observe(reply)
        stream.observe(lambda ev: commit() if isinstance(ev, Done) else None)
        stream.on_close(commit)
        return stream

    def _session(self, sid: str, turn: SessionTurn, model_id: str) -> Session:
        """The session the turn is for: found in the caller's namespace, or made by this first turn
        (registered now, stored when the turn runs)."""
        s = self.registry.find(sid, turn.caller)  # a tenant's ids are its own namespace: another's is not found
        if s is None and not turn.create:  # a caller that knows the session exists (the gateway)
            raise NotFound(f"session {sid} not found (session_create is false)", param="session_id",
                           code="session_not_found")
        if s is None:
            key = stored_session_id(turn.caller, sid)
            if key in self.registry:  # one the admin made in this namespace: left alone
                raise Conflict(f"session {sid} already exists", param="session_id", code="session_exists")
            s = self.lifecycle.new(key, model_id, None, turn.caller.tenant)
            s.persisted = False
            self.registry.add(s)
        elif s.row.model != model_id:
            raise BadRequest(f"session {sid} belongs to model {s.row.model}, not {model_id}", param="model")
        return s

    def _committer(self, s: Session, base: list[Message], new: list[Message], reply: _Reply,
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
                    self.registry.store.save(s.row, replace_messages=replaced or not s.persisted, append=tail)
                    s.persisted = True
            except Exception:
                log.exception("could not store the turn of session %s", s.id)
            finally:
                s.lock.release()
                self.registry.forget_unborn(s)

        return commit

    @staticmethod
    def _merge(s: Session, messages: list[Message], replace_system: bool) -> tuple[list[Message], list[Message]]:
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
