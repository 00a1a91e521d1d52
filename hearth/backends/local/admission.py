"""Admission control: at most `slots` sequences run; a bounded FIFO of requests waits.

Sits in front of the engine on the asyncio side, so a request that cannot be served is
refused (429 with Retry-After) before its response starts, and a waiting request whose
client leaves is dropped from the queue at once (its task is cancelled).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

from hearth.errors import TooManyRequests, Unavailable


@dataclass(eq=False, slots=True)
class _Waiter:
    n: int
    future: asyncio.Future[None]
    since: float = field(default_factory=time.monotonic)


class AdmissionQueue:
    def __init__(self, slots: int, max_waiting: int = 64, max_wait: float = 60.0) -> None:
        self.slots = slots
        self.max_waiting = max_waiting
        self.max_wait = max_wait
        self.in_use = 0
        self._waiters: deque[_Waiter] = deque()
        self._closed: str | None = None

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def close(self, reason: str = "the server is shutting down") -> None:
        """Refuse new requests and fail every waiting one with 503."""
        self._closed = reason
        while self._waiters:
            w = self._waiters.popleft()
            if not w.future.done():
                w.future.set_exception(Unavailable(reason, code="shutting_down"))

    async def acquire(self, n: int = 1, max_wait: float | None = None) -> float:
        """Take `n` slots, waiting in line if needed (at most `max_wait`, or the queue's own
        limit if smaller); return the seconds spent waiting."""
        if self._closed:
            raise Unavailable(self._closed, code="shutting_down")
        wait = self.max_wait if max_wait is None else min(self.max_wait, max_wait)
        if not self._waiters and self.in_use + n <= self.slots:
            self.in_use += n
            return 0.0
        if len(self._waiters) >= self.max_waiting:
            raise TooManyRequests(f"the server is busy: {self.in_use} sequences running and "
                                  f"{len(self._waiters)} requests waiting; retry later",
                                  retry_after=self._retry_after(), code="queue_full")
        waiter = _Waiter(n, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), wait)
        except TimeoutError:
            self._drop(waiter)
            raise TooManyRequests(f"no free slot within {wait:g} s; retry later",
                                  retry_after=self._retry_after(), code="queue_timeout") from None
        except asyncio.CancelledError:
            self._drop(waiter)
            raise
        return time.monotonic() - waiter.since

    def release(self, n: int = 1) -> None:
        self.in_use -= n
        assert self.in_use >= 0, "released more slots than were taken"
        self._grant()

    def _drop(self, waiter: _Waiter) -> None:
        if waiter in self._waiters:
            self._waiters.remove(waiter)
            self._grant()  # a large request at the head may have been blocking smaller ones
        elif waiter.future.done():
            self.release(waiter.n)  # granted in the same instant it gave up: hand the slots back

    def _grant(self) -> None:
        while self._waiters and self.in_use + self._waiters[0].n <= self.slots:
            w = self._waiters.popleft()
            self.in_use += w.n
            w.future.set_result(None)

    def _retry_after(self) -> int:
        return max(1, min(60, 1 + len(self._waiters) // max(1, self.slots)))
