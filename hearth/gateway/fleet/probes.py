"""The liveness probe loop: every `probe_interval` each node is asked whether it is up (Hearth
nodes `/health`; OpenAI-compatible engines `/v1/models`, which all have and which also checks the
upstream key), and its `Liveness` (health.py) records the answer. A node that comes up or goes
down wakes the requests waiting in the pool. Out of `Pool` (which admits requests) and out of
health.py (which `Node` imports: a prober there would close a cycle); like `Digests`, it reads the
nodes through a callable, so nodes that join are probed too."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import httpx

from hearth.gateway.fleet.health import BUSY_GRACE
from hearth.gateway.fleet.periodic import Periodic
from hearth.gateway.fleet.pool import Node
from hearth.gateway.metrics import GatewayMetrics
from hearth.gateway.settings import GatewaySettings
from hearth.gateway.upstream.node_client import NodeClient

log = logging.getLogger("hearth.gateway")


class Prober:
    def __init__(self, settings: GatewaySettings, client: NodeClient, metrics: GatewayMetrics,
                 nodes: Callable[[], list[Node]], wake: Callable[[], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.client = client
        self.metrics = metrics
        self.nodes = nodes
        self.wake = wake
        self.clock = clock
        self._periodic = Periodic(settings.probe_interval, self.probe_all, "liveness probe")

    async def probe(self, node: Node) -> None:
        try:
            path, status = await self.client.probe(node.up, self.settings.probe_timeout)
            ok, error = status == 200, f"{path} answered {status}"
        except httpx.TimeoutException as e:
            # A slow probe of a node that is working on our requests is busy, not dead (some engines
            # serialise every request, probes included, behind the running one): inconclusive while
            # it showed life (answer headers or bytes) within BUSY_GRACE.
            if node.in_flight and self.clock() - node.last_bytes < BUSY_GRACE:
                return
            ok, error = False, f"{type(e).__name__}: {e}"
        except httpx.HTTPError as e:
            ok, error = False, f"{type(e).__name__}: {e}"
        if node.live.probed(ok, error):
            log.warning("upstream %s is %s%s", node.name, "up" if ok else "down", "" if ok else f" ({error})")
            self.metrics.health_change(node.name, ok)
            self.wake()

    async def probe_all(self) -> None:
        await asyncio.gather(*(self.probe(n) for n in self.nodes()))

    async def start(self) -> None:
        """Every node probed once before it returns, then the loop."""
        await self.probe_all()
        self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()
