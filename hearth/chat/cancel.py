"""Cancellation: a token per run, and the registry that `POST /v1/cancel` searches.

A `CancelToken` is set at most once, from any thread; callbacks registered on it run when it
is set (or at once, if it already is). The backend registers "abort this engine request" on
it; the registry maps client-visible ids (cancel_id, session, completion / response /
message ids) to tokens.

Invariant: `register` and the stash of an early cancel take the same lock, so a cancel that
arrives before its run is registered is never lost: it is remembered for PENDING_TTL seconds
and applied by `register`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

PENDING_TTL = 30.0


class CancelToken:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._callbacks: list[Callable[[], None]] = []

    @property
    def cancelled(self) -> bool:
        return self._reason is not None

    @property
    def reason(self) -> str | None:
        return self._reason

    def cancel(self, reason: str = "cancel_call") -> bool:
        """Set the token; True if this call set it (False if it was already set)."""
        with self._lock:
            if self._reason is not None:
                return False
            self._reason = reason
            callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb()
        return True

    def on_cancel(self, cb: Callable[[], None]) -> None:
        with self._lock:
            if self._reason is None:
                self._callbacks.append(cb)
                return
        cb()


@dataclass(eq=False, slots=True)
class Run:
    """One in-flight generation as the cancel endpoint sees it."""

    token: CancelToken
    cancel_id: str | None = None
    session_id: str | None = None
    ids: frozenset[str] = field(default_factory=frozenset)  # completion / response / message ids


class CancelRegistry:
    def __init__(self, clock: Callable[[], float] = time.monotonic, ttl: float = PENDING_TTL) -> None:
        self._lock = threading.Lock()
        self._runs: set[Run] = set()
        self._pending: dict[str, float] = {}  # cancel_id -> expiry
        self._clock = clock
        self._ttl = ttl

    def __len__(self) -> int:
        return len(self._runs)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def open(self, *, cancel_id: str | None = None, session_id: str | None = None,
             ids: Iterable[str] = ()) -> Run:
        run = Run(CancelToken(), cancel_id, session_id, frozenset(ids))
        self.register(run)
        return run

    def register(self, run: Run) -> None:
        with self._lock:
            self._purge()
            self._runs.add(run)
            early = run.cancel_id is not None and self._pending.pop(run.cancel_id, None) is not None
        if early:
            run.token.cancel("cancel_call")

    def close(self, run: Run) -> None:
        with self._lock:
            self._runs.discard(run)

    def cancel(self, *, cancel_id: str | None = None, session_id: str | None = None,
               ids: Iterable[str] = ()) -> int:
        """Cancel the runs named; return how many distinct runs matched.

        A cancel_id is matched alone (a stale session_id beside it must not cancel a newer run
        of that session); if no run has it yet, it is stashed for a run that registers later.
        Naming nothing is the caller's error to reject: this never cancels everything."""
        wanted = frozenset(ids)
        with self._lock:
            self._purge()
            if cancel_id is not None:
                matches = [r for r in self._runs if r.cancel_id == cancel_id]
                if not matches:
                    self._pending[cancel_id] = self._clock() + self._ttl
            elif session_id is None and not wanted:
                matches = []
            else:
                matches = [r for r in self._runs
                           if (session_id is not None and r.session_id == session_id) or (r.ids & wanted)]
        for r in matches:
            r.token.cancel("cancel_call")
        return len(matches)

    def _purge(self) -> None:
        now = self._clock()
        for cid in [c for c, exp in self._pending.items() if exp <= now]:
            del self._pending[cid]
