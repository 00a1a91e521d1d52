"""OpenTelemetry spans in-process (hearth.observability.tracing), caught by the SDK's in-memory
exporter: the tree and its names, the GenAI attributes with the answer's own counts, a client's
`traceparent` continued, content only with --trace-content, nothing at all when tracing is off."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from hearth.api.context import node_of
from hearth.observability.tracing import Tracing
from tests.api.conftest import ANSWER, Harness, serve

CHAT = {"model": "fake", "max_tokens": 50, "temperature": 0, "messages": [{"role": "user", "content": "Hi there"}]}
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    yield InMemorySpanExporter()


async def traced(tmp_path: Path, exporter: InMemorySpanExporter, content: bool = False) -> AsyncIterator[Harness]:
    tracing = Tracing(SimpleSpanProcessor(exporter), content=content)
    async with serve(tmp_path, tracing=tracing) as h:
        yield h
    tracing.shutdown()


def tree(spans: tuple[ReadableSpan, ...]) -> tuple[ReadableSpan, dict[str, ReadableSpan]]:
    [root] = [s for s in spans if s.name.startswith(("chat ", "text_completion "))]
    assert root.context is not None
    children = {s.name: s for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id}
    assert len(children) == len(spans) - 1, [s.name for s in spans]  # every other span is the root's child
    return root, children


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


async def test_a_chat_request_is_one_tree_continuing_the_clients_trace(tmp_path: Path,
                                                                      exporter: InMemorySpanExporter) -> None:
    async for h in traced(tmp_path, exporter):
        body = (await h.post("/v1/chat/completions", CHAT, headers={"traceparent": TRACEPARENT})).json()
        root, children = tree(exporter.get_finished_spans())
        assert root.name == "chat fake" and root.context is not None and root.parent is not None
        assert format(root.context.trace_id, "032x") == TRACE_ID and format(root.parent.span_id, "016x") == PARENT_ID
        a = attrs(root)
        assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "fake"
        assert a["gen_ai.usage.input_tokens"] == body["usage"]["prompt_tokens"]
        assert a["gen_ai.usage.output_tokens"] == body["usage"]["completion_tokens"]
        assert a["gen_ai.usage.cache_read.input_tokens"] == 0
        assert a["gen_ai.response.finish_reasons"] == ("stop",) and a["gen_ai.response.id"] == body["id"]
        assert a["gen_ai.request.temperature"] == 0 and a["gen_ai.request.max_tokens"] == 50
        assert a["gen_ai.server.time_to_first_token"] >= 0
        assert not any(k.startswith(("gen_ai.input", "gen_ai.output")) for k in a)  # no content by default
        assert sorted(children) == ["hearth.decode", "hearth.prefill", "hearth.prompt_cache", "hearth.queue"]
        assert attrs(children["hearth.decode"])["hearth.decode.tokens"] == body["usage"]["completion_tokens"]
        assert attrs(children["hearth.decode"])["hearth.decode.steps"] >= 1
        assert attrs(children["hearth.prompt_cache"]) == {"hearth.cache.tier": "none", "hearth.cache.tokens": 0}
        assert attrs(children["hearth.prefill"])["hearth.prefill.tokens"] == body["usage"]["prompt_tokens"]
        # each child lies within the root, in the order the request went through them
        assert root.start_time is not None and root.end_time is not None
        order = [children[n] for n in ("hearth.queue", "hearth.prefill", "hearth.decode")]
        assert all(root.start_time <= s.start_time <= s.end_time <= root.end_time for s in order)  # type: ignore[operator]
        assert order[0].end_time <= order[1].start_time and order[1].end_time <= order[2].start_time  # type: ignore[operator]

        exporter.clear()
        await h.post("/v1/chat/completions", CHAT)  # no traceparent: a trace of its own
        root2, _ = tree(exporter.get_finished_spans())
        assert root2.parent is None and root2.context is not None and root2.context.trace_id != root.context.trace_id


async def test_a_stream_has_its_sse_write_span(tmp_path: Path, exporter: InMemorySpanExporter) -> None:
    async for h in traced(tmp_path, exporter):
        events = await h.sse("/v1/chat/completions", CHAT)
        _, children = tree(exporter.get_finished_spans())
        assert "hearth.sse_write" in children
        assert attrs(children["hearth.sse_write"])["hearth.sse.events"] >= len(events) - 2  # [DONE], role chunk
        completion = (await h.post("/v1/completions", {"model": "fake", "prompt": "x", "max_tokens": 3})).json()
        spans = [s for s in exporter.get_finished_spans() if s.name == "text_completion fake"]
        assert [attrs(s)["gen_ai.usage.output_tokens"] for s in spans] == [completion["usage"]["completion_tokens"]]
        assert attrs(spans[0])["gen_ai.response.finish_reasons"] == ("length",)


async def test_content_only_when_asked(tmp_path: Path, exporter: InMemorySpanExporter) -> None:
    async for h in traced(tmp_path, exporter, content=True):
        await h.post("/v1/chat/completions", CHAT)
        root, _ = tree(exporter.get_finished_spans())
        assert "Hi there" in attrs(root)["gen_ai.input.messages"]
        assert attrs(root)["gen_ai.output.messages"] == ANSWER


async def test_off_makes_no_spans(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    made: list[object] = []
    monkeypatch.setattr(Tracing, "export", lambda self, t: made.append(t))
    async with serve(tmp_path) as h:
        assert node_of(h.app).tracing is None
        assert (await h.post("/v1/chat/completions", CHAT, headers={"traceparent": TRACEPARENT})).status_code == 200
    assert made == []


async def test_the_prefill_span_counts_its_chunks(tmp_path: Path, exporter: InMemorySpanExporter) -> None:
    # The scripted runner's batch is 64 tokens, the engine's per-step budget: a prompt of P
    # tokens prefilled alone takes ceil(P / 64) steps, one chunk each.
    async for h in traced(tmp_path, exporter):
        for words in (1, 120):
            exporter.clear()
            body = {**CHAT, "messages": [{"role": "user", "content": " ".join(["tokens"] * words)}]}
            usage = (await h.post("/v1/chat/completions", body)).json()["usage"]
            _, children = tree(exporter.get_finished_spans())
            prefill = attrs(children["hearth.prefill"])
            prefilled = usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"]
            assert prefill["hearth.prefill.tokens"] == prefilled > 0
            assert prefill["hearth.prefill.chunks"] == -(-prefilled // 64)
            assert (prefill["hearth.prefill.chunks"] > 1) == (words > 1)
