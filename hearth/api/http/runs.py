"""The life of one generation request on the HTTP side, shared by every protocol:
register it for /v1/cancel, wait for a slot while watching for the client to leave, time
it for metrics, and undo all of that on every path."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import replace
from typing import Any

from starlette.requests import Request

from hearth.api.context import NodeContext, node
from hearth.api.http.cancels import CancelRegistry, LiveRun
from hearth.api.http.usage_tap import UsageTap, trace_input
from hearth.backends.base import Backend, EventStream
from hearth.chat.cancel import CancelToken
from hearth.chat.types import ChatEvent, ChatRequest, Done, Finish, Started, Usage
from hearth.config import Settings
from hearth.errors import BadRequest, HearthError
from hearth.http.auth import caller
from hearth.http.cache_keys import conversation_key
from hearth.http.sse import COMMENT_BEAT, EventStreamResponse, until_disconnect
from hearth.observability.metrics import RequestTimer
from hearth.tenants import Caller
from hearth.tenants import run_class as resolve_class


class Generation:
    def __init__(self, run: LiveRun, events: EventStream, timer: RequestTimer, registry: CancelRegistry,
                 heartbeat: float | None = None, tap: UsageTap | None = None) -> None:
        self.run, self.events, self.timer, self._registry = run, events, timer, registry
        self.heartbeat = heartbeat
        self._tap = tap
        events.observe(timer)
        if tap is not None:
            events.observe(tap)
        events.on_close(self._finish)

    def _finish(self) -> None:
        self._registry.close(self.run)
        self.timer.done(self.run.token.reason)
        if self._tap is not None:
            self._tap.close(self.run.token, self.timer)

    def disconnected(self) -> None:
        self.run.token.cancel("disconnect")

    def stream(self, chunks: Any, headers: dict[str, str] | None = None, beat: bytes = COMMENT_BEAT
               ) -> EventStreamResponse:
        """The SSE response: its headers go out now (the run is admitted), then `chunks`, with
        `beat` whenever the stream has been silent for the server's heartbeat interval."""
        if self._tap is not None:
            self._tap.streamed = time.monotonic()
        return EventStreamResponse(chunks, headers, close=self.events.aclose, on_disconnect=self.disconnected,
                                   heartbeat=self.heartbeat, beat=beat)

    async def collect(self, request: Request, work: Callable[[], Awaitable[Any]]) -> Any:
        try:
            return await until_disconnect(request, work, self.disconnected)
        finally:
            await self.events.aclose()


def time_cap(settings: Settings, asked: float | None, param: str = "timeout") -> float:
    """The wall-clock cap for a run: the server default, or the client's own up to the maximum."""
    if asked is None:
        return float(settings.request_timeout)
    if asked > settings.max_request_timeout:
        raise BadRequest(f"{param} may be at most {settings.max_request_timeout:g} seconds on this server",
                         param=param)
    return asked


def tap(ctx: NodeContext, who: Caller, endpoint: str, model: str | None, ids: Iterable[str],
        request: Request | None = None, creq: ChatRequest | None = None) -> UsageTap | None:
    """The run's usage-ledger row, trace and journal record (None: the node keeps no ledger,
    traces nothing and keeps no journal). A run no client sent (`request` None) is not journaled."""
    if ctx.ledger is None and ctx.tracing is None and ctx.journal is None:
        return None
    body = getattr(request, "_body", None)  # read and cached by the handler (hearth/http/body.py)
    journal = (ctx.journal, request.url.path, body) if ctx.journal is not None and request is not None \
        and isinstance(body, bytes) else None
    with contextlib.suppress(HearthError):  # a model still loading (`opened_later`): the name as asked
        model = ctx.backend.resolve(model)  # the default model by its id
    return UsageTap(ctx.ledger, ctx.tracing, who, endpoint, model, next(iter(ids), ""),
                    trace_input(ctx.tracing, request.headers if request is not None else None, creq), journal)


async def start(request: Request, endpoint: str, open_stream: Callable[[CancelToken], Awaitable[EventStream]], *,
                cancel_id: str | None = None, session_id: str | None = None, ids: Iterable[str] = (),
                model: str | None = None, creq: ChatRequest | None = None) -> Generation:
    """Register the run, then call `open_stream(token)` (validation and the wait for a slot)
    while watching for a disconnect; a client that leaves while queued leaves the queue.
    `model` (as asked) and the first of `ids` go to the usage ledger."""
    arrived = time.monotonic()
    ctx = node(request)
    registry, metrics = ctx.cancels, ctx.metrics
    ids = list(ids)
    run = registry.open(cancel_id=cancel_id, session_id=session_id, ids=ids, owner=caller(request).tenant)
    timer = metrics.timer(endpoint, arrived)
    try:
        events = await until_disconnect(request, lambda: open_stream(run.token),
                                        lambda: run.token.cancel("disconnect"))
        events.observe(ctx.keys.observer(caller(request).key_name, caller(request).on_behalf))
    except BaseException:
        registry.close(run)
        if run.token.reason is not None:
            metrics.cancellations.labels(run.token.reason).inc()
        raise
    timer.admitted_now()
    return Generation(run, events, timer, registry, ctx.settings.sse_heartbeat,
                      tap(ctx, caller(request), endpoint, model, ids, request, creq))


def keyed(request: Request, creq: ChatRequest) -> ChatRequest:
    """`creq` with its conversation key (the body's, `cache_keys.body_key`, first, the headers'
    second) and, for a session turn, its caller (a session of another tenant is not found)."""
    who = caller(request)
    session = replace(creq.session, caller=who) if creq.session is not None else None
    return replace(creq, cache_key=conversation_key(creq.cache_key, request.headers), session=session,
                   cache_ns=who.namespace(creq.cache_salt), tenant=who.tenant, weight=who.weight,
                   priority=run_class(who, creq.priority))


def run_class(who: Caller, asked: str | None) -> str:
    """The admission class a request of `who` runs in: what it asked for, else its key's
    default, never above its key's ceiling (hearth.engine.fair_share.resolve_class)."""
    return resolve_class(asked, who.priority, who.max_priority)


async def start_detached(ctx: NodeContext, endpoint: str, creq: ChatRequest, run: LiveRun, arrived: float,
                         key_name: str | None = None, tenant: str | None = None) -> Generation:
    """`start_chat` for a run no client holds (a background response): `run` (opened by the
    caller in `ctx.cancels`, so that it can be cancelled before it is admitted) waits for a slot
    as any run does, but no disconnect cancels it; closed here if it is never admitted."""
    timer = ctx.metrics.timer(endpoint, arrived)
    try:
        events = await ctx.backend.chat(replace(creq, cancel=run.token))
        events.observe(ctx.keys.observer(key_name, tenant))
    except BaseException:
        ctx.cancels.close(run)
        if run.token.reason is not None:
            ctx.metrics.cancellations.labels(run.token.reason).inc()
        raise
    timer.admitted_now()
    who = Caller(tenant or run.owner, key_name, via_gateway=tenant is not None)
    return Generation(run, events, timer, ctx.cancels, ctx.settings.sse_heartbeat,
                      tap(ctx, who, endpoint, creq.model, [creq.request_id], None, creq))


async def start_chat(request: Request, endpoint: str, creq: ChatRequest, cancel_id: str | None,
                     stream: bool = False) -> Generation:
    """`start` for a chat request (Chat, Messages, Responses): the run is registered under its
    cancel_id, its session and its id, then the node's backend gets `creq` complete, with the
    run's cancel token and its conversation key (`creq.cache_key` holds the body's, from
    `cache_keys.body_key`; the headers' come second). A `stream` whose model must be loaded
    first starts at once (`opened_later`)."""
    ctx = node(request)
    creq = keyed(request, creq)
    registered: dict[str, Any] = {"cancel_id": cancel_id, "ids": [creq.request_id], "model": creq.model,
                                  # as stored: a tenant's ids are its namespace (hearth.tenants)
                                  "session_id": caller(request).session_key(creq.session.session_id)
                                  if creq.session else None}
    if stream and must_load(ctx.backend, creq.model):
        return opened_later(request, endpoint, lambda token: ctx.backend.chat(replace(creq, cancel=token)), creq.n,
                            registered, creq)
    return await start(request, endpoint, lambda token: ctx.backend.chat(replace(creq, cancel=token)),
                       **registered, creq=creq)


def must_load(backend: Backend, model: str | None) -> bool:
    loading = backend.model_loading
    return loading is not None and not loading.is_loaded(model)


def opened_later(request: Request, endpoint: str, open_stream: Callable[[CancelToken], Awaitable[EventStream]],
                 n: int, registered: dict[str, Any], creq: ChatRequest | None = None) -> Generation:
    """A stream whose model is not loaded: its response starts now, so its headers, its opening
    event (each protocol's answer to `Started`: the role chunk, message_start, the first
    completion chunk; Responses sends response.created before any event) and heartbeats go
    out while the model loads (a load takes seconds, and clients give up on a silent
    connection); the backend's stream opens inside it. That first `Started` counts no prompt
    tokens (the prompt is tokenized by the model being loaded): the totals at the end do. The
    run is registered first, so a cancel or a disconnect during the load ends it as anywhere
    else (`cancelled`, no tokens). What would have been a 4xx or 503 before the first byte (a
    failed load, a context overflow) arrives as the stream's error event instead: the status
    line is already sent."""
    ctx, who = node(request), caller(request)
    registered = dict(registered)
    model = registered.pop("model", None)
    run = ctx.cancels.open(**registered, owner=who.tenant)  # the caller's to cancel, as in `start`
    timer = ctx.metrics.timer(endpoint, time.monotonic())
    observer = ctx.keys.observer(who.key_name)

    async def events() -> AsyncIterator[ChatEvent]:
        yield Started(0)
        try:
            inner = await open_stream(run.token)
        except HearthError as e:
            for i in range(n):
                yield Finish(i, "error")
            yield Done(Usage(), error=f"{e.code}: {e.message}")
            return
        inner.observe(observer)
        timer.admitted_now()
        try:
            opening = True
            async for ev in inner:
                if opening and isinstance(ev, Started):  # sent already
                    opening = False
                    continue
                opening = False
                yield ev
        finally:
            await inner.aclose()

    return Generation(run, EventStream(events()), timer, ctx.cancels, ctx.settings.sse_heartbeat,
                      tap(ctx, who, endpoint, model, registered.get("ids", ()), request, creq))
