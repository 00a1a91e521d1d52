"""Admission control: at most `slots` sequences run; a bounded queue of requests waits.

Which waiting request takes a freed slot is `FairShare.pick` (hearth/engine/fair_share.py):
its class first, then the tenant with the least work served per weight, FCFS within a
tenant. A request that does not fit the free slots (n > 1) holds the line, as before, so it
is never starved by smaller ones behind it.

Preemption: a waiting request is let through with no slot free when it would fit the slots
beside the admitted sequences of its class and above, or when another tenant of its class or
below has at least two more admitted than its own tenant (fair shares of the slots); the
engine pauses one of those at its next step boundary (hearth/engine/preempt.py) and resumes
it when slots free again. A
paused request keeps its place here (it still counts in `in_use`), so nothing admitted later
of its class or below takes its slot back before it resumes.

Sits in front of the engine on the asyncio side, so a request that cannot be served is
refused (429 with Retry-After) before its response starts, and a waiting request whose
client leaves is dropped from the queue at once (its task is cancelled).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

from hearth.engine.fair_share import FairShare, Priority, slot_share_room
from hearth.errors import TooManyRequests, Unavailable


@dataclass(frozen=True, slots=True)
class Claim:
    """Whose request asks for slots, and in which class (the API layer resolves both)."""

    tenant: str = ""
    weight: float = 1.0
    priority: Priority = Priority.DEFAULT


ANON = Claim()


@dataclass(eq=False, slots=True)
class _Waiter:
    n: int
    future: asyncio.Future[None]
    tenant: str
    weight: float
    priority: Priority
    seq: int
    since: float = field(default_factory=time.monotonic)


class AdmissionQueue:
    def __init__(self, slots: int, max_waiting: int = 64, max_wait: float = 60.0,
                 fair: FairShare | None = None) -> None:
        self.slots = slots
        self.max_waiting = max_waiting
        self.max_wait = max_wait
        self.in_use = 0
        self.fair = fair if fair is not None else FairShare()
        self._waiters: deque[_Waiter] = deque()
        self._closed: str | None = None
        self._seq = 0
        self._running: dict[Priority, int] = {}  # sequences admitted, per class
        self._tenants: dict[tuple[str, Priority], int] = {}  # sequences admitted, per tenant and class

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def close(self, reason: str = "the server is shutting down") -> None:
        """Refuse new requests and fail every waiting one with 503."""
        self._closed = reason
        while self._waiters:
            w = self._waiters.popleft()
            self.fair.leave(w, False, w.since)
            if not w.future.done():
                w.future.set_exception(Unavailable(reason, code="shutting_down"))

    def by_class(self) -> dict[Priority, int]:
        """Requests waiting now, per class."""
        out: dict[Priority, int] = {}
        for w in self._waiters:
            out[w.priority] = out.get(w.priority, 0) + 1
        return out

    async def acquire(self, n: int = 1, max_wait: float | None = None, claim: Claim = ANON) -> float:
        """Take `n` slots, waiting in line if needed (at most `max_wait`, or the queue's own
        limit if smaller); return the seconds spent waiting. Pair with `release(n, claim)`."""
        if self._closed:
            raise Unavailable(self._closed, code="shutting_down")
        wait = self.max_wait if max_wait is None else min(self.max_wait, max_wait)
        self._seq += 1
        waiter = _Waiter(n, asyncio.get_running_loop().create_future(), claim.tenant, claim.weight,
                         claim.priority, self._seq)
        if not self._waiters and self._fits(waiter):
            self.fair.enter(waiter)
            self._take(waiter)
            return 0.0
        if len(self._waiters) >= self.max_waiting:
            raise TooManyRequests(f"the server is busy: {self.in_use} sequences running and "
                                  f"{len(self._waiters)} requests waiting; retry later",
                                  retry_after=self._retry_after(), code="queue_full")
        self._waiters.append(waiter)
        self.fair.enter(waiter)
        self._grant()  # a higher class than some running work may go at once (preemption)
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

    def release(self, n: int = 1, claim: Claim = ANON) -> None:
        self.in_use -= n
        assert self.in_use >= 0, "released more slots than were taken"
        self._running[claim.priority] = self._running.get(claim.priority, 0) - n
        self._tenants[claim.tenant, claim.priority] = self._tenants.get((claim.tenant, claim.priority), 0) - n
        self.fair.release(claim.tenant)
        self._grant()

    def _drop(self, waiter: _Waiter) -> None:
        if waiter in self._waiters:
            self._waiters.remove(waiter)
            self.fair.leave(waiter, False, waiter.since)
            self._grant()  # a large request at the head may have been blocking smaller ones
        elif waiter.future.done():  # granted in the same instant it gave up: hand the slots back
            self.release(waiter.n, Claim(waiter.tenant, waiter.weight, waiter.priority))

    def _grant(self) -> None:
        while (w := self.fair.pick(self._waiters)) is not None and self._fits(w):
            self._waiters.remove(w)
            self._take(w)
            w.future.set_result(None)

    def _fits(self, w: _Waiter) -> bool:
        """Free slots for it, or room for it among the slots once every admitted sequence of a
        lower class is paused."""
        if self.in_use + w.n <= self.slots:
            return True
        if sum(n for c, n in self._running.items() if c >= w.priority) + w.n <= self.slots:
            return True
        # Fair shares of the slots within a class (fair_share.slot_share_room): the engine
        # pauses one of the other tenant's (hearth/engine/preempt.py, `victim`).
        if w.n != 1:
            return False
        mine = sum(n for (t, _), n in self._tenants.items() if t == w.tenant)
        per: dict[str, int] = {}
        for (t, c), n in self._tenants.items():
            if c <= w.priority and t != w.tenant:
                per[t] = per.get(t, 0) + n
        return self.in_use + w.n - self.slots <= sum(slot_share_room(mine, n) for n in per.values())

    def _take(self, w: _Waiter) -> None:
        self.fair.leave(w, True, w.since)
        self.in_use += w.n
        self._running[w.priority] = self._running.get(w.priority, 0) + w.n
        self._tenants[w.tenant, w.priority] = self._tenants.get((w.tenant, w.priority), 0) + w.n

    def _retry_after(self) -> int:
        return max(1, min(60, 1 + len(self._waiters) // max(1, self.slots)))
