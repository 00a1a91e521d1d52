"""Tenants in-process (hearth.tenants, docs/api.md "Keys and tenants"): the isolation matrix over
every route that touches a stored object. Two tenants (alice and bob), the admin, and a node
without keys: each sees exactly its own, another tenant's id is the same 404 as a missing one."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hearth.api.context import node_of
from hearth.tenants import ApiKey, session_prefix
from tests.api.conftest import Harness, serve

ALICE = {"Authorization": "Bearer ka"}
ALICE2 = {"Authorization": "Bearer ka2"}  # a second key of alice's tenant
BOB = {"Authorization": "Bearer kb"}
ADMIN = {"Authorization": "Bearer adm"}
KEYS = [ApiKey("ka", "alice", "team-a"), ApiKey("ka2", "alice-ci", "team-a"), ApiKey("kb", "bob", "team-b")]
def stored(tenant: str, sid: str) -> str:
    """A tenant's session id as the node stores it, and the admin names it (hearth.tenants)."""
    return session_prefix(tenant) + sid


CHAT = {"model": "fake", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(params=["with an admin key", "without an admin key"])
async def t(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    admin = "adm" if request.param == "with an admin key" else None
    async with serve(tmp_path, named_keys=KEYS, admin_key=admin) as harness:
        yield harness


def has_admin(t: Harness) -> bool:
    return node_of(t.app).settings.admin_key is not None


async def alices_things(t: Harness) -> dict[str, str]:
    """A session (made by a first turn), a snapshot of it and a stored response, all alice's."""
    r = await t.post("/v1/chat/completions", {**CHAT, "session_id": "a1"}, headers=ALICE)
    assert r.status_code == 200, r.text
    r = await t.post("/v1/sessions/a1/save", {"title": "alice"}, headers=ALICE)
    assert r.status_code == 201, r.text
    snap = r.json()["snapshot_id"]
    r = await t.post("/v1/responses", {"model": "fake", "input": "hi", "max_output_tokens": 3}, headers=ALICE)
    assert r.status_code == 200, r.text
    resp = r.json()
    return {"snap": snap, "resp": resp["id"], "item": resp["output"][0]["id"]}


def reads(ids: dict[str, str]) -> list[tuple[str, str, dict[str, Any] | None]]:
    """Every route that reads or changes one of alice's objects without deleting it."""
    snap, resp = ids["snap"], ids["resp"]
    return [
        ("GET", "/v1/sessions/a1", None),
        ("GET", "/v1/sessions/a1/history", None),
        ("POST", "/v1/sessions/a1/rollback", {"keep_messages": 0}),
        ("POST", "/v1/sessions/a1/resize", {"max_seq_len": 64}),
        ("POST", "/v1/sessions/a1/resize/next_pow2", None),
        ("POST", "/v1/sessions/a1/save", {}),
        ("GET", f"/v1/snapshots/{snap}", None),
        ("PATCH", f"/v1/snapshots/{snap}", {"title": "renamed"}),
        ("GET", f"/v1/snapshots/{snap}/archive", None),
        ("POST", f"/v1/snapshots/{snap}/load", {"session_id": "copy"}),
        ("GET", f"/v1/responses/{resp}", None),
        ("POST", f"/v1/responses/{resp}/cancel", None),
    ]


async def call(t: Harness, method: str, path: str, body: dict[str, Any] | None, who: dict[str, str]
               ) -> httpx.Response:
    return await t.client.request(method, path, json=body, headers=who)


async def test_another_tenants_objects_are_not_found_on_every_route(t: Harness) -> None:
    ids = await alices_things(t)
    missing = {"snap": "snap_" + "0" * 32, "resp": "resp_" + "0" * 32}
    for (method, path, body), (_, gone, _) in zip(reads(ids), reads({**ids, **missing}), strict=True):
        if "/v1/sessions/a1" in path:
            gone = gone.replace("/a1", "/nobody")
        theirs, absent = await call(t, method, path, body, BOB), await call(t, method, gone, body, BOB)
        assert theirs.status_code == 404, (method, path, theirs.text)
        # the same answer as for an id that does not exist, less the id itself
        assert theirs.json()["error"]["type"] == absent.json()["error"]["type"], (method, path)
        assert theirs.json()["error"].get("code") == absent.json()["error"].get("code"), (method, path)
    for method, path, body in reads(ids):  # nothing bob tried changed them; alice still sees each
        if path.endswith("/load"):
            body = {"session_id": "copy-alice"}
        r = await call(t, method, path, body, ALICE)
        assert r.status_code in (200, 201), (method, path, r.text)
        admin = has_admin(t)  # the admin names alice's session by its stored id
        r = await call(t, method, path.replace("/a1", "/" + stored("team-a", "a1")) if admin else path,
                       {"session_id": "copy-admin"} if path.endswith("/load") else body, ADMIN if admin else ALICE2)
        assert r.status_code in (200, 201), (method, path, r.text)


async def test_listings_hold_only_the_callers_own(t: Harness) -> None:
    ids = await alices_things(t)
    r = await t.post("/v1/chat/completions", {**CHAT, "session_id": "b1"}, headers=BOB)
    assert r.status_code == 200
    bob_snap = (await t.post("/v1/sessions/b1/save", {}, headers=BOB)).json()["snapshot_id"]

    def ids_of(r: httpx.Response, key: str) -> set[str]:
        assert r.status_code == 200, r.text
        return {x[key] for x in r.json()["data"]}

    for who, sessions, snaps in ((ALICE, {"a1"}, {ids["snap"]}), (ALICE2, {"a1"}, {ids["snap"]}),
                                 (BOB, {"b1"}, {bob_snap})):
        assert ids_of(await t.client.get("/v1/sessions", headers=who), "session_id") == sessions
        assert ids_of(await t.client.get("/v1/snapshots", headers=who), "snapshot_id") == snaps
    if has_admin(t):
        assert ids_of(await t.client.get("/v1/sessions", headers=ADMIN), "session_id") == {
            stored("team-a", "a1"), stored("team-b", "b1")}  # the stored ids: each tenant's namespace
        assert ids_of(await t.client.get("/v1/snapshots", headers=ADMIN), "snapshot_id") == {ids["snap"], bob_snap}


async def test_continuations_stay_within_the_tenant(t: Harness) -> None:
    ids = await alices_things(t)
    # previous_response_id and item_reference: another tenant's are unknown, as missing ones are
    r = await t.post("/v1/responses", {"model": "fake", "input": "more", "previous_response_id": ids["resp"]},
                     headers=BOB)
    assert r.status_code == 404 and r.json()["error"]["param"] == "previous_response_id", r.text
    go_on = {"role": "user", "content": "go on"}
    ref = {"model": "fake", "input": [{"type": "item_reference", "id": ids["item"]}, go_on]}
    theirs = await t.post("/v1/responses", ref, headers=BOB)
    absent = await t.post("/v1/responses", {**ref, "input": [{"type": "item_reference", "id": "msg_nope"}, go_on]},
                          headers=BOB)
    assert theirs.status_code == absent.status_code == 404, theirs.text
    r = await t.post("/v1/responses", ref, headers=ALICE2)
    assert r.status_code == 200, r.text
    for who in (ALICE, ALICE2):
        r = await t.post("/v1/responses", {"model": "fake", "input": "more", "previous_response_id": ids["resp"]},
                         headers=who)
        assert r.status_code == 200, r.text
    # a session turn: another tenant's session is never continued; its id is bob's to use, as
    # an id nobody holds is (a tenant's ids are its own namespace): nothing says alice has one
    r = await t.post("/v1/chat/completions", {**CHAT, "session_id": "a1", "session_create": False}, headers=BOB)
    assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found", r.text
    r = await t.post("/v1/chat/completions", {**CHAT, "session_id": "a1"}, headers=BOB)
    assert r.status_code == 200, r.text
    r = await t.post("/v1/messages", {"model": "fake", "max_tokens": 3, "session_id": "a1",
                                      "messages": [{"role": "user", "content": "hi"}]}, headers=BOB)
    assert r.status_code == 200, r.text
    history = (await t.client.get("/v1/sessions/a1/history", headers=ALICE)).json()["data"]
    assert len(history) == 2  # alice's one turn, nothing of bob's
    assert len((await t.client.get("/v1/sessions/a1/history", headers=BOB)).json()["data"]) == 4  # bob's two
    r = await t.post("/v1/chat/completions", {**CHAT, "session_id": "a1"}, headers=ALICE2)
    assert r.status_code == 200, r.text


async def test_deletes_reach_only_the_callers_own(t: Harness) -> None:
    ids = await alices_things(t)
    doomed = ["/v1/sessions/a1", f"/v1/snapshots/{ids['snap']}", f"/v1/responses/{ids['resp']}"]
    for path in doomed:
        r = await t.client.delete(path, headers=BOB)
        # with an admin key every DELETE is the admin's (403 before any lookup); without, another's is 404
        assert r.status_code == (403 if has_admin(t) else 404), (path, r.text)
    for path in doomed:
        assert (await t.client.get(path.replace("/a1", "/a1/history"), headers=ALICE)).status_code == 200, path
    for path in doomed:
        r = await t.client.delete(path.replace("/a1", "/" + stored("team-a", "a1")) if has_admin(t) else path,
                                  headers=ADMIN if has_admin(t) else ALICE)
        assert r.status_code == 200, (path, r.text)
        assert (await t.client.get(path, headers=ALICE)).status_code == 404


async def test_a_load_never_replaces_another_tenants_session(t: Harness) -> None:
    await alices_things(t)
    r = await t.post("/v1/chat/completions", {**CHAT, "session_id": "b1"}, headers=BOB)
    bob_snap = (await t.post("/v1/sessions/b1/save", {}, headers=BOB)).json()["snapshot_id"]
    if has_admin(t):
        r = await t.post(f"/v1/snapshots/{bob_snap}/load", {"session_id": "a1", "force": True}, headers=BOB)
        assert r.status_code == 403, r.text
    # alice's "a1" is not in bob's namespace: the load makes bob's own "a1", as for a free id
    r = await t.post(f"/v1/snapshots/{bob_snap}/load", {"session_id": "a1"}, headers=BOB)
    assert r.status_code == 201 and r.json()["session_id"] == "a1", r.text
    r = await t.post(f"/v1/snapshots/{bob_snap}/load", {"session_id": "a1"}, headers=BOB)  # now it is bob's
    assert r.status_code == 409 and "force" in r.json()["error"]["message"], r.text
    assert len((await t.client.get("/v1/sessions/a1/history", headers=ALICE)).json()["data"]) == 2


async def test_what_the_admin_makes_from_a_tenants_object_stays_the_tenants(tmp_path: Path) -> None:
    """A snapshot saved from alice's session is alice's, and so is a session loaded from it, whoever
    asked (the gateway moves sessions so: save with its key, load with the node's admin key)."""
    async with serve(tmp_path, named_keys=KEYS, admin_key="adm") as t:
        await alices_things(t)
        snap = (await t.post(f"/v1/sessions/{stored('team-a', 'a1')}/save", {}, headers=ADMIN)).json()["snapshot_id"]
        assert (await t.client.get(f"/v1/snapshots/{snap}", headers=ALICE)).status_code == 200
        r = await t.post(f"/v1/snapshots/{snap}/load", {"session_id": "a2"}, headers=ADMIN)
        assert r.status_code == 201, r.text
        assert (await t.client.get("/v1/sessions/a2", headers=ALICE)).status_code == 200
        assert (await t.client.get("/v1/sessions/a2", headers=BOB)).status_code == 404
        # the admin's own session is the admin's alone
        assert (await t.post("/v1/sessions", {"session_id": "adm1"}, headers=ADMIN)).status_code == 201
        assert (await t.client.get("/v1/sessions/adm1", headers=ALICE)).status_code == 404


async def test_an_imported_archive_belongs_to_its_importer(tmp_path: Path) -> None:
    async with serve(tmp_path, named_keys=KEYS, admin_key="adm") as t:
        ids = await alices_things(t)
        archive = (await t.client.get(f"/v1/snapshots/{ids['snap']}/archive", headers=ALICE)).content
        assert (await t.client.delete(f"/v1/snapshots/{ids['snap']}", headers=ADMIN)).status_code == 200
        r = await t.client.post("/v1/snapshots/import", content=archive, headers=BOB)
        assert r.status_code == 201, r.text
        assert (await t.client.get(f"/v1/snapshots/{ids['snap']}", headers=BOB)).status_code == 200
        assert (await t.client.get(f"/v1/snapshots/{ids['snap']}", headers=ALICE)).status_code == 404


async def test_bare_keys_are_tenants_of_their_own(tmp_path: Path) -> None:
    async with serve(tmp_path, api_keys=["k1", "k2"]) as t:
        r = await t.post("/v1/chat/completions", {**CHAT, "session_id": "s1"}, headers={"x-api-key": "k1"})
        assert r.status_code == 200
        assert (await t.client.get("/v1/sessions/s1", headers={"x-api-key": "k1"})).status_code == 200
        assert (await t.client.get("/v1/sessions/s1", headers={"x-api-key": "k2"})).status_code == 404
        # no admin key: a tenant deletes its own
        assert (await t.client.delete("/v1/sessions/s1", headers={"x-api-key": "k2"})).status_code == 404
        assert (await t.client.delete("/v1/sessions/s1", headers={"x-api-key": "k1"})).status_code == 200


async def test_without_keys_nothing_is_scoped(h: Harness) -> None:
    ids = await alices_things(h)  # the headers are ignored: no keys, no tenants
    for method, path, body in reads(ids):
        r = await call(h, method, path, body, BOB)
        assert r.status_code in (200, 201), (method, path, r.text)


async def test_a_cancel_reaches_only_the_callers_runs(tmp_path: Path) -> None:
    async with serve(tmp_path, named_keys=KEYS, admin_key="adm") as t:
        assert t.runner is not None
        t.runner.gate = gate = threading.Event()
        t.runner.entered.clear()
        task = asyncio.create_task(t.post("/v1/chat/completions", {**CHAT, "session_id": "a1", "cancel_id": "c1"},
                                          headers=ALICE))
        try:
            assert await asyncio.to_thread(t.runner.entered.wait, 10)
            for body in ({"cancel_id": "c1"}, {"session_id": "a1"}):
                assert (await t.post("/v1/cancel", body, headers=BOB)).json() == {"cancelled": 0}
            [run] = node_of(t.app).cancels._runs
            run.token.on_cancel(gate.set)
            assert (await t.post("/v1/cancel", {"session_id": "a1"}, headers=ALICE2)).json() == {"cancelled": 1}
        finally:
            gate.set()
        r = await task
        assert r.json()["choices"][0]["finish_reason"] == "cancelled"


async def test_an_id_another_tenant_holds_is_answered_as_a_free_one(t: Harness) -> None:
    """Issue 27's gap: a tenant's session ids are its own namespace, so creating an id another
    tenant holds answers exactly as creating one nobody holds (no 409 confirms it exists)."""
    await alices_things(t)
    taken = await t.post("/v1/sessions", {"session_id": "a1"}, headers=BOB)
    free = await t.post("/v1/sessions", {"session_id": "never-used"}, headers=BOB)
    assert taken.status_code == free.status_code == 201, taken.text
    assert taken.json().keys() == free.json().keys() and taken.json()["session_id"] == "a1"
    assert (await t.post("/v1/sessions", {"session_id": "a1"}, headers=BOB)).status_code == 409  # now bob's own
    assert (await t.post("/v1/sessions", {"session_id": "a1"}, headers=ALICE2)).status_code == 409  # alice's own
    # two sessions, one per tenant, each seen by its tenant under the same name
    assert len((await t.client.get("/v1/sessions/a1/history", headers=ALICE)).json()["data"]) == 2
    assert (await t.client.get("/v1/sessions/a1/history", headers=BOB)).json()["data"] == []
    # naming another tenant's stored id does not reach it either: it is in the caller's namespace too
    r = await t.client.get(f"/v1/sessions/{stored('team-a', 'a1')}", headers=BOB)
    assert r.status_code == 404
    # the limit on a tenant's id length leaves room for the prefix, whatever anyone holds
    r = await t.post("/v1/sessions", {"session_id": "x" * 120}, headers=BOB)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_session_id", r.text


async def test_the_admin_names_a_tenants_session_by_its_name_when_one_tenant_has_it(tmp_path: Path) -> None:
    async with serve(tmp_path, named_keys=KEYS, admin_key="adm") as t:
        await alices_things(t)
        r = await t.client.get("/v1/sessions/a1", headers=ADMIN)  # alice's, the only "a1"
        assert r.status_code == 200 and r.json()["session_id"] == stored("team-a", "a1"), r.text
        assert (await t.post("/v1/chat/completions", {**CHAT, "session_id": "a1"}, headers=BOB)).status_code == 200
        r = await t.client.get("/v1/sessions/a1", headers=ADMIN)  # now two tenants have one
        assert r.status_code == 409 and r.json()["error"]["code"] == "session_ambiguous", r.text
        for tenant in ("team-a", "team-b"):
            assert (await t.client.get(f"/v1/sessions/{stored(tenant, 'a1')}", headers=ADMIN)).status_code == 200
