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
        # closed before its totals (a disconnect) from it (api/http/usage_tap.py).
        self.generated = 0

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

    def on_cancel(self, cb: Callable[[], object]) -> None:
        with self._lock:
            if self._reason is None:
                self._callbacks.append(cb)
                return
        cb()
