"""The fleet while it serves: nodes that join and leave at run time, and the fleet file reloaded.

- **Joining.** A node registers with `POST /admin/fleet/join` (`hearth serve --join`, node side
  in `cli/join.py`): its name, the URL the gateway reaches it at and what routing needs of it
  (`spec`: kind, models, capacity, the keys the gateway calls it with). The registration is a
  row of the store's `members` that lapses `member_ttl` seconds on; the node renews it every
  third of that. Every gateway on the same database polls `store.members()` (`sync`, every
  `interval` seconds) and brings its pool in line, so a node registered through one gateway is
  routed to by all of them.
- **Lapsing.** A member whose registration lapsed (its node stopped renewing: killed, stopped,
  cut off) is taken out of routing at once (`Node.lapsed`; its bound conversations fail over as
  a dead node's do), and removed `member_grace` seconds later: from the pool, and from the store
  by whichever gateway sees it first. A renewal within the grace brings it back as it was. A node
  that shuts down cleanly leaves (`DELETE /admin/fleet/{node}`): removed at once.
- **The fleet file**, read again on SIGHUP or `POST /admin/fleet/reload`: an invalid file is an
  error that changes nothing; added upstreams join, changed ones are updated in place, removed
  ones are drained (out of routing, their sessions moved with their KV, `Mover.drain`) and then
  removed. A file upstream and a joined node never share a name (the join is refused).

Which wall clock says a registration lapsed: each gateway's own (`expires` is unix time written
by the gateway that took the renewal), so gateways on several hosts need their clocks in sync
(NTP) to within a fraction of `member_ttl`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from hearth.errors import BadRequest, Conflict, NotFound
from hearth.gateway.fleet.moves import Mover
from hearth.gateway.fleet.periodic import Periodic
from hearth.gateway.fleet.pool import Node, Pool
from hearth.gateway.fleet.probes import Prober
from hearth.gateway.settings import GatewaySettings, Upstream, check_fleet, load_upstreams
from hearth.gateway.store.base import GatewayStore

log = logging.getLogger("hearth.gateway")

SPEC_KEYS = {"kind", "models", "max_in_flight", "api_key", "admin_key"}


def member_upstream(name: object, url: object, spec: object) -> Upstream:
    """The upstream a registration describes; ValueError says what is wrong with it. Joined
    nodes are Hearth nodes (an openai-kind engine is served through a translating layer built
    when the gateway starts: it belongs in the fleet file)."""
    if not isinstance(name, str) or not isinstance(url, str):
        raise ValueError("name and url must be strings")
    if not isinstance(spec, dict):
        raise ValueError("spec must be an object")
    unknown = set(spec) - SPEC_KEYS
    if unknown:
        raise ValueError(f"unknown spec keys {sorted(unknown)}")
    if spec.get("kind", "hearth") != "hearth":
        raise ValueError("a node that joins must be of kind hearth (openai upstreams go in the fleet file)")
    models = spec.get("models")
    if isinstance(models, list):
        models = {m: m for m in models if isinstance(m, str)}
    if not isinstance(models, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in models.items()):
        raise ValueError('models must map alias = "model id"')
    cap = spec.get("max_in_flight", 8)
    if not isinstance(cap, int) or isinstance(cap, bool):
        raise ValueError("max_in_flight must be an integer")
    keys = {k: spec.get(k) for k in ("api_key", "admin_key")}
    if not all(v is None or (isinstance(v, str) and v) for v in keys.values()):
        raise ValueError("api_key and admin_key must be non-empty strings")
    return Upstream(name=name, url=url, kind="hearth", api_key=keys["api_key"], admin_key=keys["admin_key"],
                    models=dict(models), max_in_flight=cap)


class Membership:
    def __init__(self, settings: GatewaySettings, pool: Pool, store: GatewayStore, mover: Mover, prober: Prober,
                 wall: Callable[[], float] = time.time, interval: float | None = None) -> None:
        self.settings = settings
        self.pool = pool
        self.store = store
        self.prober = prober  # a node that joins, moves or comes back is probed at once
        self.mover = mover
        self.wall = wall
        self.interval = interval or min(settings.probe_interval, settings.member_ttl / 3)
        self._periodic = Periodic(self.interval, self._sync_logged, "fleet membership sync")
        self._retiring: dict[str, asyncio.Task[None]] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._reload = asyncio.Lock()
        # one sync at a time: one that read the members before a join must not undo what the
        # join's own sync added
        self._syncing = asyncio.Lock()
        self._skipped: set[tuple[str, str]] = set()  # (name, why) already logged

    # ---- joining and leaving --------------------------------------------------------------------

    async def join(self, body: dict[str, Any]) -> dict[str, Any]:
        """Register (or renew) a node: 400 for a bad registration, 409 for a name the fleet file
        uses or a model an openai upstream serves."""
        name, url = body.get("name"), body.get("url")
        spec = {k: v for k, v in body.items() if k not in ("name", "url")}
        try:
            up = member_upstream(name, url, spec)
        except ValueError as e:
            raise BadRequest(f"invalid registration: {e}", code="invalid_member") from e
        node = self.pool.nodes.get(up.name)
        if node is not None and node.source == "file":
            raise Conflict(f"{up.name!r} is an upstream of the fleet file; a node that joins needs another name",
                           code="member_name_taken")
        others = [n.up for n in self.pool.nodes.values() if n.name != up.name]
        try:
            check_fleet([*others, up])
        except ValueError as e:
            raise Conflict(str(e), code="member_conflict") from e
        await self.store.renew_member(up.name, up.url, spec, self.settings.member_ttl)
        if node is None or node.lapsed or node.up != up:
            await self.sync()  # this gateway routes to it at once; the others within `interval`
        return {"object": "gateway.member", "name": up.name, "ttl": self.settings.member_ttl,
                "renew_every": round(self.settings.member_ttl / 3, 3)}

    async def leave(self, name: str) -> dict[str, Any]:
        node = self.pool.nodes.get(name)
        if node is not None and node.source == "file":
            raise Conflict(f"{name!r} is an upstream of the fleet file: remove it there and reload",
                           code="member_in_file")
        removed = await self.store.remove_member(name)
        if node is None and not removed:
            raise NotFound(f"no node named {name!r} joined the fleet", param="node", code="node_not_found")
        if node is not None:
            self.pool.remove(name)
            log.info("node %s left the fleet", name)
        return {"object": "gateway.member", "name": name, "removed": True}

    # ---- every gateway: the pool in line with the store -----------------------------------------

    async def sync(self) -> None:
        """Bring the pool in line with the store's members."""
        async with self._syncing:
            await self._sync()

    async def _sync(self) -> None:
        now = self.wall()
        seen: set[str] = set()
        for row in await self.store.members():
            name = row["name"]
            node = self.pool.nodes.get(name)
            if node is not None and node.source == "file":
                self._skip(name, "an upstream of this gateway's fleet file has that name")
                continue
            expires = float(row["expires"])
            if expires + self.settings.member_grace <= now:  # lapsed past the grace: gone
                await self.store.remove_member(name)
                if node is not None:
                    self.pool.remove(name)
                    log.warning("node %s removed: it has not renewed its registration for %.0f s", name,
                                now - expires)
                continue
            lapsed = expires <= now
            try:
                up = member_upstream(name, row["url"], row["spec"])
            except ValueError as e:
                self._skip(name, str(e))
                continue
            if node is None:
                if lapsed:
                    continue
                try:
                    check_fleet([*(n.up for n in self.pool.nodes.values()), up])
                except ValueError as e:
                    self._skip(name, str(e))
                    continue
                node = self.pool.add(up, source="joined")
                log.info("node %s joined the fleet at %s (%s)", name, up.url, ", ".join(up.models))
                self.spawn(self.prober.probe(node))
            elif node.up != up:
                self.pool.update(node, up)
                log.info("node %s re-joined at %s", name, up.url)
                self.spawn(self.prober.probe(node))
            seen.add(name)
            self._lapse(node, lapsed)
        for name, node in list(self.pool.nodes.items()):
            if node.source == "joined" and name not in seen:
                self.pool.remove(name)
                log.info("node %s left the fleet", name)

    def _lapse(self, node: Node, lapsed: bool) -> None:
        if node.lapsed == lapsed:
            return
        node.lapsed = lapsed
        if lapsed:
            log.warning("node %s stopped renewing its registration: no new requests go to it", node.name)
        else:
            log.info("node %s renewed its registration: routed to again", node.name)
            self.pool.wake()

    def _skip(self, name: str, why: str) -> None:
        if (name, why) not in self._skipped:
            self._skipped.add((name, why))
            log.warning("registration of %s ignored: %s", name, why)

    def spawn(self, coro: Any) -> None:
        """Run `coro` beside the requests; cancelled at `stop`."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ---- the fleet file -------------------------------------------------------------------------

    async def reload(self, translated: frozenset[str] = frozenset()) -> dict[str, Any]:
        """Read the fleet file again and apply it; BadRequest (nothing changed) for a file that
        cannot be applied. `translated`: the aliases the gateway's translating layer was built
        for (a new alias of openai upstreams needs a restart)."""
        path = self.settings.upstreams_file
        if path is None:
            raise BadRequest("the gateway was started without --upstreams FILE: there is no fleet file to reload",
                             code="no_fleet_file")
        async with self._reload:
            try:
                new = load_upstreams(path)
                names = {u.name for u in new}
                joined = [n.up for n in self.pool.nodes.values() if n.source == "joined"]
                clash = sorted(names & {u.name for u in joined})
                if clash:
                    raise ValueError(f"{clash} already joined the fleet at run time; rename them in the file")
                check_fleet([*new, *joined])
                for u in new:
                    served = [alias in translated for alias in u.models]
                    if not (all(served) if u.kind == "openai" else not any(served)):
                        raise ValueError(f"upstream {u.name}: serving an alias of openai upstreams that the "
                                         "gateway did not start with (or one of them with a Hearth node) needs "
                                         "a restart")
            except ValueError as e:
                raise BadRequest(f"fleet file not reloaded, the fleet is unchanged: {e}",
                                 code="invalid_fleet_file") from e
            return self._apply(new)

    def _apply(self, new: list[Upstream]) -> dict[str, Any]:
        current = {n.name: n for n in self.pool.nodes.values() if n.source == "file"}
        added, changed, removed = [], [], []
        for up in new:
            node = current.get(up.name)
            if node is None:
                self.spawn(self.prober.probe(self.pool.add(up)))
                added.append(up.name)
                continue
            if up.name in self._retiring:  # put back before its drain ended
                self._retiring.pop(up.name).cancel()
                node.draining = False
                changed.append(up.name)
            if node.up != up:
                self.pool.update(node, up)
                self.spawn(self.prober.probe(node))
                changed.append(up.name)
        for name in current.keys() - {u.name for u in new}:
            if name not in self._retiring:
                current[name].draining = True
                self._retiring[name] = asyncio.create_task(self._retire(name))
            removed.append(name)
        log.info("fleet file reloaded: added %s, changed %s, removed %s", added or "none",
                 sorted(set(changed)) or "none", sorted(removed) or "none")
        return {"object": "gateway.fleet_reload", "added": added, "changed": sorted(set(changed)),
                "removed": sorted(removed)}

    async def _retire(self, name: str) -> None:
        """An upstream removed from the file: its sessions moved away with their KV where it can
        still answer (the rest fail over on their next turn, from their transcripts), then out."""
        try:
            result = await self.mover.drain(name)
            log.info("upstream %s drained before removal: %d moved, %d not moved", name, len(result["moved"]),
                     len(result["failed"]))
        except Exception as e:  # a dead node cannot be drained: its sessions fail over
            log.warning("upstream %s could not be drained before removal (%s: %s)", name, type(e).__name__, e)
        finally:
            self._retiring.pop(name, None)
        self.pool.remove(name)

    # ---- lifetime -------------------------------------------------------------------------------

    async def _sync_logged(self) -> None:
        try:
            await self.sync()
        except Exception as e:  # the store unreachable for a while: the pool stays as it was
            log.warning("fleet membership: reading the members failed (%s: %s)", type(e).__name__, e)

    async def start(self) -> None:
        await self._sync_logged()
        self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()
        tasks = [*self._retiring.values(), *self._background]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
