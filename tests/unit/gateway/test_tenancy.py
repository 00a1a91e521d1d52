"""Tenants through the gateway, piece by piece (hearth.gateway.tenancy): the key file's gateway
role, what the gateway sends a node for each caller, the store's owners, and usage rows a
gateway key makes for the tenants it speaks for."""

from __future__ import annotations

from pathlib import Path

import pytest

from hearth.chat.types import Done, Usage
from hearth.config import Settings
from hearth.errors import BadRequest, Forbidden, TooManyRequests
from hearth.gateway.settings import GatewaySettings, Upstream
from hearth.gateway.store.sqlite import SqliteStore
from hearth.gateway.tenancy import hidden, owner_caller, owns
from hearth.gateway.upstream.headers import upstream_headers
from hearth.http.access import AccessSettings
from hearth.http.auth import AuthMiddleware
from hearth.http.key_usage import KeyAccounts
from hearth.sessions.ids import stored_session_id
from hearth.tenants import ADMIN_CALLER, OPEN, ApiKey, Caller, parse_key_line, session_prefix

UP = Upstream(name="n", url="http://n", api_key="node-gw", admin_key="node-adm", models={"smol": "m"})
ALICE = Caller("team-a", "alice")


def test_the_key_file_gives_a_gateway_role() -> None:
    assert parse_key_line("k name=gw role=gateway").role == "gateway"
    assert parse_key_line("k name=x").role == "client"
    with pytest.raises(ValueError, match="role"):
        parse_key_line("k name=x role=root")


def test_a_node_believes_the_tenant_header_only_from_a_gateway_key() -> None:
    keys = [ApiKey("kgw", "gw", "gw", role="gateway"), ApiKey("ka", "alice", "team-a")]
    mw = AuthMiddleware(lambda *a: None, AccessSettings.of(Settings(named_keys=keys, admin_key="adm")))  # type: ignore[arg-type]
    claim = {b"x-hearth-tenant": b"team-b"}
    assert mw._caller("kgw", claim) == Caller("team-b", "gw", via_gateway=True)
    assert mw._caller("kgw", {**claim, b"x-hearth-tenant-cache": b"shared"}).shared_cache
    assert mw._caller("kgw") == Caller("gw", "gw")  # no header: the gateway key's own tenant
    assert isinstance(mw._caller("ka", claim), Forbidden)
    assert isinstance(mw._caller("adm", claim), Forbidden)
    assert isinstance(mw._caller(None, claim), Forbidden)
    assert isinstance(mw._caller("kgw", {b"x-hearth-tenant": b"no/such name"}), BadRequest)
    open_node = AuthMiddleware(lambda *a: None, AccessSettings.of(Settings()))  # type: ignore[arg-type]
    assert open_node._caller(None, claim) == OPEN  # no keys: nothing is scoped, the header changes nothing


def test_what_the_gateway_sends_a_node_for_each_caller() -> None:
    assert upstream_headers(UP, OPEN) == {"Authorization": "Bearer node-gw"}  # no tenants: as before
    assert upstream_headers(UP, OPEN, admin=True) == {"Authorization": "Bearer node-adm"}
    assert upstream_headers(UP, ADMIN_CALLER) == {"Authorization": "Bearer node-adm"}  # the node's admin sees all
    assert upstream_headers(UP, ALICE) == {"Authorization": "Bearer node-gw", "x-hearth-tenant": "team-a",
                                           "x-hearth-tenant-class": "weight=1;priority=default;max_priority=default"}
    shared = Caller("team-a", "alice", shared_cache=True)
    assert upstream_headers(UP, shared)["x-hearth-tenant-cache"] == "shared"
    # an admin operation for a tenant (checked first by the caller): the admin key, no tenant
    assert upstream_headers(UP, ALICE, admin=True) == {"Authorization": "Bearer node-adm"}
    same = Upstream(name="n", url="http://n", api_key="node-gw", models={"smol": "m"})  # no admin key of its own
    assert upstream_headers(same, ALICE, admin=True)["x-hearth-tenant"] == "team-a"
    assert owner_caller("team-a", True).tenant == "team-a" and not owner_caller("team-a", True).admin
    assert owner_caller("", True) == ADMIN_CALLER and owner_caller(None, True) == ADMIN_CALLER
    assert owner_caller("team-a", False) == OPEN


async def test_owners_in_the_store(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "gw.sqlite3")
    await store.open()
    try:
        assert await store.owner_of("session", "s") is None
        await store.set_owner("session", "s", "team-a")
        await store.set_owner("response", "s", "team-b")  # kinds are apart
        assert await store.owner_of("session", "s") == "team-a"
        assert await store.owner_of("response", "s") == "team-b"
        await store.set_owner("session", "s", "")  # an upsert
        assert await store.owner_of("session", "s") == ""
        await store.set_owner("session", "a", "team-a")
        bob = Caller("team-b", "bob")
        assert await hidden(store, bob, "session", "a") and not await hidden(store, ALICE, "session", "a")
        assert not await hidden(store, bob, "session", "new")  # never recorded: anyone's to create
        assert not await hidden(store, ADMIN_CALLER, "session", "a")
        assert not await owns(store, ALICE, "session", "old")  # before owners: the admin's
        assert await owns(store, ADMIN_CALLER, "session", "old") and await owns(store, ALICE, "session", "a")
    finally:
        await store.close()
    reopened = SqliteStore(tmp_path / "gw.sqlite3")  # owners survive a restart
    await reopened.open()
    try:
        assert await reopened.owner_of("session", "a") == "team-a"
    finally:
        await reopened.close()


def test_a_gateway_keys_usage_is_counted_to_the_tenants_it_speaks_for() -> None:
    accounts = KeyAccounts([ApiKey("kgw", "gw", "gw", role="gateway", concurrent=1)])
    accounts.admit("gw", "team-a")
    with pytest.raises(TooManyRequests):  # the gateway key's own limit holds across its tenants
        accounts.admit("gw", "team-b")
    accounts.observer("gw", "team-a")(Done(Usage(prompt_tokens=7, completion_tokens=2, cached_tokens=3)))
    accounts.release("gw", "team-a")
    accounts.spend("gw", 1, 1, 0, "team-b")
    rows = {(r["name"], r.get("via")): r for r in accounts.usage()}
    assert rows[("gw", None)]["prompt_tokens"] == 8 and rows[("gw", None)]["in_flight"] == 0
    a = rows[("team-a", "gw")]
    assert (a["requests"], a["in_flight"], a["prompt_tokens"], a["completion_tokens"], a["cached_tokens"]) == \
        (1, 0, 7, 2, 3)
    assert rows[("team-b", "gw")]["prompt_tokens"] == 1
    accounts.spend("nobody", 5, 5, 5, "team-c")  # not a key: no row made
    assert ("team-c", "nobody") not in {(r["name"], r.get("via")) for r in accounts.usage()}


def test_tenants_are_carried_with_a_key_file_only(tmp_path: Path) -> None:
    assert not GatewaySettings(upstreams=[UP], data_dir=tmp_path, api_keys=["k"]).tenants  # as before
    keyed = GatewaySettings(upstreams=[UP], data_dir=tmp_path, named_keys=[ApiKey("k", "a", "t")])
    assert keyed.tenants and [k.name for k in keyed.keyring] == ["a"]
    with pytest.raises(ValueError, match="share the name"):
        GatewaySettings(upstreams=[UP], data_dir=tmp_path, named_keys=[ApiKey("a", "x", "t"), ApiKey("b", "x", "t")])


def test_a_tenants_session_ids_are_its_own_namespace() -> None:
    a, b = Caller("team-a", "alice"), Caller("team-b", "bob")
    assert stored_session_id(a, "chat") != stored_session_id(b, "chat")
    assert stored_session_id(a, "chat") == session_prefix("team-a") + "chat"
    assert stored_session_id(a, stored_session_id(a, "chat")) == stored_session_id(a, "chat")  # idempotent
    assert stored_session_id(b, stored_session_id(a, "chat")).startswith(session_prefix("team-b"))  # never a's
    assert a.shown(stored_session_id(a, "chat")) == "chat"
    assert stored_session_id(OPEN, "chat") == "chat" and stored_session_id(ADMIN_CALLER, "chat") == "chat"
    # tenant names may hold every character of a session id: the prefix is a hash, never the name
    assert session_prefix("a") != session_prefix("a.b") and len(session_prefix("x" * 64)) == 14
    with pytest.raises(BadRequest):
        stored_session_id(a, "x" * 115)
    assert stored_session_id(a, "x" * 114)
