"""After the first byte: a Hearth node's stream that broke goes on on another node.

The relay (turn/relay.py) notices the break and asks the turn's `Resumer` to `move` the answer:
the cut (cuts/) says what the client already has, `Resumer` finds another node (urgent: it may
take a node past its in-flight cap, the client is waiting mid-stream), sends it the continuation
request, and hands back its answer as `Moved`. It never sees the turn itself: `send` is the
turn's bound sender (turn/send.py), so failover/ imports nothing of turn/.

Why foreign engines take another path (openai.py): an `openai`-kind engine streams through the
node's own protocol layer (foreign/backend.py), which turns its chunks into Hearth's chat events
before any protocol writes them; the break is seen there, as a chunk stream, and continued as text
(a `continuation` setting per engine says how that engine continues a partial answer). A Hearth
node's stream is relayed as the client's own wire protocol, byte for byte, so its break is
continued at the wire level with the protocol's cut. Same decision (which statuses are retried:
retry.py; the migration limit; `urgent` admission), two levels of the stack.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from hearth.errors import HearthError
from hearth.gateway.failover.cuts import Cut
from hearth.gateway.failover.cuts.base import PARTIAL_IS_OUTPUT
from hearth.gateway.failover.retry import RETRY_STATUSES
from hearth.gateway.fleet.health import counts_as_failure
from hearth.gateway.fleet.pool import Lease, Node, Pool, Release
from hearth.gateway.metrics import GatewayMetrics
from hearth.gateway.protocols import Protocol, is_stream
from hearth.gateway.routing.affinity import Affinity
from hearth.gateway.upstream.http import Answer

log = logging.getLogger("hearth.gateway")

SendTurn = Callable[[Node, dict[str, Any]], Awaitable[Answer]]  # the turn's body (or its continuation) to a node


@dataclass(slots=True)
class Moved:
    """A continuation on another node: its answer (a 200 event stream) and its lease."""

    resp: Answer
    lease: Lease
    release: Release


@dataclass(slots=True)
class Resumer:
    """One streamed turn's way to go on elsewhere; built by the proxy per turn."""

    pool: Pool
    metrics: GatewayMetrics
    limit: int  # --migration-limit: moves per stream
    request: dict[str, Any]  # the turn's body as the client sent it (what `cut.body` extends)
    alias: str
    affinity: Affinity
    hashes: list[tuple[str, int]]
    prompt_tokens: int
    send: SendTurn
    tried: set[str] = field(default_factory=set)  # the nodes this stream has been on (each at most once)
    protocol: Protocol = "chat"  # the stream's (what a continuation's answer must be: SSE, or NDJSON)

    async def move(self, cut: Cut, failed: Node, moves: int) -> Moved | None:
        """Another node's continuation of the answer, or None (nothing to continue with, the
        limit reached, or no node would). `moves`: how often this stream moved already."""
        if moves >= self.limit:
            self.metrics.stream_migrations.labels("limit").inc()
            return None
        moved = await self._continue(cut)
        if moved is not None:
            self.metrics.stream_migrations.labels("continued").inc()
            log.info("the stream from %s continues on %s", failed.name, moved.lease.node.name)
        return moved

    async def _continue(self, cut: Cut) -> Moved | None:
        body = cut.body(self.request)
        if body is None:
            self.metrics.stream_migrations.labels("nothing_to_continue").inc()
            return None
        body[PARTIAL_IS_OUTPUT] = True  # the partial answer keeps its place in max_tokens and usage
        for _ in range(len(self.pool.nodes)):
            try:
                lease = await self.pool.acquire(self.alias, self.affinity, self.hashes, self.prompt_tokens,
                                                self.tried, urgent=True)
            except HearthError:
                break
            self.tried.add(lease.node.name)
            release = self.pool.releaser(lease)
            try:
                resp = await self.send(lease.node, body)
            except httpx.TransportError as e:
                release(False)
                log.warning("continuing on %s: %s", lease.node.name, e)
                continue
            except HearthError as e:
                release(None)
                log.warning("continuing on %s: %s", lease.node.name, e)
                self.metrics.stream_migrations.labels("refused").inc()
                return None
            except BaseException:
                release(None)
                raise
            if resp.status_code == 200 and is_stream(resp.headers.get("content-type", ""), self.protocol):
                return Moved(resp, lease, release)
            if await self._refused(lease, resp, release):
                return None
        self.metrics.stream_migrations.labels("no_node").inc()
        return None

    async def _refused(self, lease: Lease, resp: Answer, release: Release) -> bool:
        """A node that answered the continuation with something other than a stream: True when
        it refused it (stop), False when another node may be tried."""
        try:
            text = (await resp.aread())[:300]
        except httpx.TransportError:
            text = b""
        finally:
            await resp.aclose()
        if resp.status_code in RETRY_STATUSES:
            release(False if counts_as_failure(resp.status_code) else None)
            return False
        release(None)
        log.warning("%s would not continue the answer (%d): %s", lease.node.name, resp.status_code,
                    text.decode(errors="replace"))
        self.metrics.stream_migrations.labels("refused").inc()
        return True
