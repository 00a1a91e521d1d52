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

Cost control: a draft is never longer than `k_max` or than the sequence may still grow, its
length adapts to the sequence's recent acceptance (longer after a full accept, shorter after a
reject), and a sequence whose drafts keep missing looks up less and less often. With nothing
to draft a step is exactly the plain decode step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(slots=True, frozen=True)
class SpecConfig:
    """Prompt-lookup speculation settings (`--spec-draft` sets k_max; 0 turns it off)."""

    k_max: int = 8  # most drafted tokens per sequence per step
    k_start: int = 4  # a new sequence's first draft length
    n_max: int = 12  # longest suffix matched
    n_min: int = 2  # shortest suffix whose earlier occurrence counts as a match
    max_backoff: int = 16  # a missing sequence looks up at least every this many steps

    def __post_init__(self) -> None:
        if self.k_max < 1 or not 1 <= self.k_start <= self.k_max:
            raise ValueError("speculation needs 1 <= k_start <= k_max")
        if not 1 <= self.n_min <= self.n_max:
            raise ValueError("speculation needs 1 <= n_min <= n_max")


def find_draft(hist: np.ndarray, n: int, n_min: int, n_max: int, k: int) -> list[int]:
    """Up to `k` tokens that followed the most recent earlier occurrence of the longest suffix
    of hist[:n] (between n_min and n_max tokens long); [] if there is none."""
    if n < n_min + 1 or k <= 0:
        return []
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
        return []
    e = int(ends[-1])
    return [int(t) for t in hist[e: min(e + k, n)]]


@dataclass(slots=True)
class Drafter:
    """One sequence's lookup history and its adaptive draft length."""

    config: SpecConfig
    hist: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    n: int = 0
    k: int = 0
    misses: int = 0  # drafts rejected at their first token, in a row
    wait: int = 0  # steps to skip before looking up again
    drafted: int = 0
    accepted: int = 0

    @classmethod
    def start(cls, config: SpecConfig, tokens: list[int]) -> Drafter:
        d = cls(config, k=config.k_start)
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

    def propose(self, limit: int) -> list[int]:
        """A draft of at most min(k, limit) tokens to follow the history, or []."""
        if self.wait > 0:
            self.wait -= 1
            return []
        c = self.config
        return find_draft(self.hist, self.n, c.n_min, c.n_max, min(self.k, limit))

    def observe(self, n_drafted: int, n_accepted: int) -> None:
        """How the last draft fared: longer drafts after a full accept, shorter after a
        reject, and rarer lookups while drafts miss at their first token."""
        if n_drafted == 0:
            return
        self.drafted += n_drafted
        self.accepted += n_accepted
        self.k = min(self.k + 2, self.config.k_max) if n_accepted == n_drafted else max(1, self.k - 1)
        if n_accepted == 0:
            self.misses += 1
            self.wait = min(1 << (self.misses - 1), self.config.max_backoff) if self.misses > 1 else 0
        else:
            self.misses = 0
