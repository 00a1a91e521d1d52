"""Is a node alive, and may it take requests? Two separate signals, neither of them load:

- **Liveness**: a cheap `/health` probe every few seconds. `FALL` failed probes in a row mark a
  node down, `RISE` good ones bring it back (hysteresis: one slow probe does not flap it). A
  node deep in a long prefill still answers /health (its HTTP loop is not the engine thread),
  so busy is never dead. Engines that serialise every request (a probe waits behind the running
  generation) are given `BUSY_GRACE` seconds since their last sign of life while they have
  requests of ours in flight: a probe timeout then is inconclusive, not a failure.
- **Breaker** (passive, from real requests): `FAILURES` failures in a row open it for
  `COOLDOWN` seconds; then one trial request is let through (half-open) and its outcome closes
  or reopens it. A failure is a connect error, a 5xx, or a stream broken mid-way (recorded when
  the stream ends); 4xx and 429 are the client's or the node's load, never failures.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

FALL = 3
RISE = 2
BUSY_GRACE = 30.0  # seconds a node with requests in flight may go without answering a probe
FAILURES = 3
COOLDOWN = 10.0

BreakerState = Literal["closed", "open", "half_open"]


@dataclass(slots=True)
class Liveness:
    up: bool = False
    seen: bool = False  # a node's first good probe brings it up at once
    streak: int = 0  # consecutive probe results disagreeing with `up`
    transitions: int = 0
    last_error: str | None = None

    def probed(self, ok: bool, error: str | None = None) -> bool:
        """Record a probe; True if the node changed state."""
        self.last_error = None if ok else error
        if ok == self.up:
            self.streak = 0
            return False
        self.streak += 1
        if (ok and (not self.seen or self.streak >= RISE)) or (not ok and self.streak >= FALL):
            self.up, self.streak, self.seen = ok, 0, True
            self.transitions += 1
            return True
        return False


@dataclass(slots=True)
class Breaker:
    clock: Callable[[], float] = time.monotonic
    failures: int = 0
    opened_at: float | None = None
    trial: bool = False  # a half-open trial request is out
    opens: int = 0
    _cooldown: float = field(default=COOLDOWN)

    @property
    def state(self) -> BreakerState:
        if self.opened_at is None:
            return "closed"
        return "half_open" if self.clock() - self.opened_at >= self._cooldown else "open"

    def allows(self) -> bool:
        state = self.state
        return state == "closed" or (state == "half_open" and not self.trial)

    def started(self) -> None:
        if self.state == "half_open":
            self.trial = True

    def record(self, ok: bool) -> None:
        self.trial = False
        if ok:
            self.failures, self.opened_at = 0, None
            return
        self.failures += 1
        if self.opened_at is not None or self.failures >= FAILURES:
            self.opened_at = self.clock()
            self.opens += 1


def counts_as_failure(status: int) -> bool:
    """An upstream answer that says the node is unwell (429 and 4xx never do)."""
    return status >= 500
