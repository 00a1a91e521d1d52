"""OpenTelemetry traces of a node's requests (docs/observability.md, "Traces"), following the
GenAI semantic conventions.

A request's spans are built after the fact, when its run has ended, from the times the HTTP
side already observed (arrival, admission, first and last token, the end) and the backend's
`Timings`: the engine's step loop is never touched, and when tracing is off (no
`--otlp-endpoint`, no `OTEL_EXPORTER_OTLP_*` endpoint) no `Tracing` exists and no span object is
ever made. Export runs on the SDK's batch processor thread, off the request path.

The tree, one per request: `{operation} {model}` (SERVER; the client's W3C `traceparent`
continued when it sent one) with the children `hearth.queue` (arrival to a slot),
`hearth.prompt_cache` (the lookup: tier, tokens reused), `hearth.prefill`, `hearth.decode`
(tokens, steps), `hearth.tool_calls` (from the first parsed tool call to the last) and
`hearth.sse_write` (a stream's response, its first byte to its last). Prompts and answers go
into the root span (as `gen_ai.input.messages` / `gen_ai.output.messages`) only with
`--trace-content`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, SpanKind, StatusCode, Tracer, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from hearth.observability.ledger import UsageRecord

PROVIDER = "hearth"
ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_PROPAGATOR = TraceContextTextMapPropagator()


@dataclass(slots=True)
class RunTrace:
    """What a finished request's spans are built from. Times: `time.monotonic()` seconds."""

    operation: str  # chat, text_completion, embeddings (gen_ai.operation.name)
    record: UsageRecord  # its usage-ledger row: who, model, tokens, finish, cancel
    arrived: float
    end: float
    admitted: float | None = None
    first: float | None = None  # first generated token
    last: float | None = None  # last generated token
    prompt_ms: float | None = None  # the backend's prefill time (`Timings`)
    prefill_chunks: int = 0  # prompt chunks the prefill took (`Timings`; 0: none, or not known)
    steps: int = 0  # deltas that carried tokens: the decode steps that produced one for it
    tool_calls: int = 0
    tool_first: float | None = None
    tool_last: float | None = None
    streamed: float | None = None  # a stream's response began
    sse_events: int = 0
    finish_reasons: list[str] = field(default_factory=list)
    traceparent: str | None = None
    tracestate: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    input_text: str | None = None  # with --trace-content only
    output_text: str | None = None


def configured_endpoint(flag: str | None) -> str | None:
    """The OTLP/HTTP traces endpoint: the flag, else the standard variables; None: tracing off."""
    if flag:
        return flag
    for var in ENDPOINT_VARS:
        value = os.environ.get(var)
        if value:
            return value
    return None


def otlp_processor(endpoint: str | None) -> SpanProcessor:
    """A batch processor exporting over OTLP/HTTP (protobuf) to `endpoint` (a collector's base
    URL, as OTEL_EXPORTER_OTLP_ENDPOINT is). With None the exporter reads every
    `OTEL_EXPORTER_OTLP_*` variable itself (the endpoints, headers, timeout, compression).
    The exporter is imported here: a node that traces nothing never loads it."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    if endpoint is not None and not endpoint.rstrip("/").endswith("/v1/traces"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"  # a base URL, as OTEL_EXPORTER_OTLP_ENDPOINT is
    return BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint))


class Tracing:
    def __init__(self, processor: SpanProcessor, content: bool = False, service: str = "hearth") -> None:
        self.provider = TracerProvider(resource=Resource.create({"service.name": service}))
        self.provider.add_span_processor(processor)
        self.tracer: Tracer = self.provider.get_tracer("hearth")
        self.content = content

    def shutdown(self) -> None:
        self.provider.shutdown()  # flushes what the batch processor holds

    def export(self, t: RunTrace) -> None:
        """The request's spans, ended at once with their recorded times (epoch nanoseconds)."""
        offset = time.time_ns() - int(time.monotonic() * 1e9)

        def ns(mono: float) -> int:
            return offset + int(mono * 1e9)

        r = t.record
        parent: Context | None = None
        if t.traceparent is not None:
            carrier = {"traceparent": t.traceparent, **({"tracestate": t.tracestate} if t.tracestate else {})}
            parent = _PROPAGATOR.extract(carrier)
        root = self.tracer.start_span(f"{t.operation} {r.model}".strip(), context=parent, kind=SpanKind.SERVER,
                                      start_time=ns(t.arrived))
        attrs: dict[str, str | int | float | bool | list[str]] = {
            "gen_ai.operation.name": t.operation, "gen_ai.provider.name": PROVIDER, "gen_ai.system": PROVIDER,
            "gen_ai.request.model": r.model, "gen_ai.response.model": r.model,
            "gen_ai.usage.input_tokens": r.prompt_tokens, "gen_ai.usage.output_tokens": r.generated_tokens,
            "gen_ai.usage.cache_read.input_tokens": r.cached_tokens,
            "hearth.endpoint": r.endpoint, "hearth.tenant": r.tenant, "hearth.discarded_tokens": r.discarded_tokens}
        if r.request_id:
            attrs["gen_ai.response.id"] = r.request_id
        if t.finish_reasons:
            attrs["gen_ai.response.finish_reasons"] = t.finish_reasons
        if t.first is not None:
            attrs["gen_ai.server.time_to_first_token"] = round(t.first - t.arrived, 6)
        if r.key is not None:
            attrs["hearth.key"] = r.key
        if r.cancelled is not None:
            attrs["hearth.cancelled"] = r.cancelled
        if t.temperature is not None:
            attrs["gen_ai.request.temperature"] = t.temperature
        if t.max_tokens is not None:
            attrs["gen_ai.request.max_tokens"] = t.max_tokens
        if self.content and t.input_text is not None:
            attrs["gen_ai.input.messages"] = t.input_text
        if self.content and t.output_text is not None:
            attrs["gen_ai.output.messages"] = t.output_text
        root.set_attributes(attrs)
        if r.error is not None:
            root.set_status(StatusCode.ERROR, r.error)
        inside = set_span_in_context(root)

        def child(name: str, start: float, end: float, a: dict[str, str | int | float] | None = None) -> None:
            span: Span = self.tracer.start_span(name, context=inside, start_time=ns(start))
            span.set_attributes(a or {})
            span.end(end_time=ns(max(start, end)))

        if t.admitted is not None:
            child("hearth.queue", t.arrived, t.admitted)
            child("hearth.prompt_cache", t.admitted, t.admitted,
                  {"hearth.cache.tier": r.cache_tier or "none", "hearth.cache.tokens": r.cached_tokens})
            if t.first is not None:
                begin = t.admitted if t.prompt_ms is None else max(t.admitted, t.first - t.prompt_ms / 1000)
                child("hearth.prefill", begin, t.first,
                      {"hearth.prefill.tokens": r.prompt_tokens - r.cached_tokens,
                       "hearth.prefill.chunks": t.prefill_chunks})
                child("hearth.decode", t.first, t.last if t.last is not None else t.first,
                      {"hearth.decode.tokens": r.generated_tokens, "hearth.decode.steps": t.steps})
        if t.tool_first is not None:
            child("hearth.tool_calls", t.tool_first, t.tool_last or t.tool_first,
                  {"hearth.tool_calls.count": t.tool_calls})
        if t.streamed is not None:
            child("hearth.sse_write", t.streamed, t.end, {"hearth.sse.events": t.sse_events})
        root.end(end_time=ns(t.end))
