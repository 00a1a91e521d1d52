"""A turn on an `openai`-kind upstream in the gateway's usage ledger and traces (turn/watch.py),
as a Hearth node's turn is: one ledger row and the same span tree (the root continuing the
client's `traceparent`, `hearth.gateway.route` per node choice, `hearth.gateway.relay` per
attempt, whose context goes to the engine as `traceparent`, `hearth.gateway.failover` for a
stream continued elsewhere).

Such a turn is served by the node's protocol layer in the gateway's process (edge/delegate.py),
over `OpenAIUpstreamBackend` (backend.py), which sees no HTTP request: the delegate sets
`CURRENT` for the inner app's call, and the backend and its streams (created in that call, or in
a task it starts, which copies the context) report to it. The inner app keeps no ledger and
makes no spans of its own (gateway/app.py `_translator`): each turn is counted once, here.

The counts are the engine's, as it reported them (`usage` with `include_usage`, which the
backend always asks for), else the content chunks relayed (one token each, as these engines
stream): a stream the client left has no usage report, so its generated tokens are the chunks
it had received (the engine's own count after the stop cannot be read through the OpenAI API)
and its prompt tokens 0. A continued answer's parts are joined once (failover/openai.py
`joined_usage`). A request with several prompts (/v1/completions) opens one stream each: their
counts add up into the one row.

The row is written, and the root span ended, once the inner app has returned and every stream
it opened has closed (a background response's stream outlives its request).
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field

from starlette.requests import Request

from hearth.chat.types import ChatEvent, Done, Finish, Usage
from hearth.gateway.turn.proxy import Proxy
from hearth.gateway.turn.scan import Scan
from hearth.gateway.turn.watch import TurnWatch
from hearth.http import auth
from hearth.observability.logging import request_id
from hearth.tenants import Caller

# The turn the inner app's call serves (None: none is watched, or not a delegated turn).
CURRENT: ContextVar[ForeignTurn | None] = ContextVar("hearth_gateway_foreign_turn", default=None)


def watched(proxy: Proxy, request: Request, alias: str, arrived: float) -> ForeignTurn | None:
    """The delegated turn's watch (None: the gateway keeps no ledger and traces nothing)."""
    watch = TurnWatch.begin(proxy.ledger, proxy.tracing, proxy.store.instance, request_id.get(), auth.caller(request),
                            alias, request.url.path, arrived, request.headers)
    return None if watch is None else ForeignTurn(watch, proxy.after.spend)


@dataclass(slots=True)
class ForeignTurn:
    watch: TurnWatch
    spend: Callable[[Caller, Scan], None] | None = None  # the caller's per-key usage (turn/after.py)
    scan: Scan = field(default_factory=Scan)  # the counts, added up over the turn's streams
    ids: Scan = field(default_factory=Scan)  # what the client got, read for the answer's id only
    streams: int = 0  # streams opened and not closed yet
    opened: int = 0  # streams opened in all
    returned: bool = False  # the inner app's call is over
    status: int = 200  # what the client got
    finish: str | None = None  # the first choice's finish reason
    cancelled: str | None = None
    error: str | None = None
    _gone: bool = False  # the client left before the inner app answered

    # ---- the inner app's call (edge/delegate.py) ----------------------------------------------

    def sent(self, body: bytes) -> None:
        """Bytes of the answer went to the client: the first is the turn's first byte; the
        answer's id is read from the first few (the id the client has, as for a node's turn)."""
        if body:
            self.watch.relayed()
            if self.ids.answer_id is None and self.ids.looks < 3:
                self.ids.feed(body[:4096])

    def returned_with(self, status: int | None, gone: bool = False, error: str | None = None) -> None:
        """The inner app's call ended: with this status (None: it sent none), the client gone
        before it answered, or an exception."""
        self.returned = True
        if status is not None:
            self.status = status
        if gone and not self.opened:
            self._gone = True
            self.status = 499
        if error is not None and self.error is None:
            self.error = error
        if self.status >= 400 and self.error is None and not self.opened:
            self.error = f"answered {self.status}"
        self._end()

    # ---- the backend (backend.py) -------------------------------------------------------------

    def failed(self, message: str) -> None:
        """The backend refused the turn before any stream (no upstream could take it, or one
        refused it): the error the client gets."""
        self.error = message

    def stream(self) -> StreamReport:
        """A stream opens: its report, which its `EventStream` observes and closes."""
        self.streams += 1
        self.opened += 1
        return StreamReport(self)

    def _end(self) -> None:
        if not self.returned or self.streams or self.watch.ended:
            return
        s = self.scan
        s.answer_id = self.ids.answer_id
        if self.spend is not None and self.opened:
            self.spend(self.watch.key, s)
        cancelled = self.cancelled or ("disconnect" if self._gone else None)
        self.watch.finish(s, self.status, cancelled=cancelled, error=None if cancelled else self.error,
                          finish_reason=self.finish)


@dataclass(slots=True)
class StreamReport:
    """One stream's events as they pass, and its close (`Account`: what it produced so far)."""

    turn: ForeignTurn
    done: Done | None = None

    def __call__(self, ev: ChatEvent) -> None:
        if isinstance(ev, Finish):
            if ev.index == 0 and self.turn.finish is None:
                self.turn.finish = ev.reason
        elif isinstance(ev, Done):
            self.done = ev

    def closed(self, so_far: Usage, reason: str | None) -> None:
        """The stream closed; `so_far`: its counts when it closed before its Done (the client
        left); `reason`: its cancel token's (a time cap is a finish, not a cancel)."""
        t = self.turn
        t.streams -= 1
        usage = self.done.usage if self.done is not None else so_far
        s = t.scan
        s.prompt = (s.prompt or 0) + usage.prompt_tokens
        s.cached = (s.cached or 0) + usage.cached_tokens
        s.completion = (s.completion or 0) + usage.completion_tokens
        if self.done is not None and self.done.error is not None and t.error is None:
            t.error = self.done.error
        if reason is not None and reason != "timeout" and t.cancelled is None:
            t.cancelled = reason
        t._end()
