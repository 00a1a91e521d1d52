"""What a drafted row costs, measured: the decode step's time against the tokens in its batch.

Speculation pays when a drafted token's chance of acceptance beats its cost relative to the
step it may save (see `speculate`). That cost is a property of the machine and the model (a
CPU decode is mostly compute-bound, one token costs about as much as the next; a small model
on a wide CPU or a GPU reads its weights once per step and extra rows are nearly free), so it
is measured instead of assumed: every decode-only step (no prompt chunk in the batch) adds a
point (tokens in the batch, seconds in `llama_decode`), and a decayed least-squares line
t = fixed + per_token * tokens over those points gives the ratio fixed / per_token that
`Drafter.length` needs.

Invariants: the estimate only exists once the points spread over batch sizes (drafts of
different lengths, or different numbers of decoding sequences), so plain decoding never moves
it and the configured prior is used until then; a step far slower than the line predicts (the
machine was busy elsewhere) is not a point, unless three come in a row (then the line was wrong
and must learn); the ratio is clamped to [0, max_ratio].
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(slots=True)
class StepCost:
    clock: Callable[[], float] = field(default=time.perf_counter)
    decay: float = 0.98  # weight of the past per step: the estimate follows context growth and load
    min_weight: float = 8.0  # decayed number of points before the line is trusted
    min_spread: float = 0.05  # decayed variance of the batch size (tokens²) before the slope counts
    max_ratio: float = 64.0
    outlier: float = 4.0  # a point this many times slower than the line predicts is skipped
    w: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0
    skipped: int = 0  # outliers skipped in a row

    def observe(self, tokens: int, seconds: float) -> None:
        """One decode-only step: `tokens` rows in the batch took `seconds`."""
        if tokens <= 0 or seconds <= 0:
            return
        line = self.line()
        if line is not None and self.skipped < 2 and seconds > self.outlier * (line[0] + line[1] * tokens):
            self.skipped += 1  # three such steps in a row are not a hiccup: the line was wrong
            return
        self.skipped = 0
        d = self.decay
        self.w = d * self.w + 1.0
        self.sx = d * self.sx + tokens
        self.sy = d * self.sy + seconds
        self.sxx = d * self.sxx + tokens * tokens
        self.sxy = d * self.sxy + tokens * seconds

    def line(self) -> tuple[float, float] | None:
        """(fixed, per_token) seconds, or None while the points do not yet tell them apart."""
        if self.w < self.min_weight:
            return None
        mx, my = self.sx / self.w, self.sy / self.w
        var = self.sxx / self.w - mx * mx
        if var < self.min_spread:
            return None
        slope = (self.sxy / self.w - mx * my) / var
        return my - slope * mx, slope

    def fixed_over_token(self) -> float | None:
        """The measured fixed / per-token cost of a decode step, or None (use the prior)."""
        line = self.line()
        if line is None:
            return None
        fixed, per_token = line
        if per_token <= 0:  # extra rows cost nothing measurable
            return self.max_ratio
        return min(self.max_ratio, max(0.0, fixed / per_token))
