"""The sessions a node holds, by id: the one place a session is looked up, and its lock.

Every lookup by id goes through `Registry.find` with the caller: another tenant's session is the
same 404 as one that does not exist (hearth.tenants). A tenant's session ids are its own
namespace (stored as `t<hash>.<id>`, `Caller.session_key`): an id another tenant holds is free
for it, exactly as an id nobody holds, and the tenant sees its sessions under its own ids. The
admin names a session by its stored id, or by its tenant's name for it when one tenant only has it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from hearth.errors import Conflict, NotFound
from hearth.sessions.ids import stored_session_id
from hearth.sessions.store import SessionRow, SessionStore
from hearth.tenants import ADMIN, OPEN, Caller


@dataclass(slots=True)
class Session:
    row: SessionRow
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    persisted: bool = True  # False for a session made by a first turn that has not run yet

    @property
    def id(self) -> str:
        return self.row.id


def owner_view(owner: str) -> Caller:
    """How the owner of a session names it (a snapshot's manifest records that name)."""
    return OPEN if owner == ADMIN else Caller(owner, owner)


def exclusive(s: Session) -> asyncio.Lock:
    """The session's lock, for `async with`; busy sessions are refused, not waited for."""
    if s.lock.locked():
        raise Conflict(f"session {s.id} is busy with a turn", param="session_id", code="session_busy")
    return s.lock


class Registry:
    """The sessions by stored id, loaded from their store at start; the rows stay in `store`."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self._sessions: dict[str, Session] = {s.id: Session(s) for s in store.load_all()}

    def __contains__(self, key: str) -> bool:
        return key in self._sessions

    def stored(self, key: str) -> Session | None:
        """The session stored under `key`, whoever owns it (callers check who sees it)."""
        return self._sessions.get(key)

    def find(self, sid: str, caller: Caller) -> Session | None:
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

    def get(self, sid: str, caller: Caller) -> Session:
        """`find`, or 404."""
        s = self.find(sid, caller)
        if s is None:
            raise NotFound(f"session {sid} not found", param="session_id", code="session_not_found")
        return s

    def visible(self, caller: Caller) -> list[Session]:
        return [s for s in self._sessions.values() if caller.sees(s.row.owner)]

    def add(self, s: Session) -> None:
        self._sessions[s.id] = s

    def discard(self, s: Session) -> None:
        """Forget the session (its row and KV are the caller's to drop)."""
        del self._sessions[s.id]

    def forget_unborn(self, s: Session) -> None:
        """A first turn that never ran leaves nothing behind."""
        if not s.persisted and not s.lock.locked() and self._sessions.get(s.id) is s:
            del self._sessions[s.id]
