"""Speculative decoding without a draft model: drafts by prompt lookup (n-gram matching).

Draft source: a sequence's own tokens, i.e. everything in its KV (the prompt, which for a
session is its whole history) plus what it has generated. The longest suffix of those tokens
(at most `n_max`, at least `n_min` tokens) that also occurred earlier is found, most recent
occurrence first, and the tokens that followed it there are the draft. Agents re-emit what
they have seen (a file they read, the JSON they were sent, the code they are editing), so
those tokens are often exactly what comes next.

Verification is the engine's (`Engine._accept`): the draft rides in the sequence's batch entry
after its pending token, with logits for every position, all in the one llama_decode of the
step; the sequence's own sampler then runs on those rows in order, and the run stops at the
first sampled token that differs from the draft. The tokens emitted are the ones the sampler
would have produced one step at a time: the same sampler calls in the same order, so the same
random draws for seeded sampling, the same penalties and grammar state. What differs is only
how the logits were computed (several rows in one batch instead of one), see docs/api.md.

Cost control. On a CPU a decode is compute-bound: each token in the batch costs about as much
as the next (measured here, SmolLM2-135M Q4_1 on 2 AVX2 cores: ~4.5 ms of a one-token step is
fixed, ~10 ms more per token, single-threaded CPU time), so a drafted token only pays if it is
likely to be accepted. A drafted token at depth i is accepted with probability p**i (p: the
sequence's recent per-token acceptance, a decayed count with a prior of 0.8); it is worth its
cost while p**i exceeds what it costs relative to the step it may save, c / (c + f / n) with
n sequences decoding (the fixed part f is shared by all of them, so with more streams a draft
must be surer). f / c is measured while the engine runs (spec_cost.StepCost: decode time against
batch size), the configured value is only the prior until the measurement exists.
The draft length is the deepest such i, at most `k_max` and what the sequence
may still grow; a sequence whose drafts keep missing at their first token looks up less and
less often. With nothing to draft a step is exactly the plain decode step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass(slots=True, frozen=True)
class SpecConfig:
    """Prompt-lookup speculation settings (`--spec-draft` sets k_max; 0 turns it off)."""

    k_max: int = 8  # most drafted tokens per sequence per step
    n_max: int = 12  # longest suffix matched
    n_min: int = 2  # shortest suffix whose earlier occurrence counts as a match
    max_backoff: int = 16  # a missing sequence looks up at least every this many steps
    # While drafting does not pay (p below the bar), only a match this long is probed (one
    # token): short matches ("of the") are common in any text and usually wrong.
    probe_match: int = 6
    # A decode step's fixed cost over one more token's (f / c above). Large (a GPU, where extra
    # tokens are nearly free): always draft k_max; 0 (every token costs the same): never pays.
    # The prior: with `measure_cost` the engine's measured ratio (spec_cost.StepCost) replaces it
    # as soon as it exists.
    fixed_over_token: float = 0.45
    measure_cost: bool = True
    prior_accept: tuple[float, float] = (4.0, 1.0)  # pseudo-counts (accepted, rejected): p = 0.8
    decay: float = 0.9  # weight of the past per verified draft

    def __post_init__(self) -> None:
        if self.k_max < 1:
            raise ValueError("speculation needs k_max >= 1")
        if not 1 <= self.n_min <= self.n_max:
            raise ValueError("speculation needs 1 <= n_min <= n_max")
        if self.fixed_over_token < 0 or not 0 < self.decay <= 1:
            raise ValueError("speculation needs fixed_over_token >= 0 and 0 < decay <= 1")

    def worth(self, n_decoding: int, fixed_over_token: float | None = None) -> float:
        """The acceptance probability a drafted token needs to pay for itself (with the
        measured cost ratio if given, else the configured one)."""
        ratio = self.fixed_over_token if fixed_over_token is None else fixed_over_token
        return 1.0 / (1.0 + ratio / max(1, n_decoding))


def find_draft(hist: np.ndarray, n: int, n_min: int, n_max: int, k: int) -> list[int]:
    """Up to `k` tokens that followed the most recent earlier occurrence of the longest suffix
    of hist[:n] (between n_min and n_max tokens long); [] if there is none."""
    return find_match(hist, n, n_min, n_max, k)[0]


def find_match(hist: np.ndarray, n: int, n_min: int, n_max: int, k: int) -> tuple[list[int], int]:
    """`find_draft`'s draft and the length of the suffix it matched (0: none)."""
    if n < n_min + 1 or k <= 0:
        return [], 0
    # `ends`: positions e (e < n) such that hist[e - m:e] equals the last m tokens, m growing.
    ends = np.flatnonzero(hist[: n - 1] == hist[n - 1]) + 1
    m = 1
    while m < n_max and ends.size:
        ok = ends[ends > m]
        ok = ok[hist[ok - 1 - m] == hist[n - 1 - m]]
        if not ok.size:
            break
        ends, m = ok, m + 1
    if m < n_min or not ends.size:
        return [], 0
    e = int(ends[-1])
    return [int(t) for t in hist[e: min(e + k, n)]], m


@dataclass(slots=True)
class Drafter:
    """One sequence's lookup history and its estimate of how often its drafts are right."""

    config: SpecConfig
    hist: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    n: int = 0
    hits: float = 0.0  # decayed counts of drafted tokens accepted / drafts cut short
    misses: float = 0.0
    first_misses: int = 0  # drafts rejected at their first token, in a row
    wait: int = 0  # steps to skip before looking up again
    drafted: int = 0
    accepted: int = 0

    @classmethod
    def start(cls, config: SpecConfig, tokens: list[int]) -> Drafter:
        d = cls(config, hits=config.prior_accept[0], misses=config.prior_accept[1])
        d.hist = np.zeros(max(64, 2 * len(tokens)), dtype=np.int32)
        d.hist[: len(tokens)] = tokens
        d.n = len(tokens)
        return d

    def push(self, token: int) -> None:
        if self.n == len(self.hist):
            grown = np.zeros(2 * len(self.hist), dtype=np.int32)
            grown[: self.n] = self.hist[: self.n]
            self.hist = grown
        self.hist[self.n] = token
        self.n += 1

    @property
    def p(self) -> float:
        return self.hits / (self.hits + self.misses)

    def length(self, n_decoding: int, fixed_over_token: float | None = None) -> int:
        """How many tokens are worth drafting now: the deepest i with p**i above the bar, or 0
        when not even the first is (then only a long match is probed, one token)."""
        p, bar = self.p, self.config.worth(n_decoding, fixed_over_token)
        if p <= bar:
            return 0
        if p >= 1.0:
            return self.config.k_max
        return max(1, min(self.config.k_max, int(math.log(bar) / math.log(p))))

    def propose(self, limit: int, n_decoding: int = 1, fixed_over_token: float | None = None) -> list[int]:
        """A draft of at most min(length, limit) tokens to follow the history, or []."""
        if self.wait > 0:
            self.wait -= 1
            return []
        c = self.config
        k = self.length(n_decoding, fixed_over_token)
        draft, matched = find_match(self.hist, self.n, c.n_min, c.n_max, min(max(k, 1), limit))
        # A probe explores (p may recover), unless a drafted row costs nearly a whole step: then
        # no acceptance rate pays for it.
        if k == 0 and (matched < c.probe_match or c.worth(n_decoding, fixed_over_token) > 0.95):
            return []
        return draft

    def observe(self, n_drafted: int, n_accepted: int) -> None:
        """How the last draft fared: per-token acceptance, and rarer lookups while drafts
        miss at their first token."""
        if n_drafted == 0:
            return
        self.drafted += n_drafted
        self.accepted += n_accepted
        d = self.config.decay
        self.hits = d * self.hits + n_accepted
        self.misses = d * self.misses + (n_accepted < n_drafted)
        if n_accepted == 0:
            self.first_misses += 1
            self.wait = min(1 << (self.first_misses - 1), self.config.max_backoff) if self.first_misses > 1 else 0
        else:
            self.first_misses = 0
