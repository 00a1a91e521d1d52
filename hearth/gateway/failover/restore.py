"""No conversation lost: what the gateway copies from each successful turn, and how a
conversation whose node is gone continues on another.

- A session (`session_id`): after each turn its transcript is copied from the node's
  `/history` before the turn's answer ends for the client (`session_synced`; copies of one
  session run in order); on another node the session is first
  re-created from that copy (`POST /v1/sessions` with `messages`), and the turn re-prefills it.
- A Responses chain (`previous_response_id`) on Hearth nodes: each stored turn's input and
  output items are kept; on another node the chain is replayed as input items, without the id.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx

from hearth.errors import BadRequest, HearthError
from hearth.fleet_protocol import SessionCreate
from hearth.gateway.fleet.pool import Node
from hearth.gateway.metrics import GatewayMetrics
from hearth.gateway.routing.affinity import key_of
from hearth.gateway.store.base import GatewayStore
from hearth.gateway.tenancy import owner_caller, owns
from hearth.gateway.upstream.node_client import NodeClient
from hearth.tenants import Caller

log = logging.getLogger("hearth.gateway")


def input_items(value: Any) -> list[Any]:
    """A Responses `input` as a list of items (a string is one user message)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return list(value) if isinstance(value, list) else []


class Continuity:
    def __init__(self, store: GatewayStore, client: NodeClient, metrics: GatewayMetrics,
                 keyed: bool = False) -> None:
        self.store = store
        self.keyed = keyed  # the gateway carries tenants: what it does for a session, it does as its owner
        self.client = client
        self.metrics = metrics
        self._background: set[asyncio.Task[None]] = set()
        self._syncs: dict[str, asyncio.Task[None]] = {}  # the latest transcript copy per session

    async def as_owner(self, sid: str) -> Caller:
        """Who the gateway calls a node as about session `sid`: its owner (tenancy.py)."""
        return owner_caller(await self.store.owner_of("session", sid), self.keyed)

    # ---- before a turn -------------------------------------------------------------------------

    async def ensure_session(self, node: Node, alias: str, sid: str, history: list[Any],
                             lost: bool = False) -> bool:
        """Before a turn of session `sid` on `node`, `history` its transcript as the gateway keeps it.
        A session that lived on another node (or that `node` lost: `lost`) continues here:
        re-create it from the transcript (its KV is rebuilt by this turn's prefill). True: the
        session exists on `node` with its history (so the turn must not create it afresh)."""
        owner = await self.store.node_of(key_of("session", sid))
        if not history:
            return False  # nothing to carry over: the session starts afresh here
        if owner is None or (owner == node.name and not lost):
            return owner == node.name
        body = SessionCreate(session_id=sid, model=node.up.models[alias], messages=history)
        who = await self.as_owner(sid)  # re-created as its owner's, as it was
        r = await self.client.create_session(node.up, body, who)
        if r.status == 409:  # a stale copy from an earlier stay on this node
            await self.client.delete_session(node.up, sid, who)
            r = await self.client.create_session(node.up, body, who)
        if r.status >= 500:
            raise httpx.TransportError(f"creating the session answered {r.status}")
        if r.status >= 400:
            raise BadRequest(f"could not continue session {sid} on {node.name}: {r.text[:300]}")
        self.metrics.reprefills.inc()
        log.info("session %s continues on %s from the gateway's transcript (%d messages)", sid, node.name,
                 len(history))
        return True

    async def rechained(self, node: Node, body: dict[str, Any], who: Caller) -> dict[str, Any]:
        """The body for `node`. A `previous_response_id` chain held by another (dead or draining)
        node is replayed from the gateway's copy as input items, without the id (only for a
        caller who owns it: anyone else's turn goes with the id, which the node does not know)."""
        rid = body.get("previous_response_id")
        if not isinstance(rid, str) or not await owns(self.store, who, "response", rid):
            return body
        owner = await self.store.node_of(key_of("response", rid))
        if owner is None or owner == node.name:
            return body
        items = await self.store.chain(rid)
        if items is None:
            return body  # not all of the chain is here: the node answers for the id itself
        self.metrics.reprefills.inc()
        log.info("response chain %s continues on %s from the gateway's copy (%d items)", rid, node.name, len(items))
        out = {k: v for k, v in body.items() if k != "previous_response_id"}
        out["input"] = items + input_items(body.get("input"))
        return out

    # ---- after a turn --------------------------------------------------------------------------

    async def response_done(self, body: dict[str, Any], response_id: str, output: list[Any]) -> None:
        if body.get("store") is False:
            return
        previous = body.get("previous_response_id")
        await self.store.save_response(response_id, previous if isinstance(previous, str) else None,
                                 input_items(body.get("input")) + output)

    def session_done(self, node: Node, sid: str, alias: str) -> None:
        """Copy the transcript after this turn, after any copy still running for the session (an
        older copy must not land last)."""
        before = self._syncs.get(sid)

        async def run() -> None:
            if before is not None:
                await asyncio.gather(before, return_exceptions=True)
            await self.copy_transcript(node, sid, alias)

        task = asyncio.create_task(run())
        self._syncs[sid] = task
        self._background.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._background.discard(t)
            if self._syncs.get(sid) is t:
                del self._syncs[sid]

        task.add_done_callback(done)

    async def session_synced(self, node: Node, sid: str, alias: str) -> bool:
        """Copy the transcript after a generation turn, now: the turn's answer is held back
        until it is in the gateway's copy (a node that dies right after answering must not take
        the turn with it). After any copy still running for the session. False: not copied."""
        before = self._syncs.get(sid)
        if before is not None:
            await asyncio.gather(before, return_exceptions=True)
        return await self.copy_transcript(node, sid, alias)

    async def copy_transcript(self, node: Node, sid: str, alias: str) -> bool:
        try:
            r = await self.client.history(node.up, sid, await self.as_owner(sid))
            data = r.obj.get("data") if r.status == 200 else None
            if isinstance(data, list):
                await self.store.save_transcript(sid, alias, data)
                return True
            log.warning("could not copy session %s's transcript from %s: it answered %d", sid, node.name,
                        r.status)
        except (httpx.HTTPError, ValueError, HearthError) as e:  # HearthError: the database is away
            log.warning("could not copy session %s's transcript from %s: %s", sid, node.name, e)
        return False

    async def idle(self) -> None:
        """Wait for background transcript copies (tests, shutdown)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)
