"""One generation request through the gateway, a turn: read it (request.py), choose a node
(`Pool.acquire`), send it there (send.py), relay its answer (relay.py), and record where the
conversation now lives (after.py).

A node that fails before the client's first byte is left for another (failover/retry.py: which
failures, and the error once every node failed); one that fails after it is resumed elsewhere
(failover/resume.py, through the relay). A session the gateway holds is made present on the
chosen node first (failover/restore.py), and re-created there if the node lost it. The client's
headers go to the node as `upstream.headers.forwarded_headers` says.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import Response

from hearth.errors import HearthError, TooManyRequests
from hearth.gateway.failover.cuts import cut_for
from hearth.gateway.failover.restore import Continuity
from hearth.gateway.failover.resume import Resumer
from hearth.gateway.failover.retry import RETRY_STATUSES, Retry, exhausted, refused
from hearth.gateway.fleet.health import counts_as_failure
from hearth.gateway.fleet.pool import Lease, Node, Pool, Release
from hearth.gateway.metrics import GatewayMetrics
from hearth.gateway.protocols import is_stream
from hearth.gateway.settings import GatewaySettings
from hearth.gateway.store.base import GatewayStore
from hearth.gateway.store.usage import GatewayLedger
from hearth.gateway.turn.after import AfterTurn, TurnEnd
from hearth.gateway.turn.relay import Relay
from hearth.gateway.turn.request import Turn, read_turn
from hearth.gateway.turn.scan import Scan
from hearth.gateway.turn.send import TurnSender
from hearth.gateway.turn.settle import NodeUsage
from hearth.gateway.turn.watch import TurnWatch
from hearth.gateway.upstream.headers import passed_headers
from hearth.gateway.upstream.http import Answer, Sender
from hearth.gateway.upstream.node_client import NodeClient
from hearth.observability.logging import request_id
from hearth.observability.tracing import Tracing
from hearth.protocols.ollama_wire import ANSWER_ID_HEADER

log = logging.getLogger("hearth.gateway")

# The protocols a node's prompt-blocks call reads (hearth/api/prompt_blocks.py): the others
# (Ollama's, embeddings) are routed by the estimate.
BLOCKS = ("chat", "completions", "anthropic", "responses")


class Proxy:
    def __init__(self, settings: GatewaySettings, pool: Pool, store: GatewayStore, metrics: GatewayMetrics,
                 client: NodeClient, http: Sender) -> None:
        self.settings = settings
        self.pool = pool
        self.store = store
        self.metrics = metrics
        self.continuity = Continuity(store, client, metrics, keyed=settings.tenants)
        self.sender = TurnSender(settings, self.continuity, client, http, pool.clock)
        self.after = AfterTurn(settings, pool, store, metrics, self.continuity)
        self.relay = Relay(settings, metrics, pool.clock)
        self.node_usage = NodeUsage(pool, client)
        self.ledger: GatewayLedger | None = None  # the usage ledger and traces, when the app keeps them
        self.tracing: Tracing | None = None

    async def turn(self, request: Request, body: dict[str, Any]) -> Turn:
        return await read_turn(request, body, self.pool, self.store)

    async def generate(self, request: Request, body: dict[str, Any]) -> Response:
        return await self.serve(await self.turn(request, body))

    async def serve(self, turn: Turn) -> Response:
        """The turn sent, retried and relayed; needs nothing of the client's request (a
        background run's turn is served by a task of the gateway's, `background.py`). Its
        ledger row and spans (watch.py) end here when no stream is relayed, else with the relay."""
        if turn.watch is None:
            turn.watch = TurnWatch.begin(self.ledger, self.tracing, self.store.instance, request_id.get(), turn.key,
                                         turn.alias, turn.path, turn.started, turn.headers)
            if turn.watch is not None:
                turn.watch.counts = functools.partial(self.node_usage.joined, turn.who)
        watch = turn.watch
        try:
            return await self._serve(turn)
        except HearthError as e:
            if watch is not None:
                watch.finish(None, e.status, error=e.message)
            raise
        except asyncio.CancelledError:  # the client left before an answer began (waiting for a node)
            if watch is not None:
                watch.finish(None, 499, cancelled="disconnect")
            raise
        except BaseException as e:
            if watch is not None:
                watch.finish(None, 500, error=type(e).__name__)
            raise

    async def _serve(self, turn: Turn) -> Response:
        tried: set[str] = set(turn.avoid)
        failures: list[Retry] = []
        # What the nodes hold of this prompt (routing/): asked once, kept across retries.
        blocks = {} if turn.session_id is not None or turn.protocol not in BLOCKS else await self.pool.request_blocks(
            turn.alias, turn.affinity, turn.path, turn.body)
        for _ in range(len(self.pool.nodes)):
            since = time.monotonic()
            lease = await self.pool.acquire(turn.alias, turn.affinity, turn.hashes, turn.prompt_tokens, tried,
                                            blocks)
            if turn.watch is not None:
                turn.watch.routed(lease, since)
            tried.add(lease.node.name)
            try:
                answer = await self._attempt(lease, turn)
            except Retry as e:
                if turn.watch is not None:
                    turn.watch.retried(lease.node.name, e.reason)
                failures.append(e)
                self.metrics.retries.labels(e.label).inc()
                log.warning("upstream %s failed before the first byte (%s); trying another", lease.node.name, e.reason)
                continue
            return answer
        error = exhausted(failures, self.settings.probe_interval)
        if isinstance(error, TooManyRequests):  # the fleet is full, not broken
            self.metrics.rejected("upstreams_full")
        raise error

    async def _attempt(self, lease: Lease, turn: Turn) -> Response:
        node = lease.node
        release = self.pool.releaser(lease)
        try:
            resp = await self.sender.send(node, turn, turn.body)
        except httpx.TransportError as e:
            release(False)
            raise Retry("connect", f"{node.name}: {type(e).__name__}: {e}") from e
        except BaseException:
            release(None)
            raise
        if resp.status_code in RETRY_STATUSES:
            await resp.aclose()
            retry = refused(node.name, resp)
            if resp.status_code == 429:
                node.cooling_until = self.pool.clock() + retry.retry_after
            release(False if counts_as_failure(resp.status_code) else None)
            raise retry
        if not (resp.status_code == 200 and is_stream(resp.headers.get("content-type", ""), turn.protocol)):
            return await self._whole(resp, lease, turn, release)
        cut = cut_for(turn.protocol, turn.body, turn.started) if self.settings.migration_limit else None
        resumer = None if cut is None else Resumer(
            self.pool, self.metrics, self.settings.migration_limit, turn.body, turn.alias, turn.affinity,
            turn.hashes, turn.prompt_tokens, _BoundSend(self.sender, turn).send, {node.name, *turn.avoid},
            turn.protocol)
        return await self.relay.stream(resp, lease, turn.alias, turn.protocol, turn.started,
                                       TurnEnd(self.after, turn, cut), release, cut, resumer)

    async def _whole(self, resp: Answer, lease: Lease, turn: Turn, release: Release) -> Response:
        """A non-streamed answer (or any error): read whole, recorded, passed on."""
        node = lease.node
        try:
            content = await resp.aread()
        except httpx.TransportError as e:
            release(False)
            raise Retry("read", f"{node.name}: {type(e).__name__}") from e
        finally:
            await resp.aclose()
        ok = None if resp.status_code < 500 else False
        scan: Scan | None = None
        if resp.status_code < 300:
            content, scan = self.relay.whole(content, node, turn.alias, turn.protocol,
                                             resp.headers.get(ANSWER_ID_HEADER))
            if not await self.after.record(lease, turn, scan):
                # The node answered and died before its transcript was copied: nothing reached
                # the client, so the turn runs again elsewhere (the node's copy is stale now).
                release(False)
                raise Retry("read", f"{node.name} failed before its session transcript was copied")
            ok = True
        release(ok)
        self.metrics.ttft.observe(time.monotonic() - turn.started)
        if turn.watch is not None:
            turn.watch.relayed()
            turn.watch.finish(scan, resp.status_code,
                              error=None if resp.status_code < 400 else f"upstream answered {resp.status_code}")
        return Response(content, status_code=resp.status_code,
                        media_type=resp.headers.get("content-type", "application/json"),
                        headers=passed_headers(resp, node.name))


class _BoundSend:
    """`TurnSender.send` bound to one turn: what failover/resume.py sends a continuation with
    (it never sees the turn)."""

    __slots__ = ("sender", "turn")

    def __init__(self, sender: TurnSender, turn: Turn) -> None:
        self.sender, self.turn = sender, turn

    async def send(self, node: Node, body: dict[str, Any]) -> Answer:
        return await self.sender.send(node, self.turn, body)
