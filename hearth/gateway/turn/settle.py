"""A cancelled turn's exact counts, from its node's own usage ledger.

When a client leaves mid-stream the gateway closes the node's stream and has seen no usage (it
comes with the last event): only the node knows what it generated before it stopped, counted
exactly in its ledger (hearth/api/http/usage_tap.py; the tokens sampled after the last delivery
are its `discarded`). So the gateway's row for such a turn waits, off the request path, for the
node's row of the same answer (`GET /admin/usage?request_id=ID`, as the turn's own tenant: the
one /admin/ path a tenant key may read) and takes its counts. The node writes that row when its
stream closes, moments after the gateway left it: the lookup is retried a few times over a few
seconds, then the gateway's row is written with what it saw (0 tokens: a node without a
ledger, an older node, one that went away).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from hearth.gateway.fleet.pool import Pool
from hearth.gateway.upstream.node_client import NodeClient
from hearth.tenants import Caller

DELAYS = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2)  # seconds between lookups (6.35 s in all)
TIMEOUT = 5.0


class NodeUsage:
    """Looks up one answer's row in a node's usage ledger."""

    def __init__(self, pool: Pool, client: NodeClient) -> None:
        self.pool = pool
        self.client = client

    async def row(self, who: Caller, node_name: str, answer_id: str) -> dict[str, Any] | None:
        """The node's row for `answer_id`, or None (no such node, no ledger there, not found in time)."""
        for delay in (*DELAYS, None):
            node = self.pool.nodes.get(node_name)
            if node is None or node.up.kind != "hearth":
                return None
            try:
                r = await self.client.usage_row(node.up, answer_id, who, TIMEOUT)
            except httpx.HTTPError:
                return None
            if r.status != 200:
                return None
            rows = r.obj.get("data")
            if isinstance(rows, list) and rows and isinstance(rows[0], dict):
                return rows[0]
            if delay is None:
                return None
            await asyncio.sleep(delay)
        return None
