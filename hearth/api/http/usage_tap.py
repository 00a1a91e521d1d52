"""A request's row in the usage ledger (hearth.observability.ledger) and its trace
(hearth.observability.tracing), from its event stream.

`UsageTap` observes a run's events (counting only: no I/O on the per-token path) and, when the
run's stream closes, hands one `UsageRecord` to the ledger's queue and, when tracing is on, the
spans to the exporter's. The counts come from the run's `Done` when it passed; a stream closed
before it (a client that disconnected, a cancel whose totals were never read) counts what the
backend's run had generated when it stopped (`CancelToken.generated`): tokens sampled after
the last delivery are in `generated` and `discarded`, never lost, never counted twice: the
record waits for the engine's last output of the run (the abort's), so a token sampled in the
step during which the stop arrived is counted too. Nothing
here exists when both the ledger and tracing are off (`runs.tap` returns None).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping

from hearth.chat.cancel import CancelToken
from hearth.chat.types import ChatEvent, ChatRequest, Done, Finish, ReasoningDelta, Started, TextDelta, ToolCallDelta
from hearth.observability.journal import Entry, Journal
from hearth.observability.ledger import Ledger, UsageRecord
from hearth.observability.metrics import RequestTimer
from hearth.observability.tracing import RunTrace, Tracing
from hearth.tenants import Caller

log = logging.getLogger("hearth.api")

# Seconds a closed stream's record waits for its run's last engine output at most: an abort is
# applied at the next step, but on an oversubscribed machine one step can take seconds.
COUNT_WAIT = 30.0
OPERATIONS = {"completions": "text_completion", "ollama_generate": "text_completion", "embeddings": "embeddings",
              "ollama_embed": "embeddings", "ollama_embeddings": "embeddings"}  # any other: chat


def operation(endpoint: str) -> str:
    """gen_ai.operation.name for an endpoint label."""
    return OPERATIONS.get(endpoint, "chat")


class UsageTap:
    __slots__ = ("cached", "calls", "delivered", "done", "endpoint", "events", "finish", "journal", "ledger", "model",
                 "output", "prompt", "request_id", "steps", "streamed", "tool_calls", "tool_first", "tool_last",
                 "trace_in", "tracing", "who")

    def __init__(self, ledger: Ledger | None, tracing: Tracing | None, who: Caller, endpoint: str,
                 model: str | None, request_id: str, trace_in: RunTrace | None = None,
                 journal: tuple[Journal, str, bytes] | None = None) -> None:
        self.ledger, self.tracing, self.who, self.endpoint = ledger, tracing, who, endpoint
        self.model, self.request_id = model or "", request_id
        self.trace_in = trace_in  # what the request said that its trace shows (tracing on only)
        self.prompt = self.cached = self.delivered = self.steps = self.tool_calls = self.events = 0
        self.finish: list[str] = []
        self.done: Done | None = None
        self.streamed: float | None = None
        self.tool_first: float | None = None
        self.tool_last: float | None = None
        self.journal = journal  # the journal, the request's path and body (--journal only)
        self.output: list[str] | None = [] if journal is not None or (tracing is not None and tracing.content) \
            else None
        self.calls: list[dict[str, str]] | None = [] if journal is not None else None

    def __call__(self, ev: ChatEvent) -> None:
        self.events += 1
        if isinstance(ev, (TextDelta, ReasoningDelta)):
            if ev.n_tokens:
                self.delivered += ev.n_tokens
                self.steps += 1
            if self.output is not None and isinstance(ev, TextDelta) and ev.index == 0:
                self.output.append(ev.text)
        elif isinstance(ev, ToolCallDelta):
            # its tokens are counted by the run (the parser holds them back)
            if self.calls is not None and ev.index == 0:
                if ev.name:
                    self.calls.append({"name": ev.name, "arguments": ""})
                if self.calls:
                    self.calls[-1]["arguments"] += ev.arguments
            if self.tracing is not None:
                now = time.monotonic()
                if ev.name:
                    self.tool_calls += 1
                self.tool_first, self.tool_last = self.tool_first or now, now
        elif isinstance(ev, Started):
            if ev.prompt_tokens:  # a stream opened before its model loaded starts with a 0
                self.prompt, self.cached = ev.prompt_tokens, ev.cached_tokens
        elif isinstance(ev, Finish):
            self.finish.append(ev.reason)
        elif isinstance(ev, Done):
            self.done = ev

    def close(self, token: CancelToken, timer: RequestTimer) -> None:
        """The run's stream closed: its record goes to the ledger's queue, its spans to the
        exporter. A stream closed before its totals, whose run is still in the engine (the
        step in which its abort arrived may have sampled one more token for it, handed over
        after the stream closed), is recorded once the engine's last output for it was counted
        (`CancelToken.when_counted`; at most COUNT_WAIT seconds later, logged)."""
        end = time.monotonic()
        if self.done is None and token.counting:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            if loop is not None:
                recorded = False

                def record() -> None:
                    nonlocal recorded
                    if not recorded:
                        recorded = True
                        late.cancel()
                        self._close(token, timer, end)

                def too_late() -> None:
                    if not recorded:
                        log.warning("usage ledger: %s recorded before its run's last engine output came (%d tokens "
                                    "counted)", self.request_id, token.generated)
                    record()

                late = loop.call_later(COUNT_WAIT, too_late)
                token.when_counted(record)
                return
        self._close(token, timer, end)

    def _close(self, token: CancelToken, timer: RequestTimer, end: float) -> None:
        done = self.done
        prompt_ms = None
        chunks = 0
        if done is not None:
            u = done.usage
            prompt, cached, generated, error = u.prompt_tokens, u.cached_tokens, u.completion_tokens, done.error
            tier = done.timings.cache_tier if done.timings is not None else None
            prompt_ms = done.timings.prompt_ms if done.timings is not None else None
            chunks = done.timings.prefill_chunks if done.timings is not None else 0
        else:
            prompt, cached, generated, error, tier = self.prompt, self.cached, token.generated, None, None
        generated = max(generated, self.delivered)
        # a stream closed before its totals: what was generated and not delivered was discarded
        # (after its totals, `delivered` misses the tool calls' tokens: nothing is counted so)
        discarded = generated - self.delivered if done is None else 0
        arrived = timer.arrived
        first = self.finish[0] if self.finish else None
        rec = UsageRecord(
            at=time.time(), request_id=self.request_id, tenant=self.who.tenant, key=self.who.key_name,
            via=self.who.key_name if self.who.via_gateway else None, model=self.model, endpoint=self.endpoint,
            prompt_tokens=prompt, cached_tokens=cached, cache_tier=tier, generated_tokens=generated,
            discarded_tokens=discarded, finish_reason=first or ("cancelled" if token.reason else None),
            cancelled=token.reason, error=error,
            queue_ms=_ms(timer.admitted, arrived), ttft_ms=_ms(timer.first, arrived), total_ms=(end - arrived) * 1000)
        if self.ledger is not None:
            self.ledger.record(rec)
        if self.journal is not None and self.output is not None:
            journal, path, body = self.journal
            journal.record(Entry(self.request_id, self.who.tenant, self.endpoint, path, self.model, body, {
                "text": "".join(self.output), "tool_calls": self.calls or [], "finish_reason": first,
                "prompt_tokens": prompt, "generated_tokens": generated}))
        if self.tracing is not None:
            t = self.trace_in or RunTrace(operation(self.endpoint), rec, arrived, end)
            t.operation, t.record, t.arrived, t.end = operation(self.endpoint), rec, arrived, end
            t.admitted, t.first, t.last, t.prompt_ms = timer.admitted, timer.first, timer.last, prompt_ms
            t.prefill_chunks = chunks
            t.steps, t.tool_calls = self.steps, self.tool_calls
            t.tool_first, t.tool_last = self.tool_first, self.tool_last
            t.streamed, t.sse_events, t.finish_reasons = self.streamed, self.events, self.finish
            if self.output is not None:
                t.output_text = "".join(self.output)
            self.tracing.export(t)


def trace_input(tracing: Tracing | None, headers: Mapping[str, str] | None, creq: ChatRequest | None
                ) -> RunTrace | None:
    """What a request brings to its trace: the client's `traceparent`, its sampling settings and
    (with --trace-content) its messages. None when tracing is off: nothing is built."""
    if tracing is None:
        return None
    t = RunTrace("", UsageRecord(0.0, "", "", None, None, "", ""), 0.0, 0.0)
    if headers is not None:
        t.traceparent, t.tracestate = headers.get("traceparent"), headers.get("tracestate")
    if creq is not None:
        t.temperature, t.max_tokens = creq.sampling.temperature, creq.sampling.max_tokens
        if tracing.content:
            t.input_text = json.dumps([{"role": m.role, "content": m.content} for m in creq.messages])
    return t


def record_embedding(ledger: Ledger | None, tracing: Tracing | None, who: Caller, endpoint: str, model: str,
                     request_id: str, input_tokens: int, arrived: float, traceparent: str | None) -> None:
    """An embedding request's row: its input tokens are its prompt; nothing is generated."""
    end = time.monotonic()
    rec = UsageRecord(
        at=time.time(), request_id=request_id, tenant=who.tenant, key=who.key_name,
        via=who.key_name if who.via_gateway else None, model=model, endpoint=endpoint, prompt_tokens=input_tokens,
        finish_reason="stop", total_ms=round((end - arrived) * 1000, 3))
    if ledger is not None:
        ledger.record(rec)
    if tracing is not None:
        tracing.export(RunTrace("embeddings", rec, arrived, end, traceparent=traceparent))


def _ms(t: float | None, since: float) -> float | None:
    return None if t is None else round((t - since) * 1000, 3)
