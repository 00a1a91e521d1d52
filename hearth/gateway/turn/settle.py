"""A cancelled turn's exact counts, from its node's own usage ledger.

When a client leaves mid-stream the gateway closes the node's stream and has seen no usage (it
comes with the last event): only the node knows what it generated before it stopped, counted
exactly in its ledger (hearth/api/http/usage_tap.py; the tokens sampled after the last delivery
are its `discarded`). So the gateway's row for such a turn waits, off the request path, for the
node's row of the same answer (`GET /admin/usage?request_id=ID`, as the turn's own tenant: the
one /admin/ path a tenant key may read) and takes its counts. The node writes that row when its
stream closes, moments after the gateway left it: the lookup is retried with growing waits over
about 25 s (a node waits for its run's last engine output before it writes), then the gateway's
row is written with what it saw (0 tokens: a node without a ledger, an older node, one that went
away).

A stream that failed over and was then left has a part on each node it ran on (the first
answer's id on the node that broke, each continuation's own id on its node, turn/scan.py): each
part is looked up on its node and their counts added, so both parts count once, each exactly as
its node generated it. Invariant this relies on: a continuation's row, when its stream was
closed before its totals, counts only what that run generated (`CancelToken.generated`), not
the partial answer it was sent (`partial_is_output`, counted in its completion tokens only in a
finished answer's usage). The prompt is the first part's (the prompt as the client sent it); a
part whose node has no row (it died) adds nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import httpx

from hearth.gateway.fleet.pool import Pool
from hearth.gateway.upstream.node_client import NodeClient
from hearth.tenants import Caller

DELAYS = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8)  # seconds between lookups (25.5 s in all)
TIMEOUT = 5.0


class NodeUsage:
    """Looks up one answer's row in a node's usage ledger."""

    def __init__(self, pool: Pool, client: NodeClient) -> None:
        self.pool = pool
        self.client = client

    async def joined(self, who: Caller, parts: Sequence[tuple[str, str]]) -> dict[str, Any] | None:
        """The counts of an answer's parts ((node, answer id) each, in order) added up from
        their nodes' rows; None when no node has its part's row."""
        rows = await asyncio.gather(*(self.row(who, node, answer_id) for node, answer_id in parts))
        found = [r for r in rows if r is not None]
        if not found:
            return None
        out = dict(found[0])  # the prompt as the client sent it: the first part found
        for name in ("generated_tokens", "discarded_tokens"):
            out[name] = sum(v for r in found if isinstance(v := r.get(name), int) and v >= 0)
        return out

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
