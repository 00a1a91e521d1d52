"""Ollama's /api/chat and /api/generate through the gateway's turn path, in process over fake
nodes: a node that dies after N NDJSON lines is continued on the other (the partial answer sent
as a prefill counted as output), the client gets the whole answer once with one final object
whose counts and durations are the whole answer's; one ledger row per Ollama turn and per
embeddings request; the gateway's spans for them, its trace carried to each node."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.testclient import TestClient

from hearth.gateway.app import create_gateway_app
from hearth.gateway.settings import GatewaySettings, Upstream
from hearth.gateway.state import gateway_of
from hearth.observability.tracing import Tracing
from tests.api.test_gateway_traces import TRACE_ID, TRACEPARENT, attrs, by_id, parent_of
from tests.api.test_gateway_usage import gateway, rows
from tests.helpers.fake_fleet import Events, Fleet, stick

CHAT: dict[str, Any] = {"model": "smol", "messages": [{"role": "user", "content": "hi"}], "options": {"temperature": 0}}
NDJSON = {"content-type": "application/x-ndjson"}


def ndjson(lines: list[dict[str, Any]], broken: bool = False) -> httpx.Response:
    return httpx.Response(200, headers=NDJSON, stream=Events([json.dumps(ln).encode() + b"\n" for ln in lines],
                                                             broken=broken))


def piece(text: str = "", thinking: str = "", kind: str = "chat") -> dict[str, Any]:
    if kind == "generate":
        return {"model": "up-model:latest", "response": text, **({"thinking": thinking} if thinking else {}),
                "done": False}
    message = {"role": "assistant", "content": text, **({"thinking": thinking} if thinking else {})}
    return {"model": "up-model:latest", "message": message, "done": False}


def final(kind: str = "chat", eval_count: int = 4) -> dict[str, Any]:
    return {**piece(kind=kind), "done": True, "done_reason": "stop", "total_duration": 7, "load_duration": 1,
            "prompt_eval_count": 5, "prompt_eval_duration": 2, "eval_count": eval_count, "eval_duration": 3}


def lines_of(text: str) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in text.splitlines() if ln]


def body_of(r: httpx.Request) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(r.content)
    return out


async def test_a_chat_cut_after_two_lines_goes_on_on_the_other_node_once(tmp_path: Path) -> None:
    fleet = Fleet()
    fleet.behave["a"] = lambda r: ndjson([piece(thinking="hm"), piece("Hel"), piece("lo")], broken=True)
    fleet.behave["b"] = lambda r: ndjson([piece(" world"), final()])
    async with gateway(tmp_path, fleet) as (app, gw):
        gateway_of(app).pool._soft["header:k"] = "a"
        r = await gw.post("/api/chat", json=CHAT, headers={"X-Session-Id": "k"})
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
        got = lines_of(r.text)
        assert "".join(ln["message"]["content"] for ln in got) == "Hello world"  # each piece once
        assert "".join(ln["message"].get("thinking", "") for ln in got) == "hm"
        assert [ln["done"] for ln in got] == [False] * 4 + [True]
        assert {ln["model"] for ln in got} == {"smol:latest"}
        end = got[-1]
        assert (end["eval_count"], end["prompt_eval_count"], end["done_reason"]) == (4, 5, "stop")
        # the durations are the whole answer's, as the gateway saw it (not node b's 7 ns)
        assert end["load_duration"] == 0 and end["total_duration"] > 7
        assert end["prompt_eval_duration"] + end["eval_duration"] == end["total_duration"]
        [first, second] = [body_of(q) for q in fleet.calls("/api/chat")]
        assert "continue_final_message" not in first and first["model"] == "up-model"
        assert second["messages"] == [CHAT["messages"][0], {"role": "assistant", "content": "Hello", "thinking": "hm"}]
        assert second["continue_final_message"] is True and second["partial_is_output"] is True
        [row] = await rows(gw)
        assert (row["endpoint"], row["model"], row["nodes"], row["node"], row["failovers"]) == (
            "ollama_chat", "smol", "a,b", "b", 1)
        assert (row["prompt_tokens"], row["generated_tokens"], row["status"], row["error"]) == (5, 4, 200, None)


async def test_a_generate_cut_is_continued_with_its_partial_response(tmp_path: Path) -> None:
    fleet = Fleet()
    body = {"model": "smol:latest", "prompt": "Count", "system": "terse", "options": {"num_predict": 9}}
    fleet.behave["a"] = lambda r: ndjson([piece("1, ", kind="generate")], broken=True)
    fleet.behave["b"] = lambda r: ndjson([piece("2, 3", kind="generate"), final("generate", 6)])
    async with gateway(tmp_path, fleet) as (app, gw):
        gateway_of(app).pool._soft["header:k"] = "a"
        r = await gw.post("/api/generate", json=body, headers={"X-Session-Id": "k"})
        got = lines_of(r.text)
        assert "".join(ln["response"] for ln in got) == "1, 2, 3" and sum(ln["done"] for ln in got) == 1
        assert got[-1]["eval_count"] == 6 and got[-1]["model"] == "smol:latest"
        second = body_of(fleet.calls("/api/generate")[1])
        assert (second["partial_response"], second["partial_thinking"], second["partial_is_output"]) == (
            "1, ", "", True)
        assert second["prompt"] == "Count" and second["options"] == {"num_predict": 9}
        [row] = await rows(gw)
        assert (row["endpoint"], row["failovers"], row["generated_tokens"]) == ("ollama_generate", 1, 6)


async def test_a_raw_generate_is_not_continued_and_ends_with_ollamas_error_line(tmp_path: Path) -> None:
    fleet = Fleet()
    fleet.behave["a"] = lambda r: ndjson([piece("1, ", kind="generate")], broken=True)
    fleet.behave["b"] = fleet.behave["a"]
    async with gateway(tmp_path, fleet) as (_, gw):
        r = await gw.post("/api/generate", json={"model": "smol", "prompt": "Count", "raw": True})
        got = lines_of(r.text)
        assert got[0]["response"] == "1, " and list(got[-1]) == ["error"] and len(got) == 2
        assert len(fleet.calls("/api/generate")) == 1  # nothing sent elsewhere
        [row] = await rows(gw)
        assert row["error"] and row["failovers"] == 0 and row["endpoint"] == "ollama_generate"


async def test_a_node_that_fails_before_the_first_line_is_retried_whole(tmp_path: Path) -> None:
    fleet = Fleet()
    fleet.behave["a"] = lambda r: ndjson([], broken=True)
    fleet.behave["b"] = lambda r: ndjson([piece("Hi"), final()])
    async with gateway(tmp_path, fleet) as (app, gw):
        gateway_of(app).pool._soft["header:k"] = "a"
        r = await gw.post("/api/chat", json=CHAT, headers={"X-Session-Id": "k"})
        assert [ln["message"]["content"] for ln in lines_of(r.text)] == ["Hi", ""]
        assert [body_of(q).get("continue_final_message") for q in fleet.calls("/api/chat")] == [None, None]
        [row] = await rows(gw)
        assert (row["retries"], row["failovers"], row["nodes"]) == (1, 0, "a,b")


async def test_embeddings_and_unstreamed_turns_have_one_row_each(tmp_path: Path) -> None:
    fleet = Fleet()

    def answer(r: httpx.Request) -> httpx.Response:
        path = r.url.path
        if path == "/api/embed":
            return httpx.Response(200, json={"model": "up-model", "embeddings": [[0.1]], "prompt_eval_count": 3})
        if path == "/api/embeddings":
            return httpx.Response(200, json={"embedding": [0.1]})
        if path == "/v1/embeddings":
            return httpx.Response(200, json={"object": "list", "model": "up-model", "data": [],
                                             "usage": {"prompt_tokens": 2, "total_tokens": 2}})
        return httpx.Response(200, json={**final(), "message": {"role": "assistant", "content": "Hi"}})

    fleet.behave = {"a": answer, "b": answer}
    async with gateway(tmp_path, fleet) as (_, gw):
        for path in ("/api/embed", "/api/embeddings", "/v1/embeddings"):
            r = await gw.post(path, json={"model": "smol", "input": "hello", "prompt": "hello"})
            assert r.status_code == 200 and r.json().get("model", "smol") == "smol", path
        r = await gw.post("/api/chat", json={**CHAT, "stream": False})
        assert r.json()["model"] == "smol:latest" and r.json()["message"]["content"] == "Hi"
        got = {row["endpoint"]: row for row in await rows(gw)}
        assert {k: (v["prompt_tokens"], v["generated_tokens"], v["status"]) for k, v in got.items()} == {
            "ollama_embed": (3, 0, 200), "ollama_embeddings": (0, 0, 200), "embeddings": (2, 0, 200),
            "ollama_chat": (5, 4, 200)}
        # a model the fleet does not serve: Ollama's 404, in its shape
        r = await gw.post("/api/chat", json={**CHAT, "model": "nope"})
        assert r.status_code == 404 and list(r.json()) == ["error"]


def test_a_failed_over_ollama_stream_has_the_gateways_spans_and_carries_the_trace(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    tracing = Tracing(SimpleSpanProcessor(exporter), service="hearth-gateway")
    fleet = Fleet()
    fleet.behave["a"] = lambda r: ndjson([piece("Hel")], broken=True) if r.url.path == "/api/chat" \
        else httpx.Response(200, json={"object": "list", "data": [], "usage": {"prompt_tokens": 1}})
    fleet.behave["b"] = lambda r: ndjson([piece("lo"), final(eval_count=2)])
    ups = [Upstream(name=n, url=f"http://127.0.0.1:{port}", models={"smol": "up-model"}, max_in_flight=4)
           for n, port in (("a", 9101), ("b", 9102))]
    gs = GatewaySettings(upstreams=ups, data_dir=tmp_path, probe_interval=60, heartbeat=0.05, digest_interval=0)
    with TestClient(create_gateway_app(gs, transport=httpx.MockTransport(fleet), tracing=tracing)) as c:
        r = c.post("/api/chat", json=CHAT, headers={**stick(c, "k", "a"), "traceparent": TRACEPARENT})
        assert "".join(ln["message"]["content"] for ln in lines_of(r.text)) == "Hello"
        r = c.post("/v1/embeddings", json={"model": "smol", "input": "x"}, headers=stick(c, "e", "a"))
        assert r.status_code == 200
    tracing.shutdown()
    spans = exporter.get_finished_spans()
    ids = by_id(spans)
    [root] = [s for s in spans if s.name == "chat smol"]
    assert root.context is not None and f"{root.context.trace_id:032x}" == TRACE_ID
    relays = [s for s in spans if s.name == "hearth.gateway.relay" and parent_of(s, ids) is root]
    assert [attrs(s)["hearth.node"] for s in relays] == ["a", "b"]
    [failover] = [s for s in spans if s.name == "hearth.gateway.failover"]
    assert attrs(failover)["hearth.failover.to"] == "b"
    a = attrs(root)
    assert (a["hearth.endpoint"], a["hearth.failovers"], a["gen_ai.usage.output_tokens"]) == ("ollama_chat", 1, 2)
    sent = [q.headers.get("traceparent", "") for q in fleet.calls("/api/chat")]
    assert [int(t.split("-")[2], 16) for t in sent] == [s.context.span_id for s in relays if s.context]
    [embed] = [s for s in spans if s.name == "embeddings smol"]
    assert attrs(embed)["gen_ai.operation.name"] == "embeddings"
    assert [s.name for s in spans if parent_of(s, ids) is embed] == ["hearth.gateway.route", "hearth.gateway.relay"]
    assert fleet.calls("/v1/embeddings")[0].headers.get("traceparent")
