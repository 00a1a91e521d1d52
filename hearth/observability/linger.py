"""A background writer that batches what its callers hand it (the usage ledger's rows).

`put` appends to a bounded queue and returns; it wakes the writer thread only when the thread
is not already awake. Once woken, the thread waits `linger` seconds for more, then hands all
that has queued (up to `batch` items a call) to `write`. So a busy server pays one thread
wakeup and one write per `linger`, not one per item: on 2 cores the ledger's per-request
wakeup and transaction (and the GIL they take) cost a one-input embeddings request ~4.5 % of
its requests/s. `flush` and `close` cut the wait short; nothing put before they return is left
unwritten. (Not for log lines: a process that dies by the signal uvicorn re-raises after its
shutdown runs no flush, and its last lines would be lost.)

Invariant (under `_cv`): items wait in the queue only while `_woken` is set or the thread is
about to look at the queue again; the thread clears `_woken` before it drains, so an item
put after the drain finds `_woken` clear and wakes it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Lingering(Generic[T]):
    def __init__(self, write: Callable[[list[T]], None], *, name: str, linger: float, batch: int = 512,
                 capacity: int = 10_000) -> None:
        self.write = write  # runs on the writer thread; must not raise (the caller counts its failures)
        self.name = name
        self.linger = linger
        self.batch = batch
        self.capacity = capacity
        self.batches = 0  # calls of `write`
        self._items: deque[T] = deque()
        self._cv = threading.Condition()
        self._woken = False
        self._hurry = False  # flush() or close(): write now, no linger
        self._closing = False
        self._writing = 0  # items taken by the thread, not yet written
        self._thread: threading.Thread | None = None

    def put(self, item: T) -> bool:
        """Queue `item`; False (and nothing queued) when `capacity` items already wait. Never
        waits for the writer."""
        if len(self._items) >= self.capacity:
            return False
        self._items.append(item)
        if not self._woken:
            with self._cv:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                    self._thread.start()
                self._woken = True
                self._cv.notify_all()
        return True

    @property
    def depth(self) -> int:
        """Items waiting for the writer (those it is writing not counted)."""
        return len(self._items)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything put so far is written; False on timeout."""
        with self._cv:
            if self._thread is None:
                return not self._items
            self._hurry = True
            self._cv.notify_all()
            return self._cv.wait_for(lambda: not self._items and not self._writing, timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Write what waits, then stop the thread (a later `put` starts a new one)."""
        thread = self._thread
        if thread is None:
            return
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        thread.join(timeout)
        with self._cv:
            self._thread = None
            self._closing = False

    def _take(self) -> tuple[list[T], bool]:
        """Wait for items (then `linger` more, unless hurried) and take up to `batch` of them;
        also whether the thread should stop (closing, and nothing left)."""
        with self._cv:
            self._cv.wait_for(lambda: self._woken or bool(self._items) or self._closing)
            if not (self._hurry or self._closing):
                self._cv.wait_for(lambda: self._hurry or self._closing, self.linger)
            self._woken = self._hurry = False
            taken = [self._items.popleft() for _ in range(min(self.batch, len(self._items)))]
            if self._items:  # more than a batch waits: round again at once
                self._woken = self._hurry = True
            self._writing = len(taken)
            return taken, self._closing and not self._items

    def _run(self) -> None:
        while True:
            taken, stop = self._take()
            if taken:
                self.write(taken)
                self.batches += 1
            with self._cv:
                self._writing = 0
                self._cv.notify_all()
            if stop:
                return
