"""Tenants through a real gateway over a real node (docs/gateway.md, "Tenants"): the gateway
checks a key file (two tenants, one with two keys, a limited key) and its admin key; the node
trusts the gateway's key (`role=gateway`) to name the tenant. Over every gateway route that
touches a stored object, each tenant sees exactly its own (another tenant's id: the 404 of a
missing one), the admin sees all, no key gets nothing; a prefix one tenant sent is never
reported cached for the other; a tenant header from a key that is no gateway's crosses nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from hearth.tenants import session_prefix
from tests.e2e.gateway.conftest import GW_ADMIN, Gateway, start_gateway, stop
from tests.helpers import Server, start_server, stop_server

pytestmark = pytest.mark.slow

ALICE, ALICE_CI, BOB, LIMITED = "sk-alice", "sk-alice-ci", "sk-bob", "sk-limited"
NODE_GW, NODE_ADMIN, NODE_BOB = "node-gw-key", "node-admin", "node-bob"
# Longer than one 256-token block of the prompt cache, so its reuse is unmistakable.
SYSTEM = {"role": "system", "content": "You are a careful assistant who answers in one short sentence. " * 20}
Q = {"role": "user", "content": "Name a color."}


@dataclass
class World:
    node: Server
    gw: Gateway

    def call(self, method: str, path: str, key: str | None, body: Any = None,
             headers: dict[str, str] | None = None) -> httpx.Response:
        auth = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.request(method, self.gw.url + path, json=body, headers={**auth, **(headers or {})},
                             timeout=120)

    def on_node(self, path: str, key: str, headers: dict[str, str] | None = None) -> httpx.Response:
        return httpx.get(self.node.url + path, headers={"Authorization": f"Bearer {key}", **(headers or {})},
                         timeout=60)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("gw-tenants")
    (tmp / "node").mkdir()
    node_keys = tmp / "node-keys.txt"
    node_keys.write_text(f"{NODE_GW} name=gateway role=gateway\n{NODE_BOB} name=bob tenant=team-b\n")
    node = start_server(tmp / "node", "--api-key-file", str(node_keys), "--admin-key", NODE_ADMIN,
                        "--parallel", "2", "--ctx", "2048")
    gw_keys = tmp / "gw-keys.txt"
    gw_keys.write_text(f"{ALICE} name=alice tenant=team-a\n{ALICE_CI} name=alice-ci tenant=team-a\n"
                       f"{BOB} name=bob tenant=team-b\n{LIMITED} name=limited rpm=1\n")
    toml = (f'[[upstream]]\nname = "n"\nurl = "{node.url}"\napi_key = "{NODE_GW}"\nadmin_key = "{NODE_ADMIN}"\n'
            'models = { "smol" = "smollm2-135m-instruct" }\nmax_in_flight = 2\n')
    gw = start_gateway(tmp, toml, "--api-key-file", str(gw_keys))
    try:
        yield World(node, gw)
    finally:
        stop(gw.proc)
        stop_server(node)


def chat(w: World, key: str, messages: list[dict[str, Any]], **extra: Any) -> Any:
    with openai.OpenAI(base_url=w.gw.url + "/v1", api_key=key, timeout=600, max_retries=0) as c:
        return c.chat.completions.create(model="smol", messages=messages, temperature=0,  # type: ignore[arg-type]
                                         max_tokens=4, extra_body=extra)


def alices_things(w: World) -> dict[str, str]:
    assert w.call("POST", "/v1/sessions", ALICE, {"session_id": "alice-s", "model": "smol"}).status_code == 201
    chat(w, ALICE, [Q], session_id="alice-s")
    chat(w, ALICE, [Q], session_id="alice-t")  # a session made by its first turn
    r = w.call("POST", "/v1/sessions/alice-s/save", ALICE, {})
    assert r.status_code == 201, r.text
    with openai.OpenAI(base_url=w.gw.url + "/v1", api_key=ALICE, timeout=600, max_retries=0) as c:
        resp = c.responses.create(model="smol", input="Name a fruit.", max_output_tokens=4)
        bg = c.responses.create(model="smol", input="Name a tree.", max_output_tokens=4, background=True)
    return {"snap": r.json()["snapshot_id"], "resp": resp.id, "bg": bg.id}


def routes(ids: dict[str, str]) -> list[tuple[str, str, Any]]:
    """Every gateway route that reads, continues or changes one of alice's objects (deletes apart)."""
    snap, resp, bg = ids["snap"], ids["resp"], ids["bg"]
    return [("GET", "/v1/sessions/alice-s", None), ("GET", "/v1/sessions/alice-t", None),
            ("GET", "/v1/sessions/alice-s/history", None),
            ("POST", "/v1/sessions/alice-s/resize", {"max_seq_len": 2048}),
            ("POST", "/v1/sessions/alice-s/save", {}),
            ("GET", f"/v1/snapshots/{snap}", None), ("GET", f"/v1/snapshots/{snap}/archive", None),
            ("PATCH", f"/v1/snapshots/{snap}", {"title": "renamed"}),
            ("POST", f"/v1/snapshots/{snap}/load", {}),
            ("GET", f"/v1/responses/{resp}", None), ("GET", f"/v1/responses/{bg}", None),
            ("POST", "/v1/chat/completions", {"model": "smol", "max_tokens": 2, "messages": [Q],
                                              "session_id": "alice-s", "session_create": False}),
            ("POST", "/v1/responses", {"model": "smol", "input": "More.", "max_output_tokens": 2,
                                       "previous_response_id": resp})]


def test_each_tenant_sees_exactly_its_own_through_the_gateway(world: World) -> None:
    w = world
    ids = alices_things(w)
    for method, path, body in routes(ids):
        assert w.call(method, path, None, body).status_code == 401, path
        theirs = w.call(method, path, BOB, body)
        assert theirs.status_code == 404, (method, path, theirs.text)
        for key in (ALICE, ALICE_CI, GW_ADMIN):
            if key == GW_ADMIN:  # the admin names a tenant's session by its stored id, as on a node
                path = path.replace("/alice-", "/" + session_prefix("team-a") + "alice-")
                if body and body.get("session_id") == "alice-s":
                    body = {**body, "session_id": session_prefix("team-a") + "alice-s"}
            r = w.call(method, path, key, body)
            assert r.status_code in (200, 201), (method, path, key, r.text)
    for path in ("/v1/sessions", "/v1/snapshots"):
        assert w.call("GET", path, BOB).json()["data"] == [], path
    mine = {s["session_id"] for s in w.call("GET", "/v1/sessions", ALICE_CI).json()["data"]}
    assert {"alice-s", "alice-t"} <= mine
    every = {s["session_id"] for s in w.call("GET", "/v1/sessions", GW_ADMIN).json()["data"]}
    assert {session_prefix("team-a") + "alice-s", session_prefix("team-a") + "alice-t"} <= every
    # another tenant's id is free for bob, as an id nobody holds: his own session, alice's untouched
    r = w.call("POST", "/v1/sessions", BOB, {"session_id": "alice-s", "model": "smol"})
    assert r.status_code == 201 and r.json()["session_id"] == "alice-s", r.text
    assert w.call("GET", "/v1/sessions/alice-s/history", BOB).json()["data"] == []
    assert len(w.call("GET", "/v1/sessions/alice-s/history", ALICE).json()["data"]) >= 2
    # deletes: the gateway's admin only; then gone for alice too
    assert w.call("DELETE", "/v1/sessions/alice-t", BOB).status_code == 403
    assert w.call("DELETE", f"/v1/sessions/{session_prefix('team-a')}alice-t", GW_ADMIN).status_code == 200
    assert w.call("GET", "/v1/sessions/alice-t", ALICE).status_code == 404
    # on the node, what the gateway made for alice is team-a's: bob's own key there does not see it
    assert w.on_node(f"/v1/sessions/{session_prefix('team-a')}alice-s", NODE_BOB).status_code == 404
    assert w.on_node("/v1/sessions/alice-s/history", NODE_BOB).json()["data"] == []  # bob's own "alice-s"
    assert w.on_node("/v1/sessions/alice-s", NODE_GW, {"X-Hearth-Tenant": "team-a"}).status_code == 200
    assert w.on_node("/v1/sessions/alice-s", NODE_GW).status_code == 404  # the gateway key's own tenant
    assert w.on_node(f"/v1/sessions/{session_prefix('team-a')}alice-s", NODE_ADMIN).status_code == 200


def test_a_prefix_is_never_cached_for_another_tenant_through_the_gateway(world: World) -> None:
    first = chat(world, ALICE, [SYSTEM, Q])
    theirs = chat(world, BOB, [SYSTEM, Q])
    assert theirs.usage.prompt_tokens_details.cached_tokens == 0  # bob's namespace holds nothing of alice's
    mine = chat(world, ALICE_CI, [SYSTEM, Q])  # the same tenant, another key
    assert mine.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1


def test_a_forged_tenant_header_crosses_nothing(world: World) -> None:
    w = world
    chat(w, ALICE, [Q], session_id="alice-forged")
    forged = {"X-Hearth-Tenant": "team-a"}
    assert w.call("GET", "/v1/sessions/alice-forged", BOB, headers=forged).status_code == 403  # at the gateway
    assert w.on_node("/v1/sessions/alice-forged", NODE_BOB, forged).status_code == 403  # at the node
    assert w.on_node("/v1/sessions", NODE_BOB, forged).status_code == 403
    assert w.on_node("/v1/sessions/alice-forged", NODE_BOB).status_code == 404


def test_limits_and_usage_per_key_on_the_gateway(world: World) -> None:
    w = world
    body = {"model": "smol", "max_tokens": 2, "messages": [Q]}
    assert w.call("POST", "/v1/chat/completions", LIMITED, body).status_code == 200
    r = w.call("POST", "/v1/chat/completions", LIMITED, body)  # rpm=1
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["code"] == "rate_limit_exceeded"
    rows = {x["name"]: x for x in w.call("GET", "/admin/keys/usage", GW_ADMIN).json()["data"]}
    assert (rows["limited"]["requests"], rows["limited"]["limited"]) == (1, 1)
    assert rows["limited"]["prompt_tokens"] > 0 and rows["limited"]["completion_tokens"] > 0
    node_rows = httpx.get(w.node.url + "/admin/keys/usage", headers={"Authorization": f"Bearer {NODE_ADMIN}"},
                          timeout=30).json()["data"]
    assert any(x.get("via") == "gateway" and x["tenant"] == "limited" and x["requests"] == 1 for x in node_rows)


def test_hearth_keys_usage_pointed_at_the_gateway(world: World) -> None:
    out = subprocess.run([sys.executable, "-m", "hearth.cli.main", "keys", "usage", "--url", world.gw.url,
                          "--api-key", GW_ADMIN, "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert {"alice", "alice-ci", "bob", "limited"} <= {r["name"] for r in json.loads(out.stdout)}
