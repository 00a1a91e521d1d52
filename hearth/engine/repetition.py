"""Loop detection: stop a sequence whose last tokens repeat one unit over and over.

The tail is a loop when it is periodic with some period p <= `max_period` (an n-gram of up
to that many tokens, a line, a block of lines) for at least `min_repeats` periods and
`min_tokens` tokens. Per token and period the tracker keeps how many consecutive recent
positions equal the token p places back, so a step costs O(max_period), not O(window).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class RepetitionSpec:
    """What counts as a loop. `enabled=False` switches detection off (a request overriding
    the server's default)."""

    enabled: bool = True
    min_repeats: int = 4  # the unit occurs this many times in a row
    max_period: int = 64  # longest unit, in tokens
    min_tokens: int = 48  # and the loop covers at least this many tokens

    def __post_init__(self) -> None:
        if not 2 <= self.min_repeats <= 1000:
            raise ValueError("min_repeats must be between 2 and 1000")
        if not 1 <= self.max_period <= 1024:
            raise ValueError("max_period must be between 1 and 1024")
        if not 1 <= self.min_tokens <= 100_000:
            raise ValueError("min_tokens must be between 1 and 100000")


@dataclass(slots=True)
class RepetitionTracker:
    spec: RepetitionSpec
    _tail: list[int] = field(default_factory=list)  # the last max_period tokens
    _runs: list[int] = field(default_factory=list)  # _runs[p-1]: positions equal to the one p back

    def __post_init__(self) -> None:
        self._runs = [0] * self.spec.max_period

    def observe(self, token: int) -> bool:
        """Feed one generated token; True once the tail is a loop."""
        tail, spec = self._tail, self.spec
        looped = False
        for p in range(1, spec.max_period + 1):
            if len(tail) >= p and tail[-p] == token:
                self._runs[p - 1] += 1
                length = self._runs[p - 1] + p  # the periodic suffix, this token included
                if length >= p * spec.min_repeats and length >= spec.min_tokens:
                    looped = True
            else:
                self._runs[p - 1] = 0
        tail.append(token)
        if len(tail) > spec.max_period:
            del tail[0]
        return looped
