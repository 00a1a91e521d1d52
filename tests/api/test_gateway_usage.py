"""The gateway's usage ledger in process: one row per turn, counted as the nodes reported it. A
completed turn, a failed-over stream (both parts, once), a stream whose client left (its
node's own exact counts, settled off the request path), a turn no node could take; and
`GET /admin/usage` scoped to the caller's tenant over real node apps, whose rows the
gateway's match."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.types import Message

from hearth.gateway.app import create_gateway_app
from hearth.gateway.settings import GatewaySettings, Upstream
from hearth.gateway.state import gateway_of
from hearth.protocols.ollama_wire import ANSWER_ID_HEADER
from tests.api.test_gateway_tenants import ADMIN, ALICE, BOB, CHAT, world
from tests.helpers import until
from tests.helpers.fake_fleet import NEVER, Events, Fleet, sse
from tests.unit.gateway.failover.test_migration import chunk, data

STREAM = {"model": "smol", "messages": [{"role": "user", "content": "hi"}], "stream": True}
DONE = b"data: [DONE]\n\n"


@contextlib.asynccontextmanager
async def gateway(tmp_path: Path, fleet: Fleet) -> AsyncIterator[tuple[Starlette, httpx.AsyncClient]]:
    ups = [Upstream(name=n, url=f"http://127.0.0.1:{port}", api_key=f"up-{n}", models={"smol": "up-model"},
                    max_in_flight=4) for n, port in (("a", 9101), ("b", 9102))]
    gs = GatewaySettings(upstreams=ups, data_dir=tmp_path, probe_interval=60, heartbeat=0.05, digest_interval=0)
    app = create_gateway_app(gs, transport=httpx.MockTransport(fleet))
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gw.test", timeout=30) as client:
        yield app, client


async def leave_after_first_event(app: Starlette, path: str, body: dict[str, Any],
                                  headers: dict[str, str] | None = None, seen: bytes = b"",
                                  event: bytes = b"data: ") -> bytes:
    """POST `body` as a client that disconnects once the first event (a body with `event` in it;
    with `seen` in what it got, when given) has arrived (an ASGI driver: httpx's ASGITransport
    cannot leave mid-stream)."""
    got = asyncio.Event()
    sent: list[bytes] = []
    asked = False

    async def receive() -> Message:
        nonlocal asked
        if not asked:
            asked = True
            return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}
        await got.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.body" and event in message.get("body", b""):
            sent.append(message["body"])
            if seen in b"".join(sent):
                got.set()

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"gw.test"), (b"content-type", b"application/json"),
                         *((k.lower().encode(), v.encode()) for k, v in (headers or {}).items())],
             "client": ("127.0.0.1", 50000), "server": ("gw.test", 80), "state": {}}
    await asyncio.wait_for(app(scope, receive, send), 30)
    return b"".join(sent)


async def rows(client: httpx.AsyncClient, **params: str) -> list[dict[str, Any]]:
    r = await client.get("/admin/usage", params=params)
    assert r.status_code == 200, r.text
    found: list[dict[str, Any]] = r.json()["data"]
    return found


async def test_completed_failed_over_and_failed_turns(tmp_path: Path) -> None:
    fleet = Fleet()
    async with gateway(tmp_path, fleet) as (app, gw):
        assert (await gw.post("/v1/chat/completions", json={**STREAM, "stream": False})).status_code == 200
        [done] = await rows(gw)
        assert (done["prompt_tokens"], done["cached_tokens"], done["generated_tokens"]) == (5, 3, 1)
        assert done["cancelled"] is None and done["status"] == 200 and done["failovers"] == 0
        assert done["request_id"] and done["endpoint"] == "chat" and done["model"] == "smol"

        # a stream whose node breaks after "Hel": the continuation's usage counts both parts
        fleet.behave = {
            "a": lambda r: sse(chunks=[chunk("chatcmpl-1", {"role": "assistant", "content": ""}),
                                       chunk("chatcmpl-1", {"content": "Hel"})], broken=True),
            "b": lambda r: sse(chunks=[chunk("chatcmpl-2", {"content": "lo"}), chunk("chatcmpl-2", {}, "stop"),
                                       data({"id": "chatcmpl-2", "choices": [],
                                             "usage": {"prompt_tokens": 5, "completion_tokens": 3}}), DONE])}
        pool = gateway_of(app).pool
        pool._soft["header:k"] = "a"
        r = await gw.post("/v1/chat/completions", json=STREAM, headers={"X-Session-Id": "k"})
        assert r.status_code == 200 and "Hello" not in r.text  # the text comes in pieces
        moved = (await rows(gw))[0]
        assert (moved["nodes"], moved["node"], moved["failovers"]) == ("a,b", "b", 1)
        assert moved["generated_tokens"] == 3 and moved["prompt_tokens"] == 5 and moved["error"] is None

        # no node can take it: one row, the error the client got
        def refuse(r: httpx.Request) -> httpx.Response:
            raise httpx.ConnectError("connection refused", request=r)
        fleet.behave = {"a": refuse, "b": refuse}
        assert (await gw.post("/v1/chat/completions", json=STREAM)).status_code == 503
        failed = (await rows(gw))[0]
        assert failed["status"] == 503 and failed["error"] and failed["retries"] == 2
        assert sorted(failed["nodes"].split(",")) == ["a", "b"] and failed["generated_tokens"] == 0

        [total] = (await gw.get("/admin/usage", params={"group": ""})).json()["data"]
        assert (total["requests"], total["generated_tokens"], total["failovers"]) == (3, 4, 1)
        by_node = (await gw.get("/admin/usage", params={"group": "node"})).json()["data"]
        assert sum(s["requests"] for s in by_node) == 3 and {s["node"] for s in by_node} <= {"a", "b"}

        # the writer on /metrics, in the node's families: the three rows committed, none waiting
        metrics = (await gw.get("/metrics")).text
        assert "hearth_usage_ledger_written_total 3.0" in metrics
        assert "hearth_usage_ledger_dropped_total 0.0" in metrics
        assert "hearth_usage_ledger_queue_depth 0.0" in metrics


async def test_a_stream_the_client_left_counts_its_nodes_exact_tokens(tmp_path: Path) -> None:
    fleet = Fleet()
    asked: list[str] = []

    def node(r: httpx.Request) -> httpx.Response:
        if r.url.path == "/admin/usage":  # the node's own row, once its stream closed
            asked.append(r.url.params["request_id"])
            found = [{"request_id": "chatcmpl-1", "prompt_tokens": 9, "cached_tokens": 2, "generated_tokens": 7,
                      "discarded_tokens": 6, "cancelled": "disconnect"}] if len(asked) > 1 else []
            return httpx.Response(200, json={"object": "list", "data": found})
        return sse(chunks=[chunk("chatcmpl-1", {"role": "assistant", "content": ""})], stall=NEVER)  # still going

    fleet.behave["a"] = fleet.behave["b"] = node
    async with gateway(tmp_path, fleet) as (app, gw):
        got = await leave_after_first_event(app, "/v1/chat/completions", STREAM)
        assert b"chatcmpl-1" in got
        ledger = gateway_of(app).proxy.ledger
        assert ledger is not None
        await until(lambda: ledger.settling == 0, "the cancelled turn's counts to be settled")
        [row] = await rows(gw)
        assert asked == ["chatcmpl-1", "chatcmpl-1"]  # the first lookup came before the node's row
        assert row["cancelled"] == "disconnect" and row["finish_reason"] == "cancelled"
        assert (row["prompt_tokens"], row["cached_tokens"], row["generated_tokens"], row["discarded_tokens"]) == (
            9, 2, 7, 6)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/chat"])
async def test_a_failed_over_stream_the_client_left_counts_each_parts_exact_tokens(tmp_path: Path, path: str) -> None:
    # "Hel" on a, which breaks; the continuation "lo" on b, which is still going when the client
    # leaves. Each node's own row (a: the broken first answer, b: its continuation, which counts
    # only what it generated) is looked up under that node's answer id (in its events, or for
    # Ollama in its header); the gateway's row adds them.
    ollama = path == "/api/chat"
    fleet = Fleet()
    asked: list[tuple[str, str]] = []
    node_rows = {"a": {"request_id": "chatcmpl-1", "prompt_tokens": 9, "cached_tokens": 2, "generated_tokens": 4,
                       "discarded_tokens": 3, "cancelled": "disconnect"},
                 "b": {"request_id": "chatcmpl-2", "prompt_tokens": 9, "cached_tokens": 9, "generated_tokens": 5,
                       "discarded_tokens": 4, "cancelled": "disconnect"}}

    def node(name: str) -> Callable[[httpx.Request], httpx.Response]:
        def answer(r: httpx.Request) -> httpx.Response:
            if r.url.path == "/admin/usage":
                asked.append((name, r.url.params["request_id"]))
                found = [node_rows[name]] if r.url.params["request_id"] == node_rows[name]["request_id"] else []
                return httpx.Response(200, json={"object": "list", "data": found})
            if name == "a":
                return ndjson("chatcmpl-1", [piece("Hel")], broken=True) if ollama else sse(
                    chunks=[chunk("chatcmpl-1", {"role": "assistant", "content": ""}),
                            chunk("chatcmpl-1", {"content": "Hel"})], broken=True)
            return ndjson("chatcmpl-2", [piece("lo")]) if ollama else sse(  # still going
                chunks=[chunk("chatcmpl-2", {"role": "assistant", "content": ""}),
                        chunk("chatcmpl-2", {"content": "lo"})], stall=NEVER)
        return answer

    fleet.behave = {"a": node("a"), "b": node("b")}
    async with gateway(tmp_path, fleet) as (app, gw):
        gateway_of(app).pool._soft["header:k"] = "a"
        got = await leave_after_first_event(app, path, STREAM, {"X-Session-Id": "k"}, b'"lo"',
                                            b'"done"' if ollama else b"data: ")
        assert b"Hel" in got and b"chatcmpl-2" not in got  # the client sees one answer, the first's id
        ledger = gateway_of(app).proxy.ledger
        assert ledger is not None
        await until(lambda: ledger.settling == 0, "the cancelled turn's counts to be settled")
        [row] = await rows(gw)
        assert sorted(asked) == [("a", "chatcmpl-1"), ("b", "chatcmpl-2")]
        assert (row["request_id"], row["nodes"], row["failovers"], row["cancelled"]) == (
            "chatcmpl-1", "a,b", 1, "disconnect")
        assert (row["prompt_tokens"], row["cached_tokens"], row["generated_tokens"], row["discarded_tokens"]) == (
            9, 2, 4 + 5, 3 + 4)


def ndjson(answer_id: str, lines: list[dict[str, Any]], broken: bool = False) -> httpx.Response:
    """A node's Ollama stream: these lines, then still going (or broken), named by its header."""
    return httpx.Response(200, headers={"content-type": "application/x-ndjson", ANSWER_ID_HEADER: answer_id},
                          stream=Events([json.dumps(x).encode() + b"\n" for x in lines], broken,
                                        stall=0 if broken else NEVER))


def piece(text: str) -> dict[str, Any]:
    return {"model": "up-model", "message": {"role": "assistant", "content": text}, "done": False}


async def test_an_ollama_stream_the_client_left_counts_its_nodes_exact_tokens(tmp_path: Path) -> None:
    # Ollama's objects carry no id: the node names its answer (its ledger row) in a header.
    fleet = Fleet()
    asked: list[str] = []

    def node(r: httpx.Request) -> httpx.Response:
        if r.url.path == "/admin/usage":
            asked.append(r.url.params["request_id"])
            found = [{"request_id": "chatcmpl-7", "prompt_tokens": 9, "cached_tokens": 0, "generated_tokens": 11,
                      "discarded_tokens": 8, "cancelled": "disconnect"}]
            return httpx.Response(200, json={"object": "list", "data": found})
        return ndjson("chatcmpl-7", [piece("Hel"), piece("lo")])

    fleet.behave["a"] = fleet.behave["b"] = node
    async with gateway(tmp_path, fleet) as (app, gw):
        got = await leave_after_first_event(app, "/api/chat", {**STREAM, "stream": True}, event=b'"done"')
        assert b"Hel" in got
        ledger = gateway_of(app).proxy.ledger
        assert ledger is not None
        await until(lambda: ledger.settling == 0, "the cancelled turn's counts to be settled")
        [row] = await rows(gw)
        assert asked == ["chatcmpl-7"]
        assert (row["request_id"], row["endpoint"], row["cancelled"]) == ("chatcmpl-7", "ollama_chat", "disconnect")
        assert (row["prompt_tokens"], row["generated_tokens"], row["discarded_tokens"]) == (9, 11, 8)


async def test_usage_is_scoped_to_the_callers_tenant_over_real_nodes(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        answers: dict[str, list[dict[str, Any]]] = {}
        for who, name in ((ALICE, "alice"), (ALICE, "alice"), (BOB, "bob")):
            r = await w.call("POST", "/v1/chat/completions", who, CHAT)
            assert r.status_code == 200, r.text
            answers.setdefault(name, []).append(r.json())
        mine = (await w.gw.get("/admin/usage", headers=ALICE, params={"tenant": "team-b"})).json()["data"]
        assert {r["tenant"] for r in mine} == {"team-a"} and len(mine) == 2  # its own, whatever it asks
        assert sum(r["generated_tokens"] for r in mine) == sum(a["usage"]["completion_tokens"]
                                                               for a in answers["alice"])
        assert all(r["prompt_tokens"] == a["usage"]["prompt_tokens"] for r, a in zip(
            reversed(mine), answers["alice"], strict=True))
        every = (await w.gw.get("/admin/usage", headers=ADMIN, params={"group": "tenant,key"})).json()
        assert [(r["tenant"], r["key"], r["requests"]) for r in every["data"]] == [
            ("team-a", "alice", 2), ("team-b", "bob", 1)]
        bad = await w.gw.get("/admin/usage", headers=ADMIN, params={"group": "price"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "group"
        # a stream without usage (no stream_options): counted from the node's last chunk, as the node counts it
        r = await w.call("POST", "/v1/chat/completions", BOB, {**CHAT, "stream": True})
        assert r.status_code == 200 and '"usage"' not in r.text
        streamed = (await w.gw.get("/admin/usage", headers=BOB)).json()["data"][0]
        node_rows = [r for h in (w.a, w.b) for r in (await h.client.get(
            "/admin/usage", params={"request_id": streamed["request_id"]},
            headers={"Authorization": "Bearer node-adm"})).json()["data"]]
        assert len(node_rows) == 1, (streamed, node_rows)
        for count in ("prompt_tokens", "cached_tokens", "generated_tokens"):
            assert streamed[count] == node_rows[0][count], count
        assert streamed["generated_tokens"] > 0
