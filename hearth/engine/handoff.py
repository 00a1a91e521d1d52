"""Outputs from the engine thread to the event loops that wait for them.

The engine thread delivers each step's outputs one sink at a time. Handing each over with its
own `loop.call_soon_threadsafe` costs a handle, a lock and a wakeup per stream per step; here
every loop has one `Handoff` whose pending items the loop drains in one callback, scheduled
only by the first item since the last drain: one wakeup per step serves all the streams of a
step on that loop. Nothing is held back: an item's drain is scheduled (or already pending)
before `put` returns, so a token is on its way the moment the engine hands it over.

Invariants (the engine thread appends, then reads `_scheduled`; the loop clears
`_scheduled`, then drains): an item appended before the loop's last look at the deque is
drained by that drain; one appended after it finds `_scheduled` cleared and schedules the
next. Per mailbox, items arrive in the order they were put.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Mailbox(Generic[T]):
    """One consumer's items on the loop (a lighter asyncio.Queue: one waiter, no task counts)."""

    __slots__ = ("_items", "_loop", "_observe", "_waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop, observe: Callable[[T], None] | None = None) -> None:
        self._loop = loop
        self._observe = observe  # sees every item as it arrives, read or not (the usage ledger)
        self._items: deque[T] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: T) -> None:
        """Loop thread only."""
        if self._observe is not None:
            self._observe(item)
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def get(self) -> T:
        while not self._items:
            waiter = self._waiter = self._loop.create_future()
            try:
                await waiter
            finally:
                if self._waiter is waiter:
                    self._waiter = None
        return self._items.popleft()

    def __len__(self) -> int:
        return len(self._items)


class Handoff:
    """The engine thread's way onto one loop (`for_loop`)."""

    __slots__ = ("__weakref__", "_items", "_loop", "_scheduled", "wakeups")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: deque[tuple[Mailbox[object], object]] = deque()
        self._scheduled = False
        self.wakeups = 0  # drains scheduled (observable in tests)

    def put(self, box: Mailbox[T], item: T) -> None:
        """Any thread. Never blocks; raises RuntimeError only if the loop is closed."""
        self._items.append((box, item))  # type: ignore[arg-type]
        if not self._scheduled:
            self._scheduled = True
            self.wakeups += 1
            try:
                self._loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # the loop is closed: nobody is left to drain
                self._scheduled = False
                raise

    def _drain(self) -> None:
        self._scheduled = False  # before draining: see the module's invariants
        items = self._items
        while items:
            box, item = items.popleft()
            box.put(item)


_handoffs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Handoff] = weakref.WeakKeyDictionary()


def for_loop(loop: asyncio.AbstractEventLoop) -> Handoff:
    """The loop's one Handoff (made on the loop's own thread, the first time it asks)."""
    h = _handoffs.get(loop)
    if h is None:
        h = _handoffs[loop] = Handoff(loop)
    return h
