"""What a decode step costs, measured: seconds in `llama_decode` by the number of tokens in the
batch, one running estimate per batch size.

Speculation pays when the tokens a draft is expected to add beat what its rows cost (see
`speculate.plan`). That cost is a property of the machine, the model and the llama.cpp build,
and it is not a line: on 2 AVX2 cores with Qwen2.5-Coder-0.5B Q4_K_M (at ~1,500 tokens of
context) one token takes 21.6 ms, two 50.5 ms, three 74 ms, four 66 ms, eight 94 ms and sixteen
175 ms (measured idle; why two rows cost more than four was not traced: llama.cpp's CPU matrix
kernels favour some row counts). A line fitted through such points says a one-token draft pays
when it costs 2.3 steps. So each batch size keeps its own estimate, learnt from the decode-only steps
that had that size (a step holding a prompt chunk is not a point).

A size never measured is estimated from the measured ones: between two measured sizes, on the
straight line joining them; past the largest, on from it with the smaller of the prior line's
slope (t(b) ∝ ratio + b through the smallest measured size; `ratio`: the decode step's fixed
cost over one more token's, the configured prior) and the slope measured into the largest.
With nothing measured, the prior line itself in units of a one-token step. A wrong guess is
corrected the first time the planner tries that size, and the planner tries a size only when
the guess says it pays: exploration costs a few steps per engine, not per request.

Invariants: the estimates are for relative use (the planner compares sizes), never a deadline;
a point far slower than its size's estimate (the machine was busy elsewhere) is skipped, unless
three come in a row (then the estimate was wrong and must learn); an estimate falls quickly and
rises slowly, so load spikes do not make a size look dear for long, while a growing context
still raises it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(slots=True)
class StepCost:
    clock: Callable[[], float] = field(default=time.perf_counter)
    ratio: float = 1.0  # the prior line's fixed / per-token cost, for sizes never measured
    fall: float = 0.5  # weight of a point below its size's estimate
    rise: float = 0.1  # weight of a point above it
    outlier: float = 3.0  # a point this many times its size's estimate is skipped (twice in a row at most)
    means: dict[int, float] = field(default_factory=dict)
    skipped: dict[int, int] = field(default_factory=dict)  # outliers skipped in a row, per size

    def observe(self, tokens: int, seconds: float) -> None:
        """One decode-only step: `tokens` rows in the batch took `seconds`."""
        if tokens <= 0 or seconds <= 0:
            return
        est = self.means.get(tokens)
        if est is None:
            guess = self.seconds(tokens) if self.means else None
            if guess is not None and seconds > self.outlier * guess and self.skipped.get(tokens, 0) < 2:
                self.skipped[tokens] = self.skipped.get(tokens, 0) + 1
                return
            self.means[tokens] = seconds
        elif seconds > self.outlier * est and self.skipped.get(tokens, 0) < 2:
            self.skipped[tokens] = self.skipped.get(tokens, 0) + 1
            return
        else:
            w = self.fall if seconds < est else self.rise
            self.means[tokens] = est + w * (seconds - est)
        self.skipped[tokens] = 0

    def seconds(self, tokens: int) -> float:
        """The estimated time of a decode-only step of `tokens` rows (units of a one-token step
        while nothing is measured)."""
        got = self.means.get(tokens)
        if got is not None:
            return got
        if not self.means:
            return (self.ratio + tokens) / (self.ratio + 1)
        sizes = sorted(self.means)
        low, high = sizes[0], sizes[-1]
        if tokens < low:
            return self.means[low] * (self.ratio + tokens) / (self.ratio + low)
        if tokens < high:
            above = next(b for b in sizes if b > tokens)
            below = max(b for b in sizes if b < tokens)
            lo, hi = self.means[below], self.means[above]
            return lo + (hi - lo) * (tokens - below) / (above - below)
        # Past the largest measured size: on from it with the smaller of two slopes, the prior
        # line's through the smallest measured size (the one measured most: plain steps) and
        # the measured one into the largest. Optimistic on purpose: a size that looks cheap is
        # tried, and then known; a pessimistic guess would never be corrected.
        slope = self.means[low] / (self.ratio + low)
        if len(sizes) > 1:
            prev = sizes[-2]
            slope = min(slope, (self.means[high] - self.means[prev]) / (high - prev))
        return self.means[high] + max(0.0, slope) * (tokens - high)

    def measured(self) -> dict[int, float]:
        """The measured estimates by batch size (for tests)."""
        return dict(sorted(self.means.items()))
