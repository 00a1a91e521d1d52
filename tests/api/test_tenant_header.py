"""A gateway speaks for a tenant (hearth.tenants, docs/gateway.md "Tenants"): a key whose line
says `role=gateway` may name the tenant in X-Hearth-Tenant, and the node then acts exactly as if
that tenant's own key had called; from any other key the header is refused, so a client cannot
claim another tenant."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hearth.tenants import ApiKey
from tests.api.conftest import Harness, serve

ALICE = {"Authorization": "Bearer ka"}
BOB = {"Authorization": "Bearer kb"}
ADMIN = {"Authorization": "Bearer adm"}
GW = {"Authorization": "Bearer kgw"}
KEYS = [ApiKey("ka", "alice", "team-a"), ApiKey("kb", "bob", "team-b"), ApiKey("kgw", "gw", "gw", role="gateway")]
CHAT = {"model": "fake", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}


def as_tenant(tenant: str) -> dict[str, str]:
    return {**GW, "X-Hearth-Tenant": tenant}


@pytest.fixture
async def t(tmp_path: Path) -> AsyncIterator[Harness]:
    async with serve(tmp_path, named_keys=KEYS, admin_key="adm") as harness:
        yield harness


async def test_a_gateway_key_acts_as_the_tenant_it_names(t: Harness) -> None:
    r = await t.post("/v1/chat/completions", {**CHAT, "session_id": "a1"}, headers=as_tenant("team-a"))
    assert r.status_code == 200, r.text
    resp = (await t.post("/v1/responses", {"model": "fake", "input": "hi", "max_output_tokens": 3},
                         headers=as_tenant("team-a"))).json()["id"]
    for path in ("/v1/sessions/a1", f"/v1/responses/{resp}"):
        assert (await t.client.get(path, headers=ALICE)).status_code == 200, path  # the tenant's own key
        assert (await t.client.get(path, headers=as_tenant("team-a"))).status_code == 200, path
        assert (await t.client.get(path, headers=BOB)).status_code == 404, path
        assert (await t.client.get(path, headers=as_tenant("team-b"))).status_code == 404, path
        assert (await t.client.get(path, headers=GW)).status_code == 404, path  # the gateway key's own tenant
    listed = (await t.client.get("/v1/sessions", headers=as_tenant("team-b"))).json()["data"]
    assert listed == []
    # what alice's own key made, the gateway sees for her, and only for her
    r = await t.post("/v1/chat/completions", {**CHAT, "session_id": "a2"}, headers=ALICE)
    assert r.status_code == 200
    mine = {s["session_id"] for s in (await t.client.get("/v1/sessions", headers=as_tenant("team-a"))).json()["data"]}
    assert mine == {"a1", "a2"}


@pytest.mark.parametrize("who", [ALICE, ADMIN], ids=["a client key", "the admin key"])
async def test_the_header_from_any_other_key_is_refused(t: Harness, who: dict[str, str]) -> None:
    r = await t.post("/v1/chat/completions", {**CHAT, "session_id": "b1"}, headers=BOB)
    assert r.status_code == 200
    forged = {**who, "X-Hearth-Tenant": "team-b"}
    for method, path in (("GET", "/v1/sessions/b1"), ("GET", "/v1/sessions"), ("POST", "/v1/chat/completions")):
        r = await t.client.request(method, path, headers=forged, json=CHAT if method == "POST" else None)
        assert r.status_code == 403, (path, r.text)
        assert "role=gateway" in r.json()["error"]["message"]
    assert (await t.client.get("/v1/sessions/b1", headers=BOB)).status_code == 200  # nothing changed


async def test_a_tenant_header_that_is_no_tenant_name_is_a_400(t: Harness) -> None:
    for bad in ("", "a b", "../x", "x" * 65):
        r = await t.client.get("/v1/sessions", headers={**GW, "X-Hearth-Tenant": bad})
        assert r.status_code == 400, (bad, r.text)


async def test_usage_is_counted_to_the_gateway_key_and_to_the_tenant(t: Harness) -> None:
    for _ in range(2):
        assert (await t.post("/v1/chat/completions", CHAT, headers=as_tenant("team-a"))).status_code == 200
    usage = (await t.client.get("/admin/keys/usage", headers=ADMIN)).json()["data"]
    rows = {(r["name"], r.get("via")): r for r in usage}
    gw, tenant = rows[("gw", None)], rows[("team-a", "gw")]
    assert gw["requests"] == tenant["requests"] == 2
    assert tenant["tenant"] == "team-a" and tenant["prompt_tokens"] == gw["prompt_tokens"] > 0
    assert rows[("alice", None)]["requests"] == 0


async def test_without_keys_the_header_changes_nothing(tmp_path: Path) -> None:
    async with serve(tmp_path) as t:
        r = await t.post("/v1/chat/completions", {**CHAT, "session_id": "s"}, headers={"X-Hearth-Tenant": "team-a"})
        assert r.status_code == 200
        assert (await t.client.get("/v1/sessions/s")).status_code == 200
