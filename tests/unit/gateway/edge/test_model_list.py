"""The gateway's /v1/models: the union of its nodes' models, each alias once, with each Hearth
node's status for it (asked of the node's own /v1/models) and the best of them on the card."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from hearth.gateway.app import create_gateway_app
from hearth.gateway.settings import GatewaySettings, Upstream

PORTS = {9201: "a", 9202: "b", 9203: "c"}


def node_card(model_id: str, status: str, aliases: list[str] | None = None) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "meta": {"aliases": aliases or []}, "status": {"value": status}}


class Nodes:
    """Three fake Hearth nodes: `a` and `b` answer /v1/models with `lists[name]`, `c` fails it."""

    def __init__(self) -> None:
        self.lists = {
            "a": [node_card("smollm2", "unloaded"), node_card("qwen-coder", "loading", ["coder-file"])],
            "b": [node_card("smollm2", "loaded")],
        }

    def __call__(self, request: httpx.Request) -> httpx.Response:
        name = PORTS[request.url.port or 0]
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        if request.url.path == "/v1/models" and name in self.lists:
            assert request.headers["authorization"] == f"Bearer up-{name}"  # the node's own key
            return httpx.Response(200, json={"object": "list", "data": self.lists[name]})
        return httpx.Response(500, json={"error": {"message": "boom"}})


@pytest.fixture
def nodes() -> Nodes:
    return Nodes()


@pytest.fixture
def client(tmp_path: Path, nodes: Nodes) -> Iterator[TestClient]:
    ups = [Upstream(name="a", url="http://127.0.0.1:9201", api_key="up-a",
                    models={"smol": "smollm2", "coder": "coder-file"}),
           Upstream(name="b", url="http://127.0.0.1:9202", api_key="up-b", models={"smol": "smollm2"}),
           Upstream(name="c", url="http://127.0.0.1:9203", api_key="up-c", models={"smol": "smollm2", "big": "big"})]
    gs = GatewaySettings(upstreams=ups, data_dir=tmp_path, api_keys=["gw-key"], probe_interval=60, digest_interval=0)
    app = create_gateway_app(gs, transport=httpx.MockTransport(nodes))
    with TestClient(app, headers={"Authorization": "Bearer gw-key"}) as c:
        yield c


def test_every_alias_is_listed_once_with_each_nodes_status(client: TestClient) -> None:
    data = client.get("/v1/models").json()["data"]
    assert [m["id"] for m in data] == ["smol", "coder", "big"]  # the union, in config order, no duplicates
    smol, coder, big = data
    assert smol["nodes"] == [{"node": "a", "model": "smollm2", "status": "unloaded"},
                             {"node": "b", "model": "smollm2", "status": "loaded"},
                             {"node": "c", "model": "smollm2", "status": None}]  # c did not say
    assert smol["status"] == {"value": "loaded"}  # the best of them
    assert coder["nodes"] == [{"node": "a", "model": "coder-file", "status": "loading"}]  # found by its alias
    assert coder["status"] == {"value": "loading"}
    assert big["nodes"] == [{"node": "c", "model": "big", "status": None}] and "status" not in big


def test_one_model_by_its_alias_and_an_unknown_one_is_404(client: TestClient, nodes: Nodes) -> None:
    nodes.lists["b"] = [node_card("smollm2", "unloaded")]
    card = client.get("/v1/models/smol").json()
    assert card["id"] == "smol" and card["status"] == {"value": "unloaded"}
    r = client.get("/v1/models/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_a_node_that_answers_nonsense_costs_only_its_status(client: TestClient, nodes: Nodes) -> None:
    nodes.lists["a"] = [{"id": "smollm2", "status": "loaded"}, "junk", {"status": {"value": "exploded"}}]
    smol = client.get("/v1/models").json()["data"][0]
    assert smol["nodes"][0] == {"node": "a", "model": "smollm2", "status": None}
    assert smol["status"] == {"value": "loaded"}  # from b
