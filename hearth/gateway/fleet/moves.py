"""Moving a session between Hearth nodes with its KV: save → snapshot archive → import →
load on the destination → delete on the source. The next turn on the destination reuses the
KV (no re-prefill). `drain` moves every session off a node and keeps it out of routing.

A session busy with a turn cannot be saved (409 session_busy): the move waits for the turn
(bounded, `BUSY_WAIT` seconds).

A move and a drain are recorded in the store as they go (`moves`, `drains`): every gateway on
the database stops routing to a drained node, and a gateway that dies mid-move leaves a row that
a survivor settles (`settle`, called by leases.py): finished if the session was already
reassigned, else rolled back (the session stays on its source; the copies go)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import httpx

from hearth.errors import BadRequest, Conflict, NotFound, Unavailable
from hearth.gateway.fleet.pool import Node, Pool
from hearth.gateway.metrics import GatewayMetrics
from hearth.gateway.routing.affinity import key_of, value_of
from hearth.gateway.routing.policy import least_loaded
from hearth.gateway.store.base import GatewayStore, Move
from hearth.gateway.tenancy import owner_caller
from hearth.gateway.upstream.node_client import NodeClient, Reply
from hearth.tenants import OPEN, Caller

log = logging.getLogger("hearth.gateway")

BUSY_WAIT = 60.0


class Mover:
    def __init__(self, pool: Pool, store: GatewayStore, client: NodeClient, metrics: GatewayMetrics) -> None:
        self.pool = pool
        self.store = store
        self.client = client
        self.metrics = metrics

    def _node(self, name: str) -> Node:
        node = self.pool.nodes.get(name)
        if node is None:
            raise NotFound(f"no upstream named {name!r}", param="node", code="node_not_found")
        return node

    async def owner(self, sid: str) -> Node:
        name = await self.store.node_of(key_of("session", sid))
        if name is None or name not in self.pool.nodes:
            raise NotFound(f"the gateway knows no session {sid!r}", param="session_id", code="session_not_found")
        return self.pool.nodes[name]

    def destination(self, src: Node, model: str, to: str | None) -> Node:
        """`to`, or the least loaded routable Hearth node that serves the session's model."""
        if to is not None:
            dst = self._node(to)
            if dst is src:
                raise BadRequest("the session is already on that node", param="to")
            return dst
        aliases = [a for a, m in src.up.models.items() if m == model] or list(src.up.models)
        now = self.pool.clock()
        options = [n for n in self.pool.nodes.values()
                   if n is not src and n.up.kind == "hearth" and n.routable(now)
                   and any(a in n.up.models for a in aliases)]
        if not options:
            raise Unavailable("no other healthy Hearth node serves this session's model", code="no_destination",
                              retry_after=5)
        return least_loaded(options)

    async def _call(self, node: Node, method: str, path: str, *, admin: bool = False, ok: tuple[int, ...] = (200, 201),
                    who: Caller = OPEN, **kw: Any) -> Reply:
        """One call to `node`, as `who` (a session's owner: what a move makes on the destination
        is the owner's, tenancy.py)."""
        r = await self.client.call(node.up, method, path, who=who, admin=admin, **kw)
        if r.status not in ok:
            raise _MoveFailed(f"{method} {path} on {node.name} answered {r.status}: {r.text[:300]}",
                              busy=r.status == 409 and "session_busy" in r.text)
        return r

    async def move(self, sid: str, to: str | None = None, src: Node | None = None) -> dict[str, Any]:
        src = src or await self.owner(sid)
        if src.up.kind != "hearth":
            raise BadRequest(f"{src.name} is not a Hearth node: its sessions have no KV to move", param="session_id")
        started = time.monotonic()
        who = owner_caller(await self.store.owner_of("session", sid), self.pool.settings.tenants)
        try:
            info = (await self._call(src, "GET", f"/v1/sessions/{sid}", who=who)).obj
        except _MoveFailed as e:
            raise NotFound(f"session {sid} is not on {src.name}: {e}", code="session_not_found") from e
        dst = self.destination(src, info.get("model", ""), to)
        if not await self.store.begin_move(sid, src.name, dst.name):
            raise Conflict(f"session {sid} is being moved already", code="move_in_progress")
        try:
            return await self._move(sid, src, dst, info, started, who)
        finally:
            await self.store.end_move(sid)

    async def _move(self, sid: str, src: Node, dst: Node, info: dict[str, Any], started: float,
                    who: Caller) -> dict[str, Any]:
        deadline = time.monotonic() + BUSY_WAIT
        delay = 0.05
        while True:
            try:
                snap = (await self._call(src, "POST", f"/v1/sessions/{sid}/save", json={}, who=who)
                        ).obj["snapshot_id"]
                break
            except _MoveFailed as e:
                if not e.busy or time.monotonic() > deadline:
                    self.metrics.migrations.labels("failed").inc()
                    raise Conflict(f"could not save session {sid} on {src.name}: {e}", code="move_failed") from e
                await asyncio.sleep(delay)  # the session's turn is still running
                delay = min(1.0, delay * 2)
        await self.store.move_saved(sid, snap)
        try:
            async with self.client.archive(src.up, snap, who) as archive:
                if archive.status_code != 200:
                    raise _MoveFailed(f"archive answered {archive.status_code}")
                await self._call(dst, "POST", "/v1/snapshots/import", content=archive.aiter_raw(), ok=(201, 409),
                                 who=who)
            await self._call(dst, "POST", f"/v1/snapshots/{snap}/load", json={"session_id": sid, "force": True},
                             admin=True, who=who)  # force replaces a session: an admin operation on a node
        except (_MoveFailed, httpx.HTTPError) as e:
            self.metrics.migrations.labels("failed").inc()
            await self._call(src, "DELETE", f"/v1/snapshots/{snap}", admin=True, ok=(200, 404), who=who)
            raise Conflict(f"could not move session {sid} from {src.name} to {dst.name}: {e}",
                           code="move_failed") from e
        await self.store.move_assigned(sid, dst.name)
        await self._delete(sid, [(src, f"/v1/sessions/{sid}"), (src, f"/v1/snapshots/{snap}"),
                                 (dst, f"/v1/snapshots/{snap}")], who)
        seconds = time.monotonic() - started
        self.metrics.migrations.labels("ok").inc()
        self.metrics.migration_seconds.observe(seconds)
        log.info("moved session %s from %s to %s in %.2f s", sid, src.name, dst.name, seconds)
        return {"session_id": sid, "from": src.name, "to": dst.name, "seconds": round(seconds, 3),
                "tokens": info.get("current_pos")}

    async def _delete(self, sid: str, copies: list[tuple[Node | None, str]], who: Caller = OPEN) -> None:
        for node, path in copies:
            if node is None:
                continue
            try:
                await self._call(node, "DELETE", path, admin=True, ok=(200, 404), who=who)
            except (_MoveFailed, httpx.HTTPError) as e:  # the move stands; a leftover copy is only garbage
                log.warning("after moving session %s: %s", sid, e)

    async def settle(self, move: Move) -> str:
        """A move its gateway left half done (it died): finished when the session was already
        reassigned (the source's copy and the snapshots deleted), else rolled back (the session
        stays on its source; what reached the destination is deleted). "finished" or "rolled_back"."""
        src, dst, sid = self.pool.nodes.get(move.src), self.pool.nodes.get(move.dst), move.session_id
        snap = [(src, f"/v1/snapshots/{move.snapshot}"), (dst, f"/v1/snapshots/{move.snapshot}")] \
            if move.snapshot else []
        if move.state == "assigned":
            outcome, copies = "finished", [(src, f"/v1/sessions/{sid}"), *snap]
        else:
            outcome, copies = "rolled_back", snap
            if move.snapshot and await self.store.node_of(key_of("session", sid)) != move.dst:
                copies.append((dst, f"/v1/sessions/{sid}"))  # loaded there, maybe, before its gateway died
        who = owner_caller(await self.store.owner_of("session", sid), self.pool.settings.tenants)
        await self._delete(sid, copies, who)
        await self.store.end_move(sid)
        self.metrics.migrations.labels(outcome).inc()
        log.warning("the move of session %s from %s to %s, left %s by a gateway that is gone, was %s", sid,
                    move.src, move.dst, move.state, outcome.replace("_", " "))
        return outcome

    async def drain(self, name: str) -> dict[str, Any]:
        """Stop routing to the node (every gateway on the store) and move every session it holds
        to other nodes. Recorded `running` while it moves them: a survivor continues a drain
        whose gateway died (leases.py)."""
        node = self._node(name)
        node.draining = True
        await self.store.set_drain(name, "running")
        try:
            return await self._drain(name, node)
        finally:
            if name in await self.store.drains():  # not undrained meanwhile
                await self.store.set_drain(name, "drained")

    async def _drain(self, name: str, node: Node) -> dict[str, Any]:
        sids = set(value_of(s) for s in await self.store.keys_on(name))
        moved, failed, stale = [], [], []
        if node.up.kind == "hearth":
            r = await self._call(node, "GET", "/v1/sessions")
            for sid in {s["session_id"] for s in r.obj.get("data", []) if isinstance(s, dict)} - sids:
                owner = await self.store.node_of(key_of("session", sid))
                if owner is None or owner == name:
                    sids.add(sid)
                    continue
                # The session moved on while this node was down (it crashed, and came back with its
                # data dir): this copy is older than the one on `owner`, and moving it there would
                # overwrite the newer one. It is dropped, as a move drops its source.
                try:
                    await self._call(node, "DELETE", f"/v1/sessions/{sid}", admin=True, ok=(200, 404))
                    stale.append(sid)
                except (_MoveFailed, httpx.HTTPError) as e:
                    failed.append({"session_id": sid, "error": f"a stale copy (the session lives on {owner}): {e}"})
        for sid in sorted(sids):
            try:
                moved.append(await self.move(sid, src=node))
            except (Conflict, NotFound, BadRequest, Unavailable, _MoveFailed, httpx.HTTPError) as e:
                failed.append({"session_id": sid, "error": str(e)})
        return {"node": name, "draining": True, "moved": moved, "failed": failed, "stale": sorted(stale)}

    async def undrain(self, name: str) -> dict[str, Any]:
        node = self._node(name)
        node.draining = False
        await self.store.set_drain(name, None)
        return {"node": name, "draining": False}


class _MoveFailed(Exception):
    def __init__(self, message: str, busy: bool = False) -> None:
        super().__init__(message)
        self.busy = busy
