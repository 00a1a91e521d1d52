"""A turn's body sent to one node: the session made present there first (failover/restore.py),
a response chain re-chained where the node lacks it, and a session the node lost restored from
the gateway's transcript and the turn sent again."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from hearth.gateway.failover.restore import Continuity
from hearth.gateway.fleet.pool import Node
from hearth.gateway.settings import GatewaySettings
from hearth.gateway.turn.request import Turn
from hearth.gateway.upstream.client import node_url
from hearth.gateway.upstream.headers import upstream_headers
from hearth.gateway.upstream.http import Answer, Buffered, Sender
from hearth.gateway.upstream.node_client import NodeClient
from hearth.http.sse import json_bytes

log = logging.getLogger("hearth.gateway")


class TurnSender:
    def __init__(self, settings: GatewaySettings, continuity: Continuity, client: NodeClient,
                 http: Sender, clock: Callable[[], float]) -> None:
        self.settings = settings
        self.continuity = continuity
        self.client = client
        self.http = http  # generation requests; `client` for the rest
        self.clock = clock

    async def send(self, node: Node, turn: Turn, body: dict[str, Any]) -> Answer:
        """POST `body` (the turn's, or its continuation's) to `node`, the session made present
        there first. Raises httpx.TransportError when the node cannot be reached."""
        held = turn.session_id is not None and await self.continuity.ensure_session(
            node, turn.alias, turn.session_id, turn.history)
        payload = {**await self.continuity.rechained(node, body, turn.who), "model": node.up.models[turn.alias]}
        if held:  # the node must not start it afresh if it lost it (a node replaced with an empty disk)
            payload["session_create"] = False
        headers = {**turn.headers, "content-type": "application/json", **upstream_headers(node.up, turn.who)}
        if turn.watch is not None:  # the gateway's span as the node's parent (watch.py)
            headers.update(turn.watch.sending(node.name))
        resp = await self.http.send("POST", node_url(node.up, turn.path), headers, json_bytes(payload),
                                    self.settings.connect_timeout)
        if held and resp.status_code == 404 and turn.session_id is not None:
            passed_on = await self._session_lost(node, turn, resp)
            resp = passed_on if passed_on is not None else await self.http.send(
                "POST", node_url(node.up, turn.path), headers, json_bytes(payload), self.settings.connect_timeout)
        node.last_bytes = self.clock()
        return resp

    async def _session_lost(self, node: Node, turn: Turn, resp: Answer) -> Answer | None:
        """A 404 to a turn of a session the gateway holds on `node`: if the node lost the session,
        restore it from the gateway's transcript and return None (send the turn again); any other
        404 is the answer."""
        assert turn.session_id is not None
        content = await resp.aread()
        await resp.aclose()
        status = await self.client.session_status(node.up, turn.session_id,
                                                  await self.continuity.as_owner(turn.session_id))
        if status != 404:
            return Buffered(resp.status_code, resp.headers, content)
        log.warning("upstream %s lost session %s; restoring it from the gateway's transcript", node.name,
                    turn.session_id)
        await self.continuity.ensure_session(node, turn.alias, turn.session_id, turn.history, lost=True)
        return None
