"""Turns on openai-kind upstreams (foreign engines behind the gateway's translating protocol
layer) in the gateway's usage ledger and traces, in process over fake engines: one ledger row
per turn with the engine's counts, the finish reason, the node, failovers and a client that
left; the same span tree as a Hearth node's turn (the root continuing the client's
`traceparent`, route, a relay per attempt, failover), each relay's context sent to its engine;
and nothing counted or traced twice by the translating layer itself."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.applications import Starlette

from hearth.api.context import node_of
from hearth.gateway.app import create_gateway_app
from hearth.gateway.settings import GatewaySettings, Upstream
from hearth.gateway.state import gateway_of
from hearth.observability.tracing import Tracing
from hearth.tenants import ApiKey
from tests.api.test_gateway_usage import leave_after_first_event, rows
from tests.unit.gateway.failover.test_openai_continue import CUT, REST, Engines, Reply, delta, stream

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
CHAT = {"model": "q", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}
WHOLE = stream(delta({"role": "assistant", "content": ""}), delta({"content": "Hi"}), delta({"content": " there"}),
               delta({}, "length"), delta({}, usage={"prompt_tokens": 7, "completion_tokens": 2,
                                                     "prompt_tokens_details": {"cached_tokens": 4}}))  # type: ignore[dict-item]


class Seen(Engines):
    """Engines that also keep each chat call's headers."""

    def __init__(self, *script: Reply) -> None:
        super().__init__(*script)
        self.headers: list[httpx.Headers] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path != "/v1/models":
            self.headers.append(request.headers)
        return super().__call__(request)


@contextlib.asynccontextmanager
async def gateway(tmp_path: Path, engines: Engines, tracing: Tracing, **settings: Any,
                  ) -> AsyncIterator[tuple[Starlette, httpx.AsyncClient]]:
    ups = [Upstream(name=f"e{i}", url=f"http://127.0.0.1:{port}", kind="openai", models={"q": "up-model"},
                    continuation="vllm") for i, port in enumerate((9201, 9202, 9203))]
    gs = GatewaySettings(upstreams=ups, data_dir=tmp_path, probe_interval=60, digest_interval=0, heartbeat=5,
                         **settings)
    app = create_gateway_app(gs, transport=httpx.MockTransport(engines), tracing=tracing)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gw.test", timeout=30) as client:
        yield app, client


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracing(exporter: InMemorySpanExporter) -> Iterator[Tracing]:
    t = Tracing(SimpleSpanProcessor(exporter), service="hearth-gateway")
    yield t
    t.shutdown()


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def named(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def children_of(root: ReadableSpan, spans: tuple[ReadableSpan, ...]) -> list[ReadableSpan]:
    assert root.context is not None
    return [s for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id]


def sent_span(headers: httpx.Headers) -> tuple[str, int]:
    """(trace id, parent span id) of the traceparent an engine was sent."""
    _, trace, span, _ = headers["traceparent"].split("-")
    return trace, int(span, 16)


@pytest.mark.parametrize("stream_it", [False, True])
async def test_a_foreign_turn_is_one_ledger_row_and_one_span_tree(tmp_path: Path, exporter: InMemorySpanExporter,
                                                                  tracing: Tracing, stream_it: bool,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # an OTLP endpoint in the environment: the gateway's tracing is the test's, and the
    # translating layer must not start one of its own from it
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:9/v1/traces")
    engines = Seen(WHOLE)
    async with gateway(tmp_path, engines, tracing) as (app, gw):
        translator = gateway_of(app).translator
        assert translator is not None and node_of(translator).tracing is None and node_of(translator).ledger is None
        r = await gw.post("/v1/chat/completions", json={**CHAT, "stream": stream_it},
                          headers={"traceparent": TRACEPARENT})
        assert r.status_code == 200, r.text
        answer_id = r.json()["id"] if not stream_it else json.loads(r.text.split("data: ", 2)[1].split("\n")[0])["id"]
        [row] = await rows(gw)
        assert (row["prompt_tokens"], row["cached_tokens"], row["generated_tokens"]) == (7, 4, 2)
        node = row["node"]
        assert (row["model"], row["endpoint"], row["nodes"]) == ("q", "chat", node) and node in ("e0", "e1", "e2")
        assert (row["finish_reason"], row["cancelled"], row["error"], row["status"]) == ("length", None, None, 200)
        assert (row["failovers"], row["retries"], row["request_id"]) == (0, 0, answer_id)
        assert row["ttft_ms"] is not None and row["total_ms"] >= row["ttft_ms"]
    assert not (tmp_path / "translated" / "usage.db").exists()  # no second ledger of the same turns

    spans = exporter.get_finished_spans()
    assert {format(s.context.trace_id, "032x") for s in spans if s.context} == {TRACE_ID}
    [root] = named(spans, "chat q")
    assert root.parent is not None and format(root.parent.span_id, "016x") == PARENT_ID
    [route] = named(spans, "hearth.gateway.route")
    [relay] = named(spans, "hearth.gateway.relay")
    assert {s.name for s in children_of(root, spans)} == {"hearth.gateway.route", "hearth.gateway.relay"}
    assert len(spans) == 3  # nothing from the translating layer
    assert sorted(attrs(route)["hearth.route.candidates"]) == ["e0", "e1", "e2"]
    assert attrs(route)["hearth.route.node"] == node and attrs(relay)["hearth.node"] == node and relay.status.is_unset
    a = attrs(root)
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"],
            a["gen_ai.usage.cache_read.input_tokens"]) == (7, 2, 4)
    assert a["gen_ai.response.finish_reasons"] == ("length",) and a["hearth.nodes"] == (node,)
    assert a["http.response.status_code"] == 200 and "gen_ai.server.time_to_first_token" in a
    # the engine was sent the relay span's context
    assert relay.context is not None and sent_span(engines.headers[0]) == (TRACE_ID, relay.context.span_id)


async def test_a_failed_over_foreign_stream_has_both_parts_once_and_its_failover_span(
        tmp_path: Path, exporter: InMemorySpanExporter, tracing: Tracing) -> None:
    engines = Seen(CUT, REST)  # e0: "Hel", "lo", then broken; e1 goes on: " wor", "ld" (usage 12 + 3)
    async with gateway(tmp_path, engines, tracing) as (_, gw):
        r = await gw.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers={"traceparent": TRACEPARENT})
        assert r.status_code == 200 and "error" not in r.text
        [row] = await rows(gw)
    # the continuation counted the 2 chunks it was given as prompt: they are output, once
    first, then = row["nodes"].split(",")
    assert (row["node"], row["failovers"], row["retries"]) == (then, 1, 0) and first != then
    assert (row["prompt_tokens"], row["generated_tokens"], row["finish_reason"]) == (12 - 2, 2 + 3, "stop")
    spans = exporter.get_finished_spans()
    [root] = named(spans, "chat q")
    relays = named(spans, "hearth.gateway.relay")
    assert [attrs(s)["hearth.node"] for s in relays] == [first, then]
    assert not relays[0].status.is_ok and relays[1].status.is_unset
    [failover] = named(spans, "hearth.gateway.failover")
    assert (attrs(failover)["hearth.failover.from"], attrs(failover)["hearth.failover.to"]) == (first, then)
    routes = named(spans, "hearth.gateway.route")
    assert [attrs(s)["hearth.route.urgent"] for s in routes] == [False, True]  # the continuation's: no queueing
    assert all(s in children_of(root, spans) for s in [*relays, failover, *routes])
    assert attrs(root)["hearth.failovers"] == 1 and attrs(root)["gen_ai.usage.output_tokens"] == 5
    assert [sent_span(h) for h in engines.headers] == [(TRACE_ID, s.context.span_id) for s in relays if s.context]


async def test_a_foreign_stream_the_client_left_counts_what_it_was_sent(tmp_path: Path,
                                                                         exporter: InMemorySpanExporter,
                                                                         tracing: Tracing) -> None:
    engines = Seen(stream(delta({"role": "assistant", "content": ""}), delta({"content": "Hel"}),
                          delta({"content": "lo"}), end="stall"))
    async with gateway(tmp_path, engines, tracing) as (app, gw):
        got = await leave_after_first_event(app, "/v1/chat/completions", {**CHAT, "stream": True}, seen=b'"lo"')
        assert b"Hel" in got
        [row] = await rows(gw)
    # the engine reports no usage for a stream closed before its end: the chunks it streamed
    assert (row["cancelled"], row["finish_reason"], row["generated_tokens"], row["prompt_tokens"]) == (
        "disconnect", "cancelled", 2, 0)
    assert row["node"] == row["nodes"] and row["status"] == 200
    [root] = named(exporter.get_finished_spans(), "chat q")
    assert attrs(root)["hearth.cancelled"] == "disconnect" and attrs(root)["gen_ai.usage.output_tokens"] == 2


async def test_a_refused_foreign_turn_is_one_row_with_its_error(tmp_path: Path, exporter: InMemorySpanExporter,
                                                                tracing: Tracing) -> None:
    busy: Reply = lambda r: httpx.Response(503, json={"error": {"message": "loading"}})  # noqa: E731
    bad: Reply = lambda r: httpx.Response(400, json={"error": {"message": "context too long"}})  # noqa: E731
    engines = Seen(busy, busy, busy, bad)
    async with gateway(tmp_path, engines, tracing) as (_, gw):
        assert (await gw.post("/v1/chat/completions", json=CHAT)).status_code == 503
        assert (await gw.post("/v1/messages", json=CHAT)).status_code == 400  # an Anthropic client, translated
        newest, first = await rows(gw)
    assert (first["status"], first["retries"], first["generated_tokens"]) == (503, 3, 0)
    assert sorted(first["nodes"].split(",")) == ["e0", "e1", "e2"] and "every upstream failed" in first["error"]
    assert (newest["status"], newest["endpoint"], newest["retries"]) == (400, "messages", 0)
    assert "context too long" in newest["error"] and newest["finish_reason"] == "error"
    relays = named(exporter.get_finished_spans(), "hearth.gateway.relay")
    assert len(relays) == 4 and not any(s.status.is_unset for s in relays[:3])


async def test_a_foreign_turn_is_its_keys_and_tenants(tmp_path: Path, tracing: Tracing) -> None:
    alice, admin = {"Authorization": "Bearer ka"}, {"Authorization": "Bearer gw-adm"}
    async with gateway(tmp_path, Seen(WHOLE), tracing, named_keys=[ApiKey("ka", "alice", "team-a")],
                       admin_key="gw-adm") as (_, gw):
        assert (await gw.post("/v1/chat/completions", json=CHAT, headers=alice)).status_code == 200
        keys = {x["name"]: x for x in (await gw.get("/admin/keys/usage", headers=admin)).json()["data"]}
        assert (keys["alice"]["requests"], keys["alice"]["prompt_tokens"], keys["alice"]["completion_tokens"]) == (
            1, 7, 2)  # the translating layer's own accounts know no keys: the gateway's count it, once
        [row] = (await gw.get("/admin/usage", headers=alice)).json()["data"]
        assert (row["tenant"], row["key"], row["generated_tokens"]) == ("team-a", "alice", 2)
