"""The registry `POST /v1/cancel` searches: client-visible ids (cancel_id, session, completion /
response / message ids) → the cancel tokens of in-flight runs. It belongs to the HTTP layer,
which opens a run per generation request and closes it when the response ends.

Invariant: `register` and the stash of an early cancel take the same lock, so a cancel that
arrives before its run is registered is never lost: it is remembered for PENDING_TTL seconds
and applied by `register`. Expired stashes are dropped whenever the registry is read, so the
pending count never includes them.

Runs are a tenant's like what they store (hearth.tenants): each run records its owner, and a
cancel with a scope (a tenant's; None is the admin's, every run) matches only that owner's runs,
and its stash only that owner's later run. The answer counts only what the caller may see.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from hearth.chat.cancel import CancelToken
from hearth.tenants import ADMIN

PENDING_TTL = 30.0


@dataclass(eq=False, slots=True)
class LiveRun:
    """One in-flight generation as the cancel endpoint sees it."""

    token: CancelToken
    cancel_id: str | None = None
    session_id: str | None = None
    ids: frozenset[str] = field(default_factory=frozenset)  # completion / response / message ids
    owner: str = ADMIN


class CancelRegistry:
    def __init__(self, clock: Callable[[], float] = time.monotonic, ttl: float = PENDING_TTL) -> None:
        self._lock = threading.Lock()
        self._runs: set[LiveRun] = set()
        self._pending: dict[tuple[str | None, str], float] = {}  # (scope, cancel_id) -> expiry
        self._clock = clock
        self._ttl = ttl

    def __len__(self) -> int:
        return len(self._runs)

    @property
    def pending(self) -> int:
        with self._lock:
            self._purge()
            return len(self._pending)

    def open(self, *, cancel_id: str | None = None, session_id: str | None = None,
             ids: Iterable[str] = (), owner: str = ADMIN) -> LiveRun:
        run = LiveRun(CancelToken(), cancel_id, session_id, frozenset(ids), owner)
        self.register(run)
        return run

    def register(self, run: LiveRun) -> None:
        with self._lock:
            self._purge()
            self._runs.add(run)
            early = run.cancel_id is not None and any(
                [self._pending.pop((scope, run.cancel_id), None) is not None for scope in (run.owner, None)])
        if early:
            run.token.cancel("cancel_call")

    def close(self, run: LiveRun) -> None:
        with self._lock:
            self._runs.discard(run)

    def cancel(self, *, cancel_id: str | None = None, session_id: str | None = None,
               ids: Iterable[str] = (), scope: str | None = None) -> int:
        """Cancel the runs named; return how many distinct runs matched.

        A cancel_id is matched alone (a stale session_id beside it must not cancel a newer run
        of that session); if no run has it yet, it is stashed for a run that registers later.
        Naming nothing is the caller's error to reject: this never cancels everything."""
        wanted = frozenset(ids)
        with self._lock:
            self._purge()
            runs = [r for r in self._runs if scope is None or r.owner == scope]
            if cancel_id is not None:
                matches = [r for r in runs if r.cancel_id == cancel_id]
                if not matches:
                    self._pending[(scope, cancel_id)] = self._clock() + self._ttl
            elif session_id is None and not wanted:
                matches = []
            else:
                matches = [r for r in runs
                           if (session_id is not None and r.session_id == session_id) or (r.ids & wanted)]
        for r in matches:
            r.token.cancel("cancel_call")
        return len(matches)

    def _purge(self) -> None:
        now = self._clock()
        for cid in [c for c, exp in self._pending.items() if exp <= now]:
            del self._pending[cid]
