"""What one turn leaves behind when it ends: its row in the gateway's usage ledger
(store/usage.py) and, when tracing is on, its spans (docs/observability.md, "Traces").

A `TurnWatch` follows a turn from arrival to its end: each routing decision (the candidates and
why one won), each attempt on a node (a retry before the first byte, a failover after it), the
first byte relayed, the usage the answer reported and how it ended (completed, an error, the
client gone). It costs nothing per relayed event: it is told of attempts and of the end only.

The spans are live (the gateway's own times, no engine loop to spare): the root
`{operation} {alias}` (SERVER; a client's W3C `traceparent` continued), `hearth.gateway.route`
for each node choice, `hearth.gateway.relay` (CLIENT) for each attempt, whose context goes to
the node on the forwarded request (`traceparent`), so the node's spans are its children in the
same trace, and `hearth.gateway.failover` from a mid-stream break to the continuation's start.
Without tracing no span object is made.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, StatusCode, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from hearth.gateway.fleet.pool import Lease
from hearth.gateway.store.usage import GatewayLedger, TurnUsage
from hearth.gateway.turn.scan import Scan
from hearth.observability.tracing import PROVIDER, Tracing
from hearth.tenants import Caller

_PROPAGATOR = TraceContextTextMapPropagator()
OPERATIONS = {"chat": "chat", "messages": "chat", "responses": "chat", "completions": "text_completion",
              "ollama_chat": "chat", "ollama_generate": "text_completion", "embeddings": "embeddings",
              "ollama_embed": "embeddings", "ollama_embeddings": "embeddings"}
# As a node names its endpoints in its own ledger rows (hearth/api/usage.py).
ENDPOINTS = {"/v1/chat/completions": "chat", "/chat/completions": "chat", "/v1/completions": "completions",
             "/completions": "completions", "/v1/messages": "messages", "/v1/responses": "responses",
             "/responses": "responses", "/api/chat": "ollama_chat", "/api/generate": "ollama_generate",
             "/v1/embeddings": "embeddings", "/api/embed": "ollama_embed", "/api/embeddings": "ollama_embeddings"}


def endpoint_of(path: str) -> str:
    return ENDPOINTS.get(path, path.rsplit("/", 1)[-1] or "other")


@dataclass(slots=True)
class TurnWatch:
    ledger: GatewayLedger | None
    tracing: Tracing | None
    gateway: str  # the store's instance id
    request_id: str  # the gateway's; the row takes the answer's id when it has one (as the node's row)
    key: Caller  # whose usage this is
    alias: str
    path: str
    arrived: float  # monotonic
    nodes: list[str] = field(default_factory=list)
    retries: int = 0
    failovers: int = 0
    first_byte: float | None = None
    ended: bool = False
    broken: list[str] = field(default_factory=list)  # the node of each part that broke mid-stream, in order
    # each part's (node, answer id) -> their nodes' rows joined (turn/settle.py): a cancelled stream's counts
    counts: Callable[[list[tuple[str, str]]], Awaitable[dict[str, Any] | None]] | None = None
    _root: Span | None = None
    _inside: Context | None = None
    _relay: Span | None = None
    _relay_node: str | None = None
    _headers: dict[str, str] = field(default_factory=dict)
    _failover: Span | None = None

    @classmethod
    def begin(cls, ledger: GatewayLedger | None, tracing: Tracing | None, gateway: str, request_id: str,
              key: Caller, alias: str, path: str, arrived: float, client: Mapping[str, str]) -> TurnWatch | None:
        """A turn's watch; None when neither the ledger nor tracing is on."""
        if ledger is None and tracing is None:
            return None
        w = cls(ledger, tracing, gateway, request_id, key, alias, path, arrived)
        if tracing is not None:
            carrier = {k: v for k, v in client.items() if k in ("traceparent", "tracestate")}
            parent = _PROPAGATOR.extract(carrier) if "traceparent" in carrier else None
            w._root = tracing.tracer.start_span(f"{OPERATIONS.get(endpoint_of(path), 'chat')} {alias}",
                                                context=parent, kind=SpanKind.SERVER, start_time=_ns(arrived))
            w._root.set_attributes({
                "gen_ai.operation.name": OPERATIONS.get(endpoint_of(path), "chat"), "gen_ai.provider.name": PROVIDER,
                "gen_ai.request.model": alias, "hearth.endpoint": endpoint_of(path), "hearth.tenant": key.tenant,
                "hearth.gateway": gateway, **({"gen_ai.request.id": request_id} if request_id != "-" else {}),
                **({"hearth.key": key.key_name} if key.key_name else {})})
            w._inside = set_span_in_context(w._root)
        return w

    # ---- as the turn goes -------------------------------------------------------------------

    def routed(self, lease: Lease, since: float, urgent: bool = False) -> None:
        """`lease` was chosen (among `lease.candidates`; acquire began at `since`)."""
        if self.tracing is None:
            return
        d = lease.decision
        span = self.tracing.tracer.start_span("hearth.gateway.route", context=self._inside, start_time=_ns(since))
        span.set_attributes({"hearth.route.candidates": list(lease.candidates), "hearth.route.node": d.node,
                             "hearth.route.branch": d.branch, "hearth.route.source": d.source,
                             "hearth.route.predicted_cached": d.predicted_cached,
                             "hearth.route.prompt_tokens": d.prompt_tokens, "hearth.route.urgent": urgent})
        span.end()

    def sending(self, node: str) -> dict[str, str]:
        """The headers that carry this turn's trace to `node` (an attempt begins; the same one
        again for a second send to the same node within it)."""
        if self.tracing is None:
            if not self.nodes or self.nodes[-1] != node:
                self.nodes.append(node)
            return {}
        if self._relay is not None and self._relay_node == node:
            return self._headers
        if not self.nodes or self.nodes[-1] != node or self._relay is None:
            self.nodes.append(node)
        self._end_relay(None)  # another stream's attempt of the same turn (several prompts, foreign/turn.py)
        self._relay = self.tracing.tracer.start_span("hearth.gateway.relay", context=self._inside,
                                                     kind=SpanKind.CLIENT)
        self._relay.set_attributes({"hearth.node": node, "hearth.attempt": len(self.nodes)})
        self._relay_node = node
        self._headers = {}
        _PROPAGATOR.inject(self._headers, context=set_span_in_context(self._relay))
        if self._failover is not None:
            self._failover.set_attribute("hearth.failover.to", node)
            self._failover.end()
            self._failover = None
        return self._headers

    def retried(self, node: str, reason: str) -> None:
        """The attempt on `node` failed before the client's first byte; another node is tried."""
        self.retries += 1
        self._end_relay(f"retry: {reason}")

    def relayed(self) -> None:
        if self.first_byte is None:
            self.first_byte = time.monotonic()

    def broke(self, node: str, reason: str) -> None:
        """The stream from `node` broke after the client's first byte: a failover begins."""
        self._end_relay(f"broken: {reason}")
        self.broken.append(node)
        if self.tracing is not None:
            self._failover = self.tracing.tracer.start_span("hearth.gateway.failover", context=self._inside)
            self._failover.set_attributes({"hearth.failover.from": node, "hearth.failover.reason": reason})

    def moved(self) -> None:
        self.failovers += 1

    def _end_relay(self, error: str | None) -> None:
        if self._relay is not None:
            if error is not None:
                self._relay.set_status(StatusCode.ERROR, error)
            self._relay.end()
            self._relay, self._relay_node = None, None

    # ---- the end ----------------------------------------------------------------------------

    def finish(self, scan: Scan | None, status: int, cancelled: str | None = None, error: str | None = None,
               finish_reason: str | None = None) -> None:
        """The turn ended (once; later calls do nothing): its ledger row queued, its spans ended.
        `finish_reason`: the answer's, where the gateway knows it (a foreign engine's turn)."""
        if self.ended:
            return
        self.ended = True
        end = time.monotonic()
        prompt = (scan.whole_prompt or 0) if scan is not None else 0
        cached = (scan.cached or 0) if scan is not None else 0
        generated = (scan.completion or 0) if scan is not None else 0
        k = self.key
        row = TurnUsage(
            at=time.time(), request_id=scan.answer_id if scan is not None and scan.answer_id else self.request_id,
            gateway=self.gateway, tenant=k.tenant, key=k.key_name,
            via=k.key_name if k.via_gateway else None, model=self.alias, endpoint=endpoint_of(self.path),
            node=self.nodes[-1] if self.nodes else None,
            nodes=",".join(self.nodes), failovers=self.failovers, retries=self.retries, prompt_tokens=prompt,
            cached_tokens=cached, generated_tokens=generated,
            finish_reason="cancelled" if cancelled else ("error" if error else finish_reason), cancelled=cancelled,
            error=error, status=status,
            ttft_ms=None if self.first_byte is None else round((self.first_byte - self.arrived) * 1000, 3),
            total_ms=round((end - self.arrived) * 1000, 3))
        if self.ledger is not None:
            parts = answer_parts(scan, self.broken, self.nodes) if cancelled and scan is not None \
                and scan.completion is None else []
            if parts and self.counts is not None:
                # the usage never came: each part's node has its exact counts (turn/settle.py)
                self.ledger.settle(row, self.counts(parts))
            else:
                self.ledger.record(row)
        if self._root is not None:
            self._end_relay(error if error is not None and self._relay is not None else None)
            if self._failover is not None:
                self._failover.set_status(StatusCode.ERROR, "no node took the stream over")
                self._failover.end()
                self._failover = None
            self._root.set_attributes({
                "gen_ai.usage.input_tokens": prompt, "gen_ai.usage.output_tokens": generated,
                "gen_ai.usage.cache_read.input_tokens": cached, "hearth.nodes": self.nodes,
                "hearth.failovers": self.failovers, "hearth.retries": self.retries,
                "http.response.status_code": status, **({"hearth.cancelled": cancelled} if cancelled else {}),
                **({"gen_ai.response.finish_reasons": [finish_reason]} if finish_reason else {})})
            if self.first_byte is not None:
                self._root.set_attribute("gen_ai.server.time_to_first_token", round(self.first_byte - self.arrived, 6))
            if error is not None:
                self._root.set_status(StatusCode.ERROR, error)
            self._root.end()


def answer_parts(scan: Scan, broken: list[str], nodes: list[str]) -> list[tuple[str, str]]:
    """(node, answer id) of each part of a relayed answer whose id is known, in order: the first
    on the node that broke first (or the only node), then each continuation (`Scan.parts`)."""
    if scan.answer_id is None or not nodes:
        return []
    first = broken[0] if scan.parts and broken else nodes[-1]
    return [(first, scan.answer_id), *((str(n), str(a)) for n, a in scan.parts if n is not None and a is not None)]


def _ns(mono: float) -> int:
    """A monotonic time as epoch nanoseconds."""
    return time.time_ns() - int((time.monotonic() - mono) * 1e9)
