"""A generation's row in the usage ledger (hearth.observability.ledger), from its event stream.

`UsageTap` observes a run's events (counting only: no I/O on the per-token path) and, when the
run's stream closes, hands one `UsageRecord` to the ledger's queue. The counts come from the
run's `Done` when it passed; a stream closed before it (a client that disconnected, a cancel
whose totals were never read) counts what the backend's run had generated when it stopped
(`CancelToken.generated`): tokens sampled after the last delivery are in `generated` and
`discarded`, never lost, never counted twice.
"""

from __future__ import annotations

import time

from hearth.chat.cancel import CancelToken
from hearth.chat.types import ChatEvent, Done, Finish, ReasoningDelta, Started, TextDelta, ToolCallDelta
from hearth.observability.ledger import Ledger, UsageRecord
from hearth.observability.metrics import RequestTimer
from hearth.tenants import Caller


class UsageTap:
    __slots__ = (
        "cached",
        "delivered",
        "done",
        "endpoint",
        "finish",
        "ledger",
        "model",
        "prompt",
        "request_id",
        "who",
    )

    def __init__(self, ledger: Ledger, who: Caller, endpoint: str, model: str | None, request_id: str) -> None:
        self.ledger, self.who, self.endpoint = ledger, who, endpoint
        self.model, self.request_id = model or "", request_id
        self.prompt = self.cached = self.delivered = 0
        self.finish: str | None = None
        self.done: Done | None = None

    def __call__(self, ev: ChatEvent) -> None:
        if isinstance(ev, (TextDelta, ReasoningDelta)):
            self.delivered += ev.n_tokens
        elif isinstance(ev, ToolCallDelta):
            pass  # its tokens are counted by the run (the parser holds them back)
        elif isinstance(ev, Started):
            if ev.prompt_tokens:  # a stream opened before its model loaded starts with a 0
                self.prompt, self.cached = ev.prompt_tokens, ev.cached_tokens
        elif isinstance(ev, Finish):
            if self.finish is None:
                self.finish = ev.reason
        elif isinstance(ev, Done):
            self.done = ev

    def close(self, token: CancelToken, timer: RequestTimer) -> None:
        """The run's stream closed: its record goes to the ledger's queue."""
        end = time.monotonic()
        done = self.done
        if done is not None:
            u = done.usage
            prompt, cached, generated, error = u.prompt_tokens, u.cached_tokens, u.completion_tokens, done.error
            tier = done.timings.cache_tier if done.timings is not None else None
        else:
            prompt, cached, generated, error, tier = self.prompt, self.cached, token.generated, None, None
        generated = max(generated, self.delivered)
        # a stream closed before its totals: what was generated and not delivered was discarded
        # (after its totals, `delivered` misses the tool calls' tokens: nothing is counted so)
        discarded = generated - self.delivered if done is None else 0
        arrived = timer.arrived
        self.ledger.record(UsageRecord(
            at=time.time(), request_id=self.request_id, tenant=self.who.tenant, key=self.who.key_name,
            via=self.who.key_name if self.who.via_gateway else None, model=self.model, endpoint=self.endpoint,
            prompt_tokens=prompt, cached_tokens=cached, cache_tier=tier, generated_tokens=generated,
            discarded_tokens=discarded, finish_reason=self.finish or ("cancelled" if token.reason else None),
            cancelled=token.reason, error=error,
            queue_ms=_ms(timer.admitted, arrived), ttft_ms=_ms(timer.first, arrived), total_ms=(end - arrived) * 1000))


def _ms(t: float | None, since: float) -> float | None:
    return None if t is None else round((t - since) * 1000, 3)


def record_embedding(ledger: Ledger, who: Caller, endpoint: str, model: str, request_id: str, input_tokens: int,
                     arrived: float) -> None:
    """An embedding request's row: its input tokens are its prompt; nothing is generated."""
    ledger.record(UsageRecord(
        at=time.time(), request_id=request_id, tenant=who.tenant, key=who.key_name,
        via=who.key_name if who.via_gateway else None, model=model, endpoint=endpoint, prompt_tokens=input_tokens,
        finish_reason="stop", total_ms=round((time.monotonic() - arrived) * 1000, 3)))
