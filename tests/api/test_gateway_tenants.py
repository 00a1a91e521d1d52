"""Tenants through the gateway, in-process (docs/gateway.md, "Tenants"): the real gateway app over
two real node apps (scripted backends), joined by ASGI transports. The gateway checks its own
keys (a key file: two tenants and an admin), sends each node its own `role=gateway` key with the
caller's tenant, and scopes its own records the same: each tenant sees exactly its own, another
tenant's id is the 404 a missing one gets, the admin sees all; limits and usage per key."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from hearth.gateway.app import create_gateway_app
from hearth.gateway.settings import GatewaySettings, Upstream
from hearth.gateway.state import gateway_of
from hearth.tenants import ApiKey, session_prefix
from tests.api.conftest import Harness, serve

ALICE = {"Authorization": "Bearer ka"}
ALICE2 = {"Authorization": "Bearer ka2"}
BOB = {"Authorization": "Bearer kb"}
LIMITED = {"Authorization": "Bearer kl"}
ADMIN = {"Authorization": "Bearer gw-adm"}
GW_KEYS = [ApiKey("ka", "alice", "team-a"), ApiKey("ka2", "alice-ci", "team-a"), ApiKey("kb", "bob", "team-b"),
           ApiKey("kl", "limited", "team-l", rpm=1)]
# The nodes know the tenants' keys too (a tenant may call a node directly) and the gateway's key.
NODE_KEYS = [ApiKey("ka", "alice", "team-a"), ApiKey("kb", "bob", "team-b"),
             ApiKey("node-gw", "gateway", "gateway", role="gateway")]
A1 = session_prefix("team-a") + "a1"  # alice's "a1" as stored, and as the admin names it
CHAT = {"model": "smol", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}


class Fleet(httpx.AsyncBaseTransport):
    """Two node apps by port; a node in `down` refuses connections."""

    def __init__(self, nodes: dict[int, Harness]) -> None:
        self.nodes = {port: httpx.ASGITransport(app=h.app, raise_app_exceptions=False) for port, h in nodes.items()}
        self.down: set[int] = set()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        port = request.url.port or 0
        if port in self.down:
            raise httpx.ConnectError("connection refused", request=request)
        return await self.nodes[port].handle_async_request(request)


@dataclass
class World:
    gw: httpx.AsyncClient
    a: Harness
    b: Harness
    fleet: Fleet

    async def call(self, method: str, path: str, who: dict[str, str], body: Any = None) -> httpx.Response:
        return await self.gw.request(method, path, json=body, headers=who)


@contextlib.asynccontextmanager
async def world(tmp_path: Path, gw_admin: str | None = "gw-adm") -> AsyncIterator[World]:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with serve(tmp_path / "a", named_keys=NODE_KEYS, admin_key="node-adm") as a, \
            serve(tmp_path / "b", named_keys=NODE_KEYS, admin_key="node-adm") as b:
        fleet = Fleet({9101: a, 9102: b})
        ups = [Upstream(name=n, url=f"http://127.0.0.1:{port}", api_key="node-gw", admin_key="node-adm",
                        models={"smol": "fake"}, max_in_flight=4) for n, port in (("a", 9101), ("b", 9102))]
        settings = GatewaySettings(upstreams=ups, data_dir=tmp_path / "gw", named_keys=GW_KEYS, admin_key=gw_admin,
                                   probe_interval=60, digest_interval=0, heartbeat=0.05)
        app = create_gateway_app(settings, transport=fleet)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://gw.test", timeout=30) as gw:
                yield World(gw, a, b, fleet)
            await gateway_of(app).proxy.continuity.idle()


@pytest.fixture
async def w(tmp_path: Path) -> AsyncIterator[World]:
    async with world(tmp_path) as it:
        yield it


async def alices_things(w: World) -> dict[str, str]:
    r = await w.call("POST", "/v1/sessions", ALICE, {"session_id": "a1", "model": "smol"})
    assert r.status_code == 201, r.text
    r = await w.call("POST", "/v1/chat/completions", ALICE, {**CHAT, "session_id": "a1"})
    assert r.status_code == 200, r.text
    r = await w.call("POST", "/v1/chat/completions", ALICE, {**CHAT, "session_id": "a2"})  # made by its turn
    assert r.status_code == 200, r.text
    r = await w.call("POST", "/v1/sessions/a1/save", ALICE, {})
    assert r.status_code == 201, r.text
    snap = r.json()["snapshot_id"]
    r = await w.call("POST", "/v1/responses", ALICE, {"model": "smol", "input": "hi", "max_output_tokens": 3})
    assert r.status_code == 200, r.text
    bg = await w.call("POST", "/v1/responses", ALICE, {"model": "smol", "input": "hi", "max_output_tokens": 3,
                                                         "background": True})
    assert bg.status_code == 200, bg.text
    return {"snap": snap, "resp": r.json()["id"], "bg": bg.json()["id"]}


def reads(ids: dict[str, str]) -> list[tuple[str, str, dict[str, Any] | None]]:
    """Every gateway route that reads or changes one of alice's objects without deleting it."""
    snap, resp, bg = ids["snap"], ids["resp"], ids["bg"]
    return [
        ("GET", "/v1/sessions/a1", None),
        ("GET", "/v1/sessions/a2", None),
        ("GET", "/v1/sessions/a1/history", None),
        ("POST", "/v1/sessions/a1/rollback", {"keep_messages": 2}),
        ("POST", "/v1/sessions/a1/save", {}),
        ("GET", f"/v1/snapshots/{snap}", None),
        ("GET", f"/v1/snapshots/{snap}/archive", None),
        ("PATCH", f"/v1/snapshots/{snap}", {"title": "renamed"}),
        ("POST", f"/v1/snapshots/{snap}/load", {"session_id": "copy"}),
        ("GET", f"/v1/responses/{resp}", None),
        ("GET", f"/v1/responses/{bg}", None),
        ("POST", "/v1/chat/completions", {**CHAT, "session_id": "a1", "session_create": False}),
        ("POST", "/v1/responses", {"model": "smol", "input": "more", "previous_response_id": resp}),
    ]


async def test_each_tenant_sees_exactly_its_own_through_the_gateway(w: World) -> None:
    ids = await alices_things(w)
    for method, path, body in reads(ids):
        theirs = await w.call(method, path, BOB, body)
        assert theirs.status_code == 404, (method, path, theirs.text)
    # deletes: another tenant's id is not found either, and nothing is deleted
    for path in ("/v1/sessions/a1", f"/v1/snapshots/{ids['snap']}", f"/v1/responses/{ids['resp']}"):
        assert (await w.call("DELETE", path, BOB)).status_code == 403  # a DELETE needs the gateway's admin key
    for method, path, body in reads(ids):
        for who in (ALICE, ALICE2, ADMIN):
            if path.endswith("/load"):
                body = {"session_id": "copy-" + who["Authorization"].removeprefix("Bearer ")}
            if who is ADMIN:  # the admin names a tenant's session by its stored id, as on a node
                path = path.replace("/a1", "/" + A1).replace("/a2", "/" + session_prefix("team-a") + "a2")
                body = {**body, "session_id": A1} if body and "session_id" in body and path.endswith(
                    "/completions") else body
            r = await w.call(method, path, who, body)
            assert r.status_code in (200, 201), (method, path, who, r.text)
    assert (await w.call("GET", "/v1/sessions", BOB)).json()["data"] == []
    assert (await w.call("GET", "/v1/snapshots", BOB)).json()["data"] == []
    mine = {s["session_id"] for s in (await w.call("GET", "/v1/sessions", ALICE2)).json()["data"]}
    assert {"a1", "a2", "copy-ka", "copy-ka2"} <= mine
    every = {s["session_id"] for s in (await w.call("GET", "/v1/sessions", ADMIN)).json()["data"]}
    assert {A1, session_prefix("team-a") + "a2"} <= every  # the admin sees the stored ids
    # the nodes hold them as alice's: her own key sees them there, bob's does not
    node = w.a if (await w.a.client.get(f"/v1/sessions/{A1}", headers={"Authorization": "Bearer node-adm"})
                   ).status_code == 200 else w.b
    assert (await node.client.get("/v1/sessions/a1", headers=ALICE)).status_code == 200
    assert (await node.client.get("/v1/sessions/a1", headers=BOB)).status_code == 404


async def test_a_session_id_another_tenant_holds_is_free_for_this_one(w: World) -> None:
    """A tenant's session ids are its own namespace, at the gateway as on a node: an id another
    tenant holds is created as one nobody holds, and each tenant keeps its own under that name."""
    await alices_things(w)
    r = await w.call("POST", "/v1/sessions", BOB, {"session_id": "a1", "model": "smol"})
    assert r.status_code == 201 and r.json()["session_id"] == "a1", r.text
    r = await w.call("POST", "/v1/chat/completions", BOB, {**CHAT, "session_id": "a1"})
    assert r.status_code == 200, r.text
    assert len((await w.call("GET", "/v1/sessions/a1/history", BOB)).json()["data"]) == 2
    # alice's session is untouched: still hers, still where it was
    hist = (await w.call("GET", "/v1/sessions/a1/history", ALICE)).json()["data"]
    assert len(hist) == 2  # her one turn (alices_things)


async def test_without_a_key_nothing_is_served(w: World) -> None:
    ids = await alices_things(w)
    for method, path, body in reads(ids):
        r = await w.call(method, path, {}, body)
        assert r.status_code == 401, (method, path)


async def test_a_forged_tenant_header_is_refused(w: World) -> None:
    await alices_things(w)
    r = await w.call("GET", "/v1/sessions/a1", {**BOB, "X-Hearth-Tenant": "team-a"})
    assert r.status_code == 403, r.text
    r = await w.call("GET", "/v1/sessions", {**BOB, "X-Hearth-Tenant": "team-a"})
    assert r.status_code == 403, r.text


async def test_a_replayed_transcript_is_its_owners_on_the_new_node(w: World) -> None:
    r = await w.call("POST", "/v1/chat/completions", ALICE, {**CHAT, "session_id": "s"})
    assert r.status_code == 200
    first = r.headers["x-hearth-upstream"]
    other = "b" if first == "a" else "a"
    w.fleet.down.add(9101 if first == "a" else 9102)
    r = await w.call("POST", "/v1/chat/completions", ALICE, {**CHAT, "session_id": "s"})
    assert r.status_code == 200, r.text
    assert r.headers["x-hearth-upstream"] == other
    there = w.b if other == "b" else w.a
    assert (await there.client.get("/v1/sessions/s", headers=ALICE)).status_code == 200  # alice's on the new node
    assert (await there.client.get("/v1/sessions/s", headers=BOB)).status_code == 404
    hist = (await there.client.get("/v1/sessions/s/history", headers=ALICE)).json()["data"]
    assert len(hist) == 4


async def test_limits_and_usage_per_key_on_the_gateway(w: World) -> None:
    r = await w.call("POST", "/v1/chat/completions", LIMITED, CHAT)
    assert r.status_code == 200
    r = await w.call("POST", "/v1/chat/completions", LIMITED, CHAT)  # rpm=1
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["code"] == "rate_limit_exceeded"
    r = await w.call("POST", "/v1/messages", LIMITED, {**CHAT, "max_tokens": 3})
    assert r.status_code == 429 and r.json()["type"] == "error"  # Anthropic's envelope
    assert r.json()["error"]["type"] == "rate_limit_error"
    assert (await w.call("POST", "/v1/chat/completions", ALICE, CHAT)).status_code == 200  # others unaffected
    rows = {x["name"]: x for x in (await w.call("GET", "/admin/keys/usage", ADMIN)).json()["data"]}
    assert (rows["limited"]["requests"], rows["limited"]["limited"]) == (1, 2)
    assert rows["alice"]["requests"] == 1 and rows["alice"]["prompt_tokens"] > 0
    assert rows["alice"]["completion_tokens"] > 0
    assert (await w.call("GET", "/admin/keys/usage", ALICE)).status_code == 403
    text = (await w.call("GET", "/metrics", ADMIN)).text
    assert 'hearth_key_requests_total{key="alice",tenant="team-a",via=""} 1.0' in text
    # the node counted the gateway's requests for each tenant on a row of its own
    node_rows = []
    for node in (w.a, w.b):
        data = (await node.client.get("/admin/keys/usage", headers={"Authorization": "Bearer node-adm"})).json()
        node_rows += [x for x in data["data"] if x.get("via") == "gateway" and x["tenant"] == "team-a"]
    assert sum(x["requests"] for x in node_rows) == 1


async def test_the_admin_deletes_and_a_tenant_deletes_only_its_own(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        ids = await alices_things(w)
        assert (await w.call("DELETE", f"/v1/sessions/{A1}", ADMIN)).status_code == 200
        assert (await w.call("GET", "/v1/sessions/a1", ALICE)).status_code == 404
        # the id is free again, for anyone: bob's now, and alice's 404
        assert (await w.call("POST", "/v1/sessions", BOB, {"session_id": "a1", "model": "smol"})).status_code == 201
        assert (await w.call("GET", "/v1/sessions/a1", BOB)).status_code == 200
        assert (await w.call("GET", "/v1/sessions/a1", ALICE)).status_code == 404
        assert (await w.call("DELETE", f"/v1/snapshots/{ids['snap']}", ADMIN)).status_code == 200
        assert (await w.call("GET", f"/v1/snapshots/{ids['snap']}", ALICE)).status_code == 404


async def test_without_a_gateway_admin_key_a_tenant_deletes_only_its_own(tmp_path: Path) -> None:
    """The node's admin key (which sees every tenant's) goes upstream for a tenant's DELETE only
    once the node has shown the tenant the object, asked as the tenant."""
    async with world(tmp_path, gw_admin=None) as w:
        ids = await alices_things(w)
        for path in ("/v1/sessions/a1", f"/v1/snapshots/{ids['snap']}", f"/v1/responses/{ids['resp']}"):
            r = await w.call("DELETE", path, BOB)
            assert r.status_code == 404, (path, r.text)
            assert (await w.call("GET", path, ALICE)).status_code == 200, path  # still there
        for path in ("/v1/sessions/a1", f"/v1/snapshots/{ids['snap']}", f"/v1/responses/{ids['resp']}"):
            assert (await w.call("DELETE", path, ALICE2)).status_code == 200, path  # her tenant's own
            assert (await w.call("GET", path, ALICE)).status_code == 404, path
