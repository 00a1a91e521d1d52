"""The fleet endpoints of the gateway in process (over a fake fleet): who may join, leave, drain
and reload, what each answers, and that the join key opens nothing else and is never logged."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from hearth.gateway.app import create_gateway_app
from hearth.gateway.settings import GatewaySettings, load_upstreams

API, ADMIN, JOIN = "gw-api", "gw-admin", "gw-join-secret"
FILE = '[[upstream]]\nname = "a"\nurl = "http://127.0.0.1:9101"\nmodels = { "smol" = "up" }\n'


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def fleet(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/v1/sessions":
        return httpx.Response(200, json={"object": "list", "data": []})
    return httpx.Response(200, json={"status": "ok"})


@contextlib.contextmanager
def gateway(tmp_path: Path, **settings: Any) -> Iterator[TestClient]:
    path = tmp_path / "fleet.toml"
    path.write_text(FILE)
    gs = GatewaySettings(upstreams=load_upstreams(path), upstreams_file=path, data_dir=tmp_path, api_keys=[API],
                         admin_key=ADMIN, probe_interval=60, **settings)
    with TestClient(create_gateway_app(gs, transport=httpx.MockTransport(fleet))) as c:
        yield c


def member(name: str = "b", **spec: Any) -> dict[str, Any]:
    return {"name": name, "url": f"http://127.0.0.1:9{len(name)}02", "kind": "hearth",
            "models": {"smol": "up", "big": "big-model"}, "max_in_flight": 4, "api_key": "node-b-key", **spec}


def test_a_node_joins_with_the_join_key_and_is_listed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with gateway(tmp_path, join_key=JOIN) as c:
        r = c.post("/admin/fleet/join", json=member(), headers=bearer(JOIN))
        assert r.status_code == 200, r.text
        assert r.json()["name"] == "b" and r.json()["renew_every"] == 5.0
        nodes = {n["name"]: n for n in c.get("/admin/status", headers=bearer(ADMIN)).json()["nodes"]}
        assert nodes["b"]["source"] == "joined" and nodes["a"]["source"] == "file" and not nodes["b"]["lapsed"]
        models = [m["id"] for m in c.get("/v1/models", headers=bearer(API)).json()["data"]]
        assert models == ["smol", "big"]
        assert c.post("/admin/fleet/join", json=member(), headers=bearer(ADMIN)).status_code == 200  # admin too
        assert c.delete("/admin/fleet/b", headers=bearer(JOIN)).status_code == 200
        assert "b" not in {n["name"] for n in c.get("/admin/status", headers=bearer(ADMIN)).json()["nodes"]}
    assert JOIN not in caplog.text and "node-b-key" not in caplog.text


def test_the_join_key_opens_only_a_nodes_own_membership(tmp_path: Path) -> None:
    with gateway(tmp_path, join_key=JOIN) as c:
        assert c.post("/admin/fleet/join", json=member(), headers=bearer(JOIN)).status_code == 200
        assert c.get("/admin/status", headers=bearer(JOIN)).status_code == 401  # not even an API key
        assert c.post("/v1/chat/completions", json={"model": "smol", "messages": []},
                      headers=bearer(JOIN)).status_code == 401
        assert c.post("/admin/fleet/reload", headers=bearer(JOIN)).status_code == 401
        assert c.post("/admin/nodes/a/drain", headers=bearer(JOIN)).status_code == 403  # a file upstream
        r = c.post("/admin/nodes/b/drain", headers=bearer(JOIN))  # a joined node drains itself
        assert r.status_code == 200 and r.json()["draining"] is True
        assert c.delete("/admin/fleet/a", headers=bearer(JOIN)).json()["error"]["code"] == "member_in_file"


@pytest.mark.parametrize("key", [None, API, "wrong"])
def test_joining_needs_the_join_or_admin_key(tmp_path: Path, key: str | None) -> None:
    with gateway(tmp_path, join_key=JOIN) as c:
        r = c.post("/admin/fleet/join", json=member(), headers=bearer(key) if key else {})
        assert r.status_code in (401, 403) and "error" in r.json()
        assert c.delete("/admin/fleet/b", headers=bearer(key) if key else {}).status_code in (401, 403)


def test_without_a_join_key_the_admin_key_joins(tmp_path: Path) -> None:
    with gateway(tmp_path) as c:
        assert c.post("/admin/fleet/join", json=member(), headers=bearer(API)).status_code == 403
        assert c.post("/admin/fleet/join", json=member(), headers=bearer(ADMIN)).status_code == 200


@pytest.mark.parametrize("body", [b"{", b"[]", b'{"name": "a/b", "url": "http://x:1", "models": {"m": "m"}}'])
def test_a_bad_registration_is_a_400(tmp_path: Path, body: bytes) -> None:
    with gateway(tmp_path, join_key=JOIN) as c:
        r = c.post("/admin/fleet/join", content=body, headers={**bearer(JOIN), "content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        assert c.post("/admin/fleet/join", json=member("a"), headers=bearer(JOIN)).status_code == 409


def test_reload_applies_the_file_and_refuses_a_bad_one(tmp_path: Path) -> None:
    with gateway(tmp_path, join_key=JOIN) as c:
        (tmp_path / "fleet.toml").write_text(FILE + FILE.replace('"a"', '"c"').replace("9101", "9103"))
        r = c.post("/admin/fleet/reload", headers=bearer(ADMIN))
        assert r.status_code == 200 and r.json()["added"] == ["c"], r.text
        (tmp_path / "fleet.toml").write_text("[[upstream]\n")
        r = c.post("/admin/fleet/reload", headers=bearer(ADMIN))
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_fleet_file"
        assert "fleet.toml" in r.json()["error"]["message"]
        names = {n["name"] for n in c.get("/admin/status", headers=bearer(ADMIN)).json()["nodes"]}
        assert names == {"a", "c"}
