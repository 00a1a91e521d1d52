"""The gateway's reads of what Hearth nodes hold: each node's digest, polled, and a request's
blocks, asked of one node per hash-chain root.

Polling: every `--digest-interval` seconds each live Hearth node's `GET /v1/prompt-cache/digest`
(bounded by `--digest-timeout`). A failed poll leaves the last digest in use, marked stale;
past `--digest-max-age` seconds without a good one it is dropped and the node is routed by the
estimate again. A node that answers 404 (no prompt cache: an older node or a backend without
one) or a digest of a version this gateway does not read publishes nothing.

Blocks: for a stateless request the gateway asks ONE node per root (the least loaded live
Hearth node with a digest of that root) for the request's blocks (`POST
/v1/prompt-cache/blocks`), bounded by `--digest-timeout`. A failure routes by the estimate:
routing never fails a request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

import httpx

from hearth.fleet_protocol import BlocksQuery
from hearth.gateway.fleet.cache_state import Digest, RequestBlocks, parse_digest
from hearth.gateway.fleet.periodic import Periodic
from hearth.gateway.metrics import GatewayMetrics
from hearth.gateway.routing.policy import least_loaded
from hearth.gateway.settings import GatewaySettings
from hearth.gateway.upstream.node_client import NodeClient

log = logging.getLogger("hearth.gateway")


class Digests:
    def __init__(self, settings: GatewaySettings, client: NodeClient, metrics: GatewayMetrics,
                 nodes: Callable[[], Iterable[Any]], clock: Callable[[], float]) -> None:
        self.settings = settings
        self.client = client
        self.metrics = metrics
        self.nodes = nodes  # the pool's Node objects (each has `digest`)
        self.clock = clock
        self._periodic = Periodic(settings.digest_interval, self.poll_all, "digest poll")

    @property
    def enabled(self) -> bool:
        return self.settings.digest_interval > 0 and self.settings.routing == "cost"

    # ---- polling -------------------------------------------------------------------------------

    async def poll(self, node: Any) -> None:
        try:
            r = await self.client.digest(node.up, self.settings.digest_timeout)
        except httpx.HTTPError as e:
            self._failed(node, f"{type(e).__name__}: {e}")
            return
        if r.status == 404:  # no prompt cache there: it publishes nothing
            node.digest = None
            return
        models = parse_digest(r.doc) if r.status == 200 else None
        if models is None:
            self._failed(node, f"answered {r.status} without a digest this gateway reads")
            return
        node.digest = Digest(models, self.clock())

    def _failed(self, node: Any, why: str) -> None:
        self.metrics.digest_failures.labels(node.name, "digest").inc()
        d: Digest | None = node.digest
        if d is None:
            return
        d.stale, d.failures = True, d.failures + 1
        if self.clock() - d.fetched > self.settings.digest_max_age:
            log.warning("upstream %s: no digest for %.0f s (%s); routing it by the estimate",
                        node.name, self.clock() - d.fetched, why)
            node.digest = None

    async def poll_all(self) -> None:
        polled = []
        for n in self.nodes():
            if n.up.kind != "hearth":
                continue
            if n.live.up:
                polled.append(self.poll(n))
            elif n.digest is not None:  # a node that is down holds what it held, or nothing: age it
                self._failed(n, "the node is down")
        await asyncio.gather(*polled)

    async def start(self) -> None:
        if self.enabled:
            await self.poll_all()
            self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()

    # ---- a request's blocks --------------------------------------------------------------------

    async def blocks(self, candidates: list[Any], alias: str, path: str, body: dict[str, Any]
                     ) -> dict[str, RequestBlocks]:
        """The request's blocks per root, asked of one node per root among `candidates` that
        have a digest of the model; {} if none has, or every call failed."""
        by_root: dict[str, list[Any]] = {}
        for n in candidates:
            state = n.digest.model(n.up.models[alias]) if n.digest is not None else None
            if state is not None:
                by_root.setdefault(state.root, []).append(n)
        asked = [least_loaded(ns) for ns in by_root.values()]
        answers = await asyncio.gather(*(self._ask(n, alias, path, body) for n in asked))
        return {a.root: a for a in answers if a is not None and a.blocks}

    async def _ask(self, node: Any, alias: str, path: str, body: dict[str, Any]) -> RequestBlocks | None:
        payload = BlocksQuery(path=path, body={**body, "model": node.up.models[alias]})
        try:
            r = await self.client.blocks(node.up, payload, self.settings.digest_timeout)
            found = RequestBlocks.parse(r.doc) if r.status == 200 else None
            why = f"answered {r.status}"
        except httpx.HTTPError as e:
            found, why = None, f"{type(e).__name__}: {e}"
        if found is None:
            # A 4xx here is the body's fault: generation will answer it the same way.
            log.debug("upstream %s: no blocks for a %s request (%s); routing by the estimate", node.name, path, why)
            self.metrics.digest_failures.labels(node.name, "blocks").inc()
        return found

