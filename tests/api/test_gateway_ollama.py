"""Ollama's API through the gateway, in process over a fake fleet: a request goes to a node that
serves its model (renamed both ways), NDJSON is relayed line by line, a node that fails before
the first byte is left for another, /api/tags and /api/ps are the nodes' union, and what a
gateway does not do is refused in Ollama's shape."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from starlette.testclient import TestClient

from hearth.gateway.app import create_gateway_app
from hearth.gateway.routing.policy import Candidate
from hearth.gateway.settings import GatewaySettings, load_upstreams
from tests.helpers.fake_fleet import Events, pool_of

FILE = ('[[upstream]]\nname = "a"\nurl = "http://127.0.0.1:9101"\nmodels = { "smol" = "up-a" }\n'
        '[[upstream]]\nname = "b"\nurl = "http://127.0.0.1:9102"\nmodels = { "smol" = "up-b", "coder" = "qwen" }\n')


class Fleet:
    """Node a fails every generation (`a_fails`: "connect" or a status); node b answers."""

    def __init__(self, a_fails: str = "connect") -> None:
        self.a_fails = a_fails
        self.seen: list[tuple[str, str, dict[str, Any]]] = []  # (node, path, body)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        node = "a" if request.url.port == 9101 else "b"
        path = request.url.path
        body = json.loads(request.content) if request.content else {}
        if path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        if path == "/api/tags":
            mid = "up-a" if node == "a" else "up-b"
            models = [{"name": f"{mid}:latest", "model": f"{mid}:latest", "size": 7, "digest": "d" * 64,
                       "details": {"format": "gguf", "family": "llama"}}]
            if node == "b":
                models.append({"name": "qwen:latest", "model": "qwen:latest", "size": 9, "digest": "e" * 64,
                               "details": {"format": "gguf", "family": "qwen2"}})
            return httpx.Response(200, json={"models": models})
        if path == "/api/ps":
            return httpx.Response(200, json={"models": [{"name": "up-b:latest", "model": "up-b:latest",
                                                         "size_vram": 0}] if node == "b" else []})
        self.seen.append((node, path, body))
        if node == "a" and path in ("/api/chat", "/api/generate"):
            if self.a_fails == "connect":
                raise httpx.ConnectError("refused", request=request)
            return httpx.Response(int(self.a_fails), json={"error": "boom"})
        if path == "/api/chat" and body.get("stream", True):
            tagged = f"{body['model']}:latest"
            lines = [{"model": tagged, "message": {"role": "assistant", "content": c}, "done": False} for c in "Hi!"]
            lines.append({"model": tagged, "message": {"role": "assistant", "content": ""}, "done": True,
                          "done_reason": "stop"})
            return httpx.Response(200, stream=Events([b"".join(json.dumps(ln).encode() + b"\n" for ln in lines)]),
                                  headers={"content-type": "application/x-ndjson"})
        return httpx.Response(200, json={"model": f"{body.get('model') or body.get('name')}:latest", "echo": body})


class FirstByName:
    """Stands in for the chooser's random tie-break: the first node by name (a), so the node that
    fails is always tried first and the verdict does not depend on chance."""

    def choice(self, options: list[Candidate]) -> Candidate:
        return min(options, key=lambda c: c.name)


@contextlib.contextmanager
def gateway(tmp_path: Path, fleet: Fleet) -> Iterator[TestClient]:
    path = tmp_path / "fleet.toml"
    path.write_text(FILE)
    gs = GatewaySettings(upstreams=load_upstreams(path), upstreams_file=path, data_dir=tmp_path, probe_interval=60)
    with TestClient(create_gateway_app(gs, transport=httpx.MockTransport(fleet))) as c:
        pool_of(c).chooser.rng = FirstByName()  # type: ignore[assignment]
        yield c


CHAT = {"model": "smol:latest", "messages": [{"role": "user", "content": "Hi"}]}


def test_ndjson_is_relayed_from_a_node_that_serves_the_model(tmp_path: Path) -> None:
    fleet = Fleet()
    with gateway(tmp_path, fleet) as c:
        for _ in range(3):
            r = c.post("/api/chat", json=CHAT)
            assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
            assert r.headers["x-hearth-upstream"] == "b"
            lines = [json.loads(ln) for ln in r.text.splitlines()]
            assert "".join(ln["message"]["content"] for ln in lines) == "Hi!" and lines[-1]["done"] is True
            assert {ln["model"] for ln in lines} == {"smol:latest"}  # the node's id renamed back
        chats = [(node, body["model"]) for node, path, body in fleet.seen if path == "/api/chat"]
        # a was tried, failed before the first byte and was left for b
        assert {m for node, m in chats if node == "b"} == {"up-b"} and ("a", "up-a") in chats


def test_a_5xx_before_the_first_byte_goes_to_the_next_node(tmp_path: Path) -> None:
    # the turn path's retry statuses (failover/retry.py): 429, 502, 503, 504 (a 500 is the node's answer)
    with gateway(tmp_path, Fleet(a_fails="503")) as c:
        for _ in range(3):
            r = c.post("/api/generate", json={"model": "smol", "prompt": "x", "stream": False})
            assert r.status_code == 200 and r.headers["x-hearth-upstream"] == "b"
            assert r.json()["model"] == "smol:latest" and r.json()["echo"]["model"] == "up-b"


def test_models_only_one_node_serves_and_embeddings(tmp_path: Path) -> None:
    fleet = Fleet()
    with gateway(tmp_path, fleet) as c:
        r = c.post("/api/show", json={"name": "coder"})
        assert r.status_code == 200 and r.json()["echo"]["name"] == "qwen"
        for path in ("/api/embed", "/api/embeddings", "/v1/embeddings"):
            r = c.post(path, json={"model": "coder", "input": "hello"})
            assert r.status_code == 200, path
            assert [(s[0], s[1], s[2]["model"]) for s in fleet.seen if s[1] == path] == [("b", path, "qwen")]


def test_tags_and_ps_are_the_union_under_the_gateways_names(tmp_path: Path) -> None:
    with gateway(tmp_path, Fleet()) as c:
        tags = c.get("/api/tags").json()["models"]
        assert [m["name"] for m in tags] == ["smol:latest", "coder:latest"]
        assert tags[1]["details"]["family"] == "qwen2" and tags[1]["size"] == 9
        ps = c.get("/api/ps").json()["models"]
        assert [(m["name"], m["node"]) for m in ps] == [("smol:latest", "b")]
        assert c.get("/api/version").json()["version"].count(".") == 2


def test_refusals_are_in_ollamas_shape(tmp_path: Path) -> None:
    with gateway(tmp_path, Fleet()) as c:
        r = c.post("/api/chat", json={**CHAT, "model": "nope"})
        assert r.status_code == 404 and r.json() == {"error": 'model "nope" not found, try pulling it first'}
        for method, path in (("POST", "/api/pull"), ("DELETE", "/api/delete")):
            r = c.request(method, path, json={"model": "smol"})
            assert r.status_code == 400 and list(r.json()) == ["error"], r.text
        r = c.post("/api/chat", content=b"{bad")
        assert r.status_code == 400 and list(r.json()) == ["error"]
