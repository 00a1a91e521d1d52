"""Forwarding one generation request to a node, and its answer back.

Before the first byte reaches the client a failed attempt is retried on another node: a
connect error, a 502/503/504, an upstream 429 (the node is then left alone for its
Retry-After), or a stream that broke before its first event. After the first byte nothing is
retried (the client already has part of the answer: a retry would duplicate it); a failure
ends the stream with the protocol's terminal error (`terminal.py`). The first byte is the
upstream's first event, or a heartbeat comment once `heartbeat` seconds pass without one (a
long prefill), whichever comes first.

Upstream streams are relayed read by read: the whole events of each read (split at the blank
line) in one write, never an event cut in two.
The client's Authorization / x-api-key are never forwarded: each node gets its own key.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import Response

from hearth.api.http.sse import EventStreamResponse, json_bytes
from hearth.errors import TooManyRequests, Unavailable
from hearth.gateway.config import GatewaySettings
from hearth.gateway.continuity import Continuity
from hearth.gateway.health import counts_as_failure
from hearth.gateway.metrics import GatewayMetrics
from hearth.gateway.pool import Lease, Node, Pool
from hearth.gateway.routing import Affinity, affinity_of, conversation, prefix_hashes
from hearth.gateway.terminal import Protocol, first_response, is_terminal, protocol_of, terminal_error
from hearth.gateway.transcripts import TranscriptStore
from hearth.gateway.upstream_http import Answer, Buffered, Sender, Stalled, within
from hearth.observability.logging import request_id
from hearth.sessions.ids import check_session_id

log = logging.getLogger("hearth.gateway")

FORWARD_HEADERS = ("content-type", "accept", "anthropic-version", "anthropic-beta", "openai-beta", "x-request-id",
                   "x-session-id", "idempotency-key")
RETRY_STATUSES = (429, 502, 503, 504)
HEARTBEAT = b": keep-alive\n\n"

_CACHED = re.compile(rb'"(?:cached_tokens|cache_read_input_tokens)":(\d+)')
_PROMPT = re.compile(rb'"(?:prompt_tokens|input_tokens)":(\d+)')
_RESPONSE_ID = re.compile(rb'"id":"(resp_[A-Za-z0-9_-]+)"')


def forwarded_headers(request: Request) -> dict[str, str]:
    """The client's headers a node may see (never its credentials), and the gateway's request id,
    so one id names the request in the gateway's log and the node's."""
    out = {k: v for k, v in request.headers.items() if k in FORWARD_HEADERS}
    rid = request_id.get()
    if rid != "-":
        out["x-request-id"] = rid
    return out


@dataclass(slots=True)
class Scan:
    """What the gateway learns from an answer as it passes: usage and a Responses id."""

    responses: bool = False  # a Responses answer: look for its id and output
    cached: int | None = None
    prompt: int | None = None
    response_id: str | None = None
    output: list[Any] | None = None  # a Responses answer's output items (kept for chain failover)

    def feed_response(self, data: bytes) -> None:
        """A Responses answer: the whole JSON (non-streamed) or its terminal event."""
        if data.startswith(b"event: "):
            if not data.startswith((b"event: response.completed", b"event: response.incomplete")):
                return
            data = data.split(b"data: ", 1)[-1]
        try:
            doc = json.loads(data)
        except ValueError:
            return
        r = doc.get("response", doc) if isinstance(doc, dict) else None
        if isinstance(r, dict) and isinstance(r.get("output"), list):
            self.output = r["output"]

    def feed(self, data: bytes) -> None:
        if self.responses and self.response_id is None and (r := _RESPONSE_ID.search(data)):
            self.response_id = r.group(1).decode()
        if b'"usage"' not in data:  # most events: text deltas
            return
        if m := _CACHED.findall(data):
            self.cached = int(m[-1])
        if m := _PROMPT.findall(data):
            self.prompt = int(m[-1])


@dataclass(slots=True)
class Turn:
    """A generation request as the proxy routes it."""

    path: str
    protocol: Protocol
    body: dict[str, Any]
    alias: str
    affinity: Affinity
    hashes: list[tuple[str, int]]
    prompt_tokens: int
    session_id: str | None
    history: list[Any]  # the gateway's transcript of the session before this turn ([]: none)
    stream: bool
    headers: dict[str, str]
    started: float = field(default_factory=time.monotonic)


class _Broken(Exception):
    """The upstream stream failed (transport error, or it ended with no terminal event)."""


class Proxy:
    def __init__(self, settings: GatewaySettings, pool: Pool, store: TranscriptStore, metrics: GatewayMetrics,
                 client: httpx.AsyncClient, http: Sender) -> None:
        self.settings = settings
        self.pool = pool
        self.store = store
        self.metrics = metrics
        self.client = client
        self.http = http  # generation requests; `client` for the rest
        self.continuity = Continuity(store, client, metrics)

    # ---- the request ---------------------------------------------------------------------------

    def turn(self, request: Request, body: dict[str, Any]) -> Turn:
        alias = self.pool.resolve(body.get("model"))
        headers = forwarded_headers(request)
        affinity = affinity_of(body, headers)
        # Checked here too: the id goes into upstream URLs (history, create, delete).
        sid = check_session_id(body["session_id"]) if body.get("session_id") is not None else None
        items = conversation(body)
        saved = self.store.transcript(sid) if sid is not None else None
        history = saved[1] if saved is not None else []
        hashes = prefix_hashes(alias, history + items)
        return Turn(request.url.path, protocol_of(request.url.path), body, alias, affinity, hashes,
                    hashes[-1][1] if hashes else 1, sid, history, body.get("stream") is True, headers)

    async def generate(self, request: Request, body: dict[str, Any]) -> Response:
        turn = self.turn(request, body)
        tried: set[str] = set()
        failures: list[_Retry] = []
        for _ in range(len(self.pool.nodes)):
            lease = await self.pool.acquire(turn.alias, turn.affinity, turn.hashes, turn.prompt_tokens, tried)
            tried.add(lease.node.name)
            try:
                answer = await self._attempt(lease, turn)
            except _Retry as e:
                failures.append(e)
                self.metrics.retries.labels(e.label).inc()
                log.warning("upstream %s failed before the first byte (%s); trying another", lease.node.name, e.reason)
                continue
            return answer
        if failures and all(f.label == "status_429" for f in failures):  # the fleet is full, not broken
            self.metrics.rejected("upstreams_full")
            raise TooManyRequests("every upstream is at capacity; retry later", code="upstreams_full",
                                  retry_after=max(1, int(min(f.retry_after for f in failures))))
        last = failures[-1].reason if failures else "no upstream could take the request"
        raise Unavailable(f"every upstream failed: {last}", code="upstream_failed",
                          retry_after=max(1, int(self.settings.probe_interval)))

    async def _attempt(self, lease: Lease, turn: Turn) -> Response:
        node = lease.node
        released = False

        def release(ok: bool | None) -> None:
            nonlocal released
            if not released:
                released = True
                self.pool.release(lease, ok)

        try:
            held = turn.session_id is not None and await self.continuity.ensure_session(
                node, turn.alias, turn.session_id, turn.history)
            payload = {**self.continuity.rechained(node, turn.body), "model": node.up.models[turn.alias]}
            if held:  # the node must not start it afresh if it lost it (a node replaced with an empty disk)
                payload["session_create"] = False
            headers = {**turn.headers, "content-type": "application/json", **node.up.headers()}
            resp = await self.http.send("POST", node.up.url + turn.path, headers, json_bytes(payload),
                                        self.settings.connect_timeout)
            if held and resp.status_code == 404 and turn.session_id is not None:
                passed_on = await self._session_lost(node, turn, resp)
                resp = passed_on if passed_on is not None else await self.http.send(
                    "POST", node.up.url + turn.path, headers, json_bytes(payload), self.settings.connect_timeout)
            node.last_bytes = self.pool.clock()
        except httpx.TransportError as e:
            release(False)
            raise _Retry("connect", f"{node.name}: {type(e).__name__}: {e}") from e
        except BaseException:
            release(None)
            raise
        if resp.status_code in RETRY_STATUSES:
            await resp.aclose()
            wait = _retry_after(resp)
            if resp.status_code == 429:
                node.cooling_until = self.pool.clock() + wait
            release(False if counts_as_failure(resp.status_code) else None)
            raise _Retry(f"status_{resp.status_code}", f"{node.name} answered {resp.status_code}", wait)
        streaming = resp.status_code == 200 and resp.headers.get("content-type", "").startswith("text/event-stream")
        if not streaming:
            try:
                content = await resp.aread()
            except httpx.TransportError as e:
                release(False)
                raise _Retry("read", f"{node.name}: {type(e).__name__}") from e
            finally:
                await resp.aclose()
            ok = None if resp.status_code < 500 else False
            if resp.status_code < 300:
                content = _renamer(node.up.models[turn.alias], turn.alias)(content)
                scan = Scan(responses=turn.protocol == "responses")
                scan.feed(content)
                if turn.protocol == "responses":
                    scan.feed_response(content)
                self._finished(lease, turn, scan)
                ok = True
            release(ok)
            self.metrics.ttft.observe(time.monotonic() - turn.started)
            return Response(content, status_code=resp.status_code,
                            media_type=resp.headers.get("content-type", "application/json"),
                            headers=_passed_headers(resp, node.name))
        return await self._stream(lease, turn, resp, release)

    async def _session_lost(self, node: Node, turn: Turn, resp: Answer) -> Answer | None:
        """A 404 to a turn of a session the gateway holds on `node`: if the node lost the session,
        restore it from the gateway's transcript and return None (send the turn again); any other
        404 is the answer."""
        assert turn.session_id is not None
        content = await resp.aread()
        await resp.aclose()
        r = await self.client.get(f"{node.up.url}/v1/sessions/{turn.session_id}", headers=node.up.headers(),
                                  timeout=30)
        if r.status_code != 404:
            return Buffered(resp.status_code, resp.headers, content)
        log.warning("upstream %s lost session %s; restoring it from the gateway's transcript", node.name,
                    turn.session_id)
        await self.continuity.ensure_session(node, turn.alias, turn.session_id, turn.history, lost=True)
        return None

    # ---- streams -------------------------------------------------------------------------------

    async def _stream(self, lease: Lease, turn: Turn, resp: Answer,
                      release: Callable[[bool | None], None]) -> Response:
        node = lease.node
        events = _events(resp, node, self.pool.clock, self.settings.stall_timeout_for(node.up))
        # The first read runs as a task so that waiting for it can time out (a heartbeat goes out)
        # without cancelling the read; every later read is awaited by the response body itself.
        first_read: asyncio.Task[list[bytes]] = asyncio.create_task(_next(events))

        async def abandon() -> None:
            first_read.cancel()
            with contextlib.suppress(BaseException):
                await first_read
            with contextlib.suppress(Exception):
                await events.aclose()
            await resp.aclose()

        try:  # before the first byte: a failure here is still retried elsewhere
            await asyncio.wait((first_read,), timeout=self.settings.heartbeat)
            first = first_read.result() if first_read.done() else None
        except _Broken as e:
            await abandon()
            release(False)
            raise _Retry("broken_before_first_byte", f"{node.name}: {e}") from e
        except StopAsyncIteration:  # closed without a single event: nothing reached the client, retry
            await abandon()
            release(False)
            raise _Retry("broken_before_first_byte", f"{node.name} sent an empty stream") from None
        except BaseException:
            await abandon()
            release(None)
            raise
        scan = Scan(responses=turn.protocol == "responses")
        state: dict[str, Any] = {"terminal": False, "events": 0, "response": None}
        rename = _renamer(node.up.models[turn.alias], turn.alias)

        def forward(batch: list[bytes]) -> bytes:
            """The events of one upstream read, relayed as one write."""
            out = []
            for event in batch:
                event = rename(event)
                scan.feed(event)
                state["events"] += 1
                if state["response"] is None and turn.protocol == "responses":
                    state["response"] = first_response(event)
                if is_terminal(turn.protocol, event):
                    state["terminal"] = True
                    if turn.protocol == "responses":
                        scan.feed_response(event)
                out.append(event)
            return b"\n\n".join(out) + b"\n\n"

        async def body() -> AsyncIterator[bytes]:
            outcome: bool | None = None
            try:
                self.metrics.ttft.observe(time.monotonic() - turn.started)
                if first is None:  # a long prefill: keep the client's connection warm until it ends
                    while not first_read.done():
                        yield HEARTBEAT
                        await asyncio.wait((first_read,), timeout=self.settings.heartbeat)
                    try:
                        yield forward(first_read.result())
                    except StopAsyncIteration:
                        raise _Broken("the upstream closed the stream before its first event") from None
                else:
                    yield forward(first)
                async for batch in events:
                    yield forward(batch)
                if not state["terminal"] and turn.protocol != "other":
                    raise _Broken("the upstream closed the stream without its final event")
                outcome = True
                self._finished(lease, turn, scan)
            except _Broken as e:
                outcome = False
                phase = "after_first_event" if state["events"] else "before_first_event"
                self.metrics.aborted.labels(phase).inc()
                log.warning("upstream %s broke mid-stream: %s", node.name, e)
                yield terminal_error(turn.protocol, f"the upstream node failed mid-stream ({e}); the partial "
                                     "answer above is all there is: send the turn again",
                                     response=state["response"], sequence_number=state["events"])
            finally:
                await abandon()
                release(outcome)

        # Later silences (a slow tool-call argument, a stalled node) get keep-alive comments from
        # the response itself.
        return EventStreamResponse(body(), headers=_passed_headers(resp, node.name),
                                   heartbeat=self.settings.heartbeat, beat=HEARTBEAT)

    # ---- after the answer ----------------------------------------------------------------------

    def _finished(self, lease: Lease, turn: Turn, scan: Scan) -> None:
        """A successful answer: remember where the conversation now lives."""
        node = lease.node
        node.prefixes.add(turn.hashes)
        self.pool.remember(turn.affinity, node.name)
        if scan.response_id is not None:
            self.pool.remember(Affinity("response", scan.response_id), node.name)
            if scan.output is not None:
                self.continuity.response_done(turn.body, scan.response_id, scan.output)
        if scan.cached is not None:
            self.metrics.reported_cached.inc(scan.cached)
            self.metrics.predicted_cached.inc(lease.decision.predicted_cached)
        if scan.prompt is not None:
            self.metrics.reported_prompt.inc(scan.prompt)
        if turn.session_id is not None:
            self.continuity.session_done(node, turn.session_id, turn.alias)


class _Retry(Exception):
    def __init__(self, label: str, reason: str, retry_after: float = 1.0) -> None:
        super().__init__(reason)
        self.label = label
        self.reason = reason
        self.retry_after = retry_after


async def _next(events: AsyncIterator[list[bytes]]) -> list[bytes]:
    return await anext(events)


async def _events(resp: Answer, node: Node, clock: Callable[[], float],
                  stall: float | None = None) -> AsyncGenerator[list[bytes], None]:
    """Upstream bytes → the whole SSE events (without their blank line) of each read, never an
    event cut in two. A transport failure, or `stall` seconds without a byte, raises _Broken
    (only the read is timed: a slow client holding up the relay is not the upstream stalling).
    Every read marks the node as alive (`Node.last_bytes`)."""
    buf = b""
    try:
        async for chunk in within(resp.aiter_raw(), stall):
            node.last_bytes = clock()
            buf += chunk.replace(b"\r\n", b"\n") if b"\r" in chunk else chunk
            end = buf.rfind(b"\n\n")
            if end < 0:
                continue
            whole, buf = buf[:end], buf[end + 2:]
            batch = [e for e in whole.split(b"\n\n") if e]
            if batch:
                yield batch
    except httpx.HTTPError as e:
        raise _Broken(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__) from e
    except Stalled as e:
        raise _Broken(str(e)) from e


def _renamer(upstream_id: str, alias: str) -> Callable[[bytes], bytes]:
    """Answers name the model as the client did (the alias), not the upstream's id."""
    if upstream_id == alias:
        return lambda data: data
    old = b'"model":' + json.dumps(upstream_id).encode()
    new = b'"model":' + json.dumps(alias).encode()
    return lambda data: data.replace(old, new)


def _retry_after(resp: Answer) -> float:
    try:
        return min(60.0, max(0.0, float(resp.headers.get("retry-after", "1"))))
    except ValueError:
        return 1.0


def _passed_headers(resp: Answer, node: str) -> dict[str, str]:
    """The upstream's answer headers worth keeping, and which node answered (X-Hearth-Upstream)."""
    kept = {k: v for k, v in resp.headers.items() if k in ("x-request-id", "retry-after", "openai-processing-ms")}
    return {**kept, "X-Hearth-Upstream": node}
