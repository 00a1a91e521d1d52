"""One trace across the gateway and a node, in process: the gateway (over httpx.ASGITransport)
in front of a real node app on the scripted fake runner, each with its own tracer provider and
the SDK's in-memory exporter. The client's `traceparent` is continued by the gateway, the
gateway's relay span is the parent of the node's root span, and the routing decision is a span
with its candidates; a failed-over turn (fake nodes) has its failover span and one relay per node."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.applications import Starlette
from starlette.testclient import TestClient

from hearth.gateway.app import create_gateway_app
from hearth.gateway.settings import GatewaySettings, Upstream
from hearth.observability.tracing import Tracing
from tests.api.conftest import serve
from tests.helpers.fake_fleet import Fleet, sse, stick, stream_text
from tests.unit.gateway.failover.test_migration import chunk, data

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
CHAT = {"model": "smol", "max_tokens": 20, "temperature": 0, "messages": [{"role": "user", "content": "Hi there"}]}


@contextlib.asynccontextmanager
async def gateway_over(node: Starlette, tmp_path: Path, tracing: Tracing) -> AsyncIterator[httpx.AsyncClient]:
    gs = GatewaySettings(upstreams=[Upstream(name="a", url="http://node-a", models={"smol": "fake"})],
                         data_dir=tmp_path, probe_interval=60, digest_interval=0, heartbeat=5)
    app = create_gateway_app(gs, transport=httpx.ASGITransport(app=node), tracing=tracing)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gateway.test", timeout=30) as client:
        yield client


def by_id(spans: tuple[ReadableSpan, ...]) -> dict[int, ReadableSpan]:
    return {s.context.span_id: s for s in spans if s.context is not None}


def parent_of(span: ReadableSpan, among: dict[int, ReadableSpan]) -> ReadableSpan | None:
    return among.get(span.parent.span_id) if span.parent is not None else None


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


async def test_one_trace_holds_the_gateways_spans_and_the_nodes(tmp_path: Path) -> None:
    gw_spans, node_spans = InMemorySpanExporter(), InMemorySpanExporter()
    gw_tracing = Tracing(SimpleSpanProcessor(gw_spans), service="hearth-gateway")
    node_tracing = Tracing(SimpleSpanProcessor(node_spans))
    try:
        (tmp_path / "node").mkdir()
        async with serve(tmp_path / "node", tracing=node_tracing) as h, \
                gateway_over(h.app, tmp_path / "gw", gw_tracing) as gw:
            for stream in (False, True):
                gw_spans.clear()
                node_spans.clear()
                r = await gw.post("/v1/chat/completions", json={**CHAT, "stream": stream},
                                  headers={"traceparent": TRACEPARENT})
                assert r.status_code == 200, r.text
                spans = (*gw_spans.get_finished_spans(), *node_spans.get_finished_spans())
                assert {format(s.context.trace_id, "032x") for s in spans if s.context} == {TRACE_ID}
                ids = by_id(spans)
                [root] = [s for s in gw_spans.get_finished_spans() if s.name == "chat smol"]
                assert root.parent is not None and format(root.parent.span_id, "016x") == PARENT_ID
                [route] = [s for s in spans if s.name == "hearth.gateway.route"]
                [relay] = [s for s in spans if s.name == "hearth.gateway.relay"]
                assert parent_of(route, ids) is root and parent_of(relay, ids) is root
                assert attrs(route)["hearth.route.candidates"] == ("a",) and attrs(route)["hearth.route.node"] == "a"
                assert attrs(route)["hearth.route.branch"] and attrs(relay)["hearth.node"] == "a"
                # the node's request is the relay's child, and its own children hang below it
                [node_root] = [s for s in node_spans.get_finished_spans() if s.name == "chat fake"]
                assert parent_of(node_root, ids) is relay
                assert {s.name for s in node_spans.get_finished_spans() if parent_of(s, ids) is node_root} >= {
                    "hearth.queue", "hearth.prefill", "hearth.decode"}
                a = attrs(root)
                node_out = attrs(node_root)["gen_ai.usage.output_tokens"]
                assert node_out > 0 and a["gen_ai.usage.output_tokens"] == node_out
                assert a["gen_ai.usage.input_tokens"] == attrs(node_root)["gen_ai.usage.input_tokens"]
                assert a["hearth.nodes"] == ("a",) and a["hearth.failovers"] == 0
            # no client traceparent: the gateway starts the trace, the node continues it
            gw_spans.clear()
            node_spans.clear()
            assert (await gw.post("/v1/chat/completions", json=CHAT)).status_code == 200
            [root] = [s for s in gw_spans.get_finished_spans() if s.name == "chat smol"]
            [node_root] = [s for s in node_spans.get_finished_spans() if s.name == "chat fake"]
            assert root.parent is None and root.context is not None and node_root.context is not None
            assert node_root.context.trace_id == root.context.trace_id != int(TRACE_ID, 16)
    finally:
        gw_tracing.shutdown()
        node_tracing.shutdown()


def test_a_failed_over_stream_has_a_failover_span_and_a_relay_per_node(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    tracing = Tracing(SimpleSpanProcessor(exporter), service="hearth-gateway")
    fleet = Fleet()
    fleet.behave["a"] = lambda r: sse(chunks=[chunk("chatcmpl-1", {"role": "assistant", "content": ""}),
                                              chunk("chatcmpl-1", {"content": "Hel"})], broken=True)
    fleet.behave["b"] = lambda r: sse(chunks=[
        chunk("chatcmpl-2", {"content": "lo"}), chunk("chatcmpl-2", {}, "stop"),
        data({"id": "chatcmpl-2", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}),
        b"data: [DONE]\n\n"])
    ups = [Upstream(name=n, url=f"http://127.0.0.1:{port}", models={"smol": "up-model"}, max_in_flight=4)
           for n, port in (("a", 9101), ("b", 9102))]
    gs = GatewaySettings(upstreams=ups, data_dir=tmp_path, probe_interval=60, heartbeat=0.05, digest_interval=0)
    with TestClient(create_gateway_app(gs, transport=httpx.MockTransport(fleet), tracing=tracing)) as c:
        stream_text(c, "/v1/chat/completions", {**CHAT, "stream": True}, {**stick(c, "k", "a"),
                                                                         "traceparent": TRACEPARENT})
    tracing.shutdown()
    spans = exporter.get_finished_spans()
    ids = by_id(spans)
    [root] = [s for s in spans if s.name == "chat smol"]
    relays = [s for s in spans if s.name == "hearth.gateway.relay"]
    assert [attrs(s)["hearth.node"] for s in relays] == ["a", "b"]
    assert all(parent_of(s, ids) is root for s in relays)
    assert not relays[0].status.is_ok and relays[1].status.is_unset
    [failover] = [s for s in spans if s.name == "hearth.gateway.failover"]
    assert attrs(failover)["hearth.failover.from"] == "a" and attrs(failover)["hearth.failover.to"] == "b"
    a = attrs(root)
    assert a["hearth.nodes"] == ("a", "b") and a["hearth.failovers"] == 1 and a["gen_ai.usage.output_tokens"] == 3
    # what each node was sent: the relay span that stood for it, in the one trace
    sent = [r.headers.get("traceparent") for r in fleet.seen if r.url.path == "/v1/chat/completions"]
    assert [t.split("-")[1] for t in sent if t] == [TRACE_ID, TRACE_ID]
    assert [int(t.split("-")[2], 16) for t in sent if t] == [s.context.span_id for s in relays if s.context]
