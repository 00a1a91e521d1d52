"""Speculative decoding without a draft model: drafts by prompt lookup (n-gram matching).

Draft source: a sequence's own tokens, i.e. everything in its KV (the prompt, which for a
session is its whole history) plus what it has generated. The longest suffix of those tokens
(at least `n_min` tokens) that also occurred earlier is found, and the tokens that followed it
there are the guess; among several occurrences of a suffix of `n_max` tokens the one whose
context agrees further back wins (in a file of look-alike functions, the function being
copied), then the most recent. Agents re-emit what they have seen (a file they read, the JSON
they were sent, the code they are editing), so those tokens are often exactly what comes next.

Verification is the engine's (`Engine._accept`): the draft rides in the sequence's batch entry
after its pending token, with logits for every position, all in the one llama_decode of the
step; the sequence's own sampler then runs on those rows in order, and the run stops at the
first sampled token that differs from the draft. The tokens emitted are the ones the sampler
would have produced one step at a time: the same sampler calls in the same order, so the same
random draws for seeded sampling, the same penalties and grammar state. What differs is only
how the logits were computed (several rows in one batch instead of one), see docs/api.md.

Cost control: speculation must never cost. Two numbers decide, per sequence and per step:
- *acceptance*, measured without paying for it: every step each sequence looks up its guess,
  drafted or not, and every token it then emits is scored against the guess (`Drafter.push`).
  p = the decayed share of guessed tokens that were right, per token (a geometric model: the
  i-th drafted token is accepted with probability p**i). A sequence whose text repeats nothing
  (chat) learns a low p from its own guesses and never drafts; a copy learns p near 1 within a
  few tokens, before its first draft;
- *cost*: the measured seconds of a decode step by batch size (`spec_cost.StepCost`; the
  prior until measured).
`plan` then picks the drafted tokens that maximise the step's expected tokens per second: with
n sequences decoding and m drafted tokens, (n + the sum of the m best p_s**i) / t(n + m), against
n / t(n) with no draft, and drafts only when that beats no draft by `margin`. With nothing
drafted a step is exactly the plain decode step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


@dataclass(slots=True, frozen=True)
class SpecConfig:
    """Prompt-lookup speculation settings (`--spec-draft` sets k_max; 0 turns it off)."""

    k_max: int = 8  # most drafted tokens per sequence per step
    n_max: int = 12  # suffix length that counts as a full match (longer context only breaks ties)
    n_min: int = 2  # shortest suffix whose earlier occurrence counts as a match
    n_context: int = 256  # how far back context is compared to choose between full matches
    # The prior of a decode step's fixed cost over one more token's (spec_cost.StepCost.ratio),
    # for batch sizes not yet measured. Large (a GPU: extra rows nearly free): drafts from the
    # start; 0 (every row costs a step): never, until a measurement says otherwise.
    fixed_over_token: float = 1.0
    measure_cost: bool = True  # False: the prior is the cost model (tests)
    prior_accept: tuple[float, float] = (1.0, 1.0)  # pseudo-counts (right, wrong): p = 0.5
    decay: float = 0.95  # weight of the past per scored guess token
    margin: float = 0.05  # a draft must promise this much more tokens per second than none

    def __post_init__(self) -> None:
        if self.k_max < 1:
            raise ValueError("speculation needs k_max >= 1")
        if not 1 <= self.n_min <= self.n_max <= self.n_context:
            raise ValueError("speculation needs 1 <= n_min <= n_max <= n_context")
        if self.fixed_over_token < 0 or not 0 < self.decay <= 1 or self.margin < 0:
            raise ValueError("speculation needs fixed_over_token >= 0, 0 < decay <= 1 and margin >= 0")


def find_draft(hist: np.ndarray, n: int, n_min: int, n_max: int, k: int, n_context: int | None = None) -> list[int]:
    """Up to `k` tokens that followed the earlier occurrence of the longest suffix of hist[:n]
    (at least n_min tokens; among those of n_max or more, the longest agreement up to
    n_context, then the most recent); [] if there is none."""
    return find_match(hist, n, n_min, n_max, k, n_context)[0]


CONTEXT_CANDIDATES = 64  # full matches whose context is compared (the most recent)


def find_match(hist: np.ndarray, n: int, n_min: int, n_max: int, k: int,
               n_context: int | None = None) -> tuple[list[int], int]:
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
    if m == n_max and ends.size > 1 and n_context is not None and n_context > m:
        # Several full matches: the one whose context agrees further back (up to n_context),
        # among the most recent CONTEXT_CANDIDATES; all at once, not token by token (a text
        # that loops has many candidates agreeing far back).
        ends = ends[-CONTEXT_CANDIDATES:]
        back = np.arange(m, min(n_context, n))  # hist[e - 1 - j] against hist[n - 1 - j]
        idx = ends[:, None] - 1 - back[None, :]
        agree = (idx >= 0) & (hist[np.maximum(idx, 0)] == hist[n - 1 - back][None, :])
        run = np.where(agree.all(axis=1), back.size, np.argmin(agree, axis=1))
        ends = ends[run == run.max()]
    e = int(ends[-1])
    return [int(t) for t in hist[e: min(e + k, n)]], m


@dataclass(slots=True)
class Drafter:
    """One sequence's lookup history, its latest guess and how often its guesses are right."""

    config: SpecConfig
    hist: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    n: int = 0
    hits: float = 0.0  # decayed counts of guessed tokens that were right / wrong
    misses: float = 0.0
    guess: list[int] = field(default_factory=list)  # what the last lookup expects next, not yet scored
    drafted: int = 0
    accepted: int = 0

    @classmethod
    def start(cls, config: SpecConfig, tokens: list[int]) -> Drafter:
        d = cls(config, hits=config.prior_accept[0], misses=config.prior_accept[1])
        d.hist = np.zeros(max(64, 2 * len(tokens)), dtype=np.int32)
        d.hist[: len(tokens)] = tokens
        d.n = len(tokens)
        return d

    @property
    def p(self) -> float:
        """The chance that a guessed token is right, given the ones before it were."""
        return self.hits / (self.hits + self.misses)

    def lookup(self) -> list[int]:
        """The guess for what follows the history (at most k_max tokens, [] if nothing
        matches); kept, so the tokens emitted next are scored against it."""
        c = self.config
        self.guess = find_match(self.hist, self.n, c.n_min, c.n_max, c.k_max, c.n_context)[0]
        return self.guess

    def push(self, token: int) -> None:
        """An emitted token: scored against the guess, then added to the history."""
        if self.guess:
            d = self.config.decay
            right = token == self.guess[0]
            self.hits = d * self.hits + right
            self.misses = d * self.misses + (not right)
            self.guess = self.guess[1:] if right else []
        if self.n == len(self.hist):
            grown = np.zeros(2 * len(self.hist), dtype=np.int32)
            grown[: self.n] = self.hist[: self.n]
            self.hist = grown
        self.hist[self.n] = token
        self.n += 1

    def observe(self, n_drafted: int, n_accepted: int) -> None:
        """How the last draft fared (counters only: `push` has scored its tokens)."""
        self.drafted += n_drafted
        self.accepted += n_accepted


def plan(offers: list[tuple[float, int]], n_decoding: int, room: int,
         step_time: Callable[[int], float], margin: float = 0.0) -> list[int]:
    """Draft lengths for one step. `offers`: per drafting sequence, its acceptance p and the
    most tokens it may draft (its guess, its limits); `n_decoding`: the sequences decoding this
    step (one token each, drafting or not); `room`: drafted tokens the step's budget allows;
    `step_time(b)`: a decode step's time with b tokens. The i-th drafted token of a sequence
    adds p**i tokens in expectation, so for each total m the best m tokens are the m largest
    such values (each sequence's a prefix of its draft); the m with the most tokens per second
    wins, if it beats no draft by `margin`."""
    values = sorted(((p ** i, s) for s, (p, cap) in enumerate(offers) for i in range(1, cap + 1)),
                    key=lambda v: -v[0])[: max(0, room)]
    best_m, best_rate = 0, n_decoding / step_time(n_decoding) * (1 + margin)
    gain = 0.0
    for m, (value, _) in enumerate(values, 1):
        gain += value
        rate = (n_decoding + gain) / step_time(n_decoding + m)
        if rate > best_rate:
            best_m, best_rate = m, rate
    lengths = [0] * len(offers)
    for _, s in values[:best_m]:
        lengths[s] += 1
    return lengths
