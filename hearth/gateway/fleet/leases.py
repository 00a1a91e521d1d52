"""A gateway among others on one store: every `interval` seconds it renews its lease (the
`gateways` table: a lease unrenewed for `--lease-ttl` seconds is a gateway that is gone), takes
up the drains recorded by any of them (a drained node is out of routing for all), and does the
work the gone ones left: their background runs failed (`server_restarted`), their moves settled
(finished or rolled back, `Mover.settle`), their drains continued. A claim is a compare-and-set
on the row's gateway, so one survivor takes each. On SQLite (one gateway) the same loop settles
what the previous process left when it was killed.

A database that is away is logged and tried again at the next beat; what is per process (load,
health, digests) needs none of this."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any

from hearth.errors import HearthError
from hearth.gateway.fleet.moves import Mover

log = logging.getLogger("hearth.gateway")


class Leases:
    def __init__(self, mover: Mover, interval: float) -> None:
        self.mover = mover
        self.store = mover.store  # the one the mover writes its moves to
        self.interval = interval
        self._task: asyncio.Task[None] | None = None
        self._work: set[asyncio.Task[object]] = set()

    async def beat(self) -> None:
        store, pool = self.store, self.mover.pool
        await store.renew_gateway()
        if n := await store.fail_orphans():
            log.warning("%d background responses of a gateway that is gone were failed", n)
        drains = await store.drains()
        for name, node in pool.nodes.items():
            node.draining = name in drains
        live = await store.live_gateways()
        for move in await store.moves():
            if move.gateway not in live and await store.claim_move(move):
                self._spawn(self.mover.settle(move))  # calls to nodes: not in the beat
        for name, (state, gateway) in drains.items():
            if state == "running" and gateway not in live and name in pool.nodes \
                    and await store.claim_drain(name, gateway):
                log.warning("continuing the drain of %s, left by a gateway that is gone", name)
                self._spawn(self._drain(name))

    async def _drain(self, name: str) -> None:
        try:
            report = await self.mover.drain(name)
        except Exception:
            log.exception("the drain of %s, continued, failed", name)
            return
        log.warning("drain of %s continued: %d sessions moved, %d failed %s", name, len(report["moved"]),
                    len(report["failed"]), report["failed"] or "")

    def _spawn(self, work: Coroutine[Any, Any, object]) -> None:
        task = asyncio.create_task(work)
        self._work.add(task)
        task.add_done_callback(self._work.discard)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.beat()
            except HearthError as e:
                log.warning("gateway lease not renewed: %s", e)
            except Exception:  # the loop must outlive any one beat
                log.exception("gateway lease beat failed")

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="gateway leases")

    async def stop(self) -> None:
        for task in [self._task, *self._work]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
