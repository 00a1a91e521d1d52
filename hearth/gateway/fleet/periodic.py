"""One coroutine function run every `interval` seconds in a task until stopped: the fleet's three
loops (liveness probes, digest polls, membership syncs) are this. A round that raises is logged
and the next one runs: one bad answer never ends a loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("hearth.gateway")


class Periodic:
    def __init__(self, interval: float, round: Callable[[], Awaitable[None]], what: str) -> None:
        self.interval = interval
        self.round = round
        self.what = what  # for the log line of a failed round
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """The first round runs after one interval (callers run a round themselves at start)."""
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.round()
            except Exception:
                log.exception("%s failed", self.what)
