"""A run's cancel token: set at most once, from any thread; callbacks registered on it run when
it is set (or at once, if it already is). The backend registers "abort this engine request" on
it; the HTTP layer sets it (disconnect, POST /v1/cancel, shutdown)."""

from __future__ import annotations

import threading
from collections.abc import Callable


class CancelToken:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._callbacks: list[Callable[[], object]] = []
        # Tokens the backend's run has generated so far: the usage ledger counts a stream
        # closed before its totals (a disconnect) from it (api/http/usage_tap.py). The local
        # backend counts them as the engine hands its outputs over, read or not; while
        # `counting`, the run is in the engine and its last output (the one that ends it, after
        # an abort) has not come yet. Both are touched on the event loop only.
        self.generated = 0
        self.counting = False
        self._settled: list[Callable[[], object]] = []

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

    def counted(self) -> None:
        """The run's last output was counted: `generated` is final."""
        self.counting = False
        callbacks, self._settled = self._settled, []
        for cb in callbacks:
            cb()

    def when_counted(self, cb: Callable[[], object]) -> None:
        """Run `cb` once `generated` is final (at once if it is)."""
        if self.counting:
            self._settled.append(cb)
        else:
            cb()

    def on_cancel(self, cb: Callable[[], object]) -> None:
        with self._lock:
            if self._reason is None:
                self._callbacks.append(cb)
                return
        cb()
