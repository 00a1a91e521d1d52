"""The registry of sessions (hearth.sessions.registry) on its own: each tenant's ids are its own
namespace, the admin names a tenant's session by its stored id or, when one tenant only has it,
by the tenant's name for it; a first turn's session that never ran leaves nothing behind."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from hearth.errors import Conflict, NotFound
from hearth.sessions.registry import Registry, Session, exclusive
from hearth.sessions.store import SessionRow, SessionStore
from hearth.tenants import OPEN, Caller

ACME, GLOBEX = Caller("acme", "k1"), Caller("globex", "k2")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SessionStore]:
    s = SessionStore(tmp_path / "sessions.db")
    yield s
    s.close()


def stored(store: SessionStore, *sessions: tuple[Caller, str]) -> Registry:
    """A registry loaded from a store that holds these (owner, session id as the owner names it)."""
    for caller, sid in sessions:
        store.save(SessionRow(caller.session_key(sid), "m", 1.0, 1.0, 64, owner=caller.tenant), replace_messages=True)
    return Registry(store)


def test_a_tenants_ids_are_its_own(store: SessionStore) -> None:
    reg = stored(store, (ACME, "chat"), (OPEN, "mine"))
    found = reg.find("chat", ACME)
    assert found is not None and found.row.owner == "acme" and ACME.shown(found.id) == "chat"
    assert reg.find("chat", GLOBEX) is None  # another tenant's: the same as none
    assert reg.find("mine", ACME) is None  # the admin's own
    with pytest.raises(NotFound):
        reg.get("chat", GLOBEX)
    assert {s.id for s in reg.visible(ACME)} == {ACME.session_key("chat")}
    assert len(reg.visible(OPEN)) == 2


def test_the_admin_names_a_tenants_session_by_either_id_unless_two_tenants_share_it(store: SessionStore) -> None:
    reg = stored(store, (ACME, "chat"), (ACME, "both"), (GLOBEX, "both"))
    by_name = reg.find("chat", OPEN)
    assert by_name is not None and by_name is reg.find(ACME.session_key("chat"), OPEN)
    with pytest.raises(Conflict) as e:
        reg.find("both", OPEN)
    assert e.value.code == "session_ambiguous"
    assert reg.find(GLOBEX.session_key("both"), OPEN) is not None


async def test_an_unborn_session_is_forgotten_once_its_lock_is_free(store: SessionStore) -> None:
    reg = stored(store)
    s = Session(SessionRow(ACME.session_key("new"), "m", 1.0, 1.0, 64, owner="acme"), persisted=False)
    reg.add(s)
    await s.lock.acquire()
    reg.forget_unborn(s)  # its turn still holds it
    assert ACME.session_key("new") in reg
    with pytest.raises(Conflict):
        exclusive(s)  # busy: refused, not waited for
    s.lock.release()
    reg.forget_unborn(s)
    assert ACME.session_key("new") not in reg and reg.find("new", ACME) is None
    assert isinstance(exclusive(Session(s.row)), asyncio.Lock)
