"""Speculative decoding by prompt lookup: drafts come from the sequence's own tokens, several
are verified in one decode, and the tokens emitted are exactly those of plain decoding."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from hearth.engine import Engine, EngineRequest, FinishReason, SamplingParams
from hearth.engine.fake_runner import EOS, FakeRunner
from hearth.engine.runner import BatchEntry
from hearth.engine.spec_cost import StepCost
from hearth.engine.speculate import Drafter, SpecConfig, find_draft, plan

# The engine measures a drafted row's cost by the clock; these fix it so the policy under test
# is deterministic (the measured path has its own tests with a fake clock, below).
SPEC = SpecConfig(k_max=8, measure_cost=False)
DEEP = SpecConfig(k_max=8, fixed_over_token=1e9, measure_cost=False)  # always drafts k_max: many rejections to check


def hist(tokens: list[int]) -> np.ndarray:
    return np.asarray(tokens, dtype=np.int32)


def test_find_draft_takes_what_followed_the_longest_most_recent_match() -> None:
    #        0  1  2  3  4  5  6  7  8  9 10 11
    toks = [1, 2, 3, 9, 9, 5, 2, 3, 7, 8, 0, 2, 3]
    # suffix (2, 3) occurred at 1-2 (then 9, 9, 5) and at 6-7 (then 7, 8): the most recent wins
    assert find_draft(hist(toks), len(toks), 2, 8, 3) == [7, 8, 0]
    # a longer suffix (0, 2, 3) occurred nowhere earlier, so (2, 3) it is; k caps the draft
    assert find_draft(hist(toks), len(toks), 2, 8, 1) == [7]
    # the longest match wins over a more recent shorter one: (1, 2, 3) at 0-2 beats (2, 3) at 6-7
    toks2 = [1, 2, 3, 4, 5, 2, 3, 6, 1, 2, 3]
    assert find_draft(hist(toks2), len(toks2), 2, 8, 2) == [4, 5]
    # nothing repeats: no draft; below n_min: no draft
    assert find_draft(hist([1, 2, 3, 4]), 4, 2, 8, 4) == []
    assert find_draft(hist([5, 6, 7, 6]), 4, 2, 8, 4) == []
    assert find_draft(hist([5, 6, 7, 6]), 4, 1, 8, 4) == [7, 6]
    # a draft never runs past the end of the history
    assert find_draft(hist([4, 4, 4]), 3, 2, 8, 5) == [4]


def test_a_full_match_is_chosen_by_the_context_further_back() -> None:
    # Two earlier occurrences of the last 3 tokens (n_max = 3): the older one also agrees on the
    # token before them (8), so it is the better guess even though the other is more recent.
    #        0  1  2  3  4  5  6  7  8  9 10 11 12 13
    toks = [8, 1, 2, 3, 4, 9, 1, 2, 3, 5, 0, 8, 1, 2, 3]
    assert find_draft(hist(toks), len(toks), 2, 3, 2) == [5, 0]  # context unused: most recent
    assert find_draft(hist(toks), len(toks), 2, 3, 2, n_context=16) == [4, 9]
    # context agreement never beats a longer match: (8, 1, 2, 3) is a 4-token suffix
    assert find_draft(hist(toks), len(toks), 2, 8, 2) == [4, 9]


def test_guesses_are_scored_against_what_is_emitted_drafted_or_not() -> None:
    d = Drafter.start(SPEC, [1, 2, 3, 4, 5, 1, 2])
    assert d.p == pytest.approx(0.5)  # the prior, before any guess was scored
    assert d.lookup() == [3, 4, 5, 1, 2]
    d.push(3)  # right
    d.push(4)  # right: the rest of the guess is still scored
    assert d.guess == [5, 1, 2] and d.p > 0.5
    before = d.p
    d.push(7)  # wrong: p falls and the guess is dropped until the next lookup
    assert d.guess == [] and d.p < before
    p = d.p
    d.push(9)  # nothing guessed, nothing learnt
    assert d.p == p and d.n == 11 and list(d.hist[: d.n]) == [1, 2, 3, 4, 5, 1, 2, 3, 4, 7, 9]
    assert d.lookup() == []  # (7, 9) never occurred
    # a copy: every guess right, p tends to 1 within a few tokens
    copy = Drafter.start(SPEC, [*range(40), 0, 1])
    for t in range(2, 12):
        copy.lookup()
        copy.push(t)
    assert copy.p > 0.9
    copy.observe(4, 3)  # counters only
    assert (copy.drafted, copy.accepted) == (4, 3)


# Seconds of a decode step by batch size, measured on 2 AVX2 cores with Qwen2.5-Coder-0.5B
# Q4_K_M (spec_cost.py): two or three rows cost more than four.
CPU = {1: 0.0216, 2: 0.0505, 3: 0.0744, 4: 0.0663, 5: 0.0886, 6: 0.0852, 7: 0.091, 8: 0.0937, 9: 0.104,
       10: 0.1164, 11: 0.127, 12: 0.1387}


def test_plan_drafts_what_maximises_tokens_per_second() -> None:
    cpu = CPU.__getitem__
    # a sure copy on the CPU: past the dear sizes (2, 3) to the cheapest per token
    assert plan([(0.95, 8)], 1, 100, cpu) == [7]
    assert plan([(0.99, 2)], 1, 100, cpu) == [0]  # a short guess: 2 or 3 rows never pay here
    assert plan([(0.8, 8)], 1, 100, cpu) == [0]  # chat-like acceptance: nothing
    # every row costs a whole step: nothing pays, however sure; rows nearly free: all of it
    assert plan([(0.999, 8)], 1, 100, float) == [0]
    assert plan([(0.3, 8)], 1, 100, lambda b: 1.0) == [8]
    # the margin: a draft must beat no draft by that much
    assert plan([(0.3, 1)], 1, 100, lambda b: 1.0 + 0.2 * (b - 1)) == [1]
    assert plan([(0.3, 1)], 1, 100, lambda b: 1.0 + 0.2 * (b - 1), margin=0.1) == [0]
    # several sequences: the surer one's tokens first; the room caps the total
    assert plan([(0.6, 8), (0.99, 8)], 2, 100, lambda b: 1.0 + 0.1 * b) == [1, 8]
    assert plan([(0.6, 8), (0.99, 8)], 2, 3, lambda b: 1.0 + 0.1 * b) == [0, 3]
    assert plan([], 4, 100, cpu) == []


def test_step_cost_keeps_one_estimate_per_batch_size() -> None:
    cost = StepCost(ratio=1.0)
    assert cost.seconds(1) == 1.0 and cost.seconds(3) == 2.0  # nothing measured: the prior line, in steps
    for _ in range(3):
        cost.observe(1, 0.02)
    assert cost.seconds(1) == pytest.approx(0.02)
    assert cost.seconds(9) == pytest.approx(0.1)  # the prior line through the measured size
    # two rows dearer than the prior said: past them, the prior's slope (the smaller one)
    cost.observe(2, 0.05)
    assert cost.seconds(2) == pytest.approx(0.05) and cost.seconds(4) == pytest.approx(0.07)
    cost.observe(3, 0.052)  # a third row nearly free: past it, that slope
    assert cost.seconds(5) == pytest.approx(0.056)
    cost.observe(9, 0.09)
    assert cost.seconds(6) == pytest.approx(0.052 + 0.038 * 3 / 6)  # between measured sizes: the line
    assert cost.measured() == pytest.approx({1: 0.02, 2: 0.05, 3: 0.052, 9: 0.09})
    cost.observe(9, 1.0)  # the machine was busy elsewhere: not a point ...
    cost.observe(9, 1.0)
    assert cost.seconds(9) == pytest.approx(0.09)
    cost.observe(9, 1.0)  # ... unless it happens three times in a row: then it is the cost
    assert cost.seconds(9) > 0.09
    fast = StepCost()
    fast.observe(4, 0.1)
    for _ in range(3):
        fast.observe(4, 0.05)  # falls quickly
    assert fast.seconds(4) < 0.06
    fast.observe(4, 0.1)  # rises slowly
    assert fast.seconds(4) < 0.065
    assert StepCost(ratio=1e9).seconds(8) == pytest.approx(1.0)  # extra rows free by the prior


@dataclass
class Run:
    text: dict[int, str]
    tokens: dict[int, list[int]]
    reasons: dict[int, FinishReason | None]
    logprobs: list[Any]
    engine: Engine
    runner: FakeRunner


async def generate(runner: FakeRunner, prompt: bytes, spec: SpecConfig | None, **kw: Any) -> Run:
    n = int(kw.pop("n", 1))
    eng = Engine(runner, seq_ctx=1024, spec=spec)
    if isinstance(runner, TimedRunner):  # the drafts' cost measured on the runner's fake clock
        eng.step_cost = StepCost(clock=runner.clock)
    eng.start()
    text: dict[int, str] = {}
    tokens: dict[int, list[int]] = {}
    reasons: dict[int, FinishReason | None] = {}
    logprobs: list[Any] = []
    try:
        r = EngineRequest("r", list(prompt), SamplingParams(**kw), n=n)
        async for out in eng.generate(r):
            for d in out.deltas:
                text[d.index] = text.get(d.index, "") + d.text
                tokens.setdefault(d.index, []).extend(d.token_ids)
                reasons[d.index] = d.finish_reason or reasons.get(d.index)
                logprobs.extend(d.logprobs or [])
        for slot in eng.slots.slots:  # drafted tokens the sampler rejected left the KV
            assert runner.kv.get(slot.seq_id, []) == slot.tokens
    finally:
        eng.stop()
    return Run(text, tokens, reasons, logprobs, eng, runner)


# The fake model writes SCRIPT; this prompt quotes it with changes, so lookups find drafts that
# are right for a while and then wrong ("cat", "hops"), as an edit of a quoted file would.
SCRIPT = FakeRunner.script
PROMPT = b"Copy: The quick brown cat hops over the lazy dog. The quick brown fox jumps."


@pytest.mark.parametrize("kw", [
    {"temperature": 0.0, "max_tokens": 150},
    {"temperature": 0.0, "max_tokens": 97, "stop": ["lazy dog. The q"]},
    {"temperature": 0.0, "max_tokens": 150, "stop_token_ids": [ord("j")]},
    {"temperature": 0.0, "max_tokens": 64, "logprobs": True, "top_logprobs": 2},
    {"temperature": 0.0, "max_tokens": 120, "n": 2},
])
async def test_greedy_tokens_are_those_of_plain_decoding(kw: dict[str, Any]) -> None:
    plain = await generate(FakeRunner(), PROMPT, None, **dict(kw))
    spec = await generate(FakeRunner(), PROMPT, DEEP, **dict(kw))
    assert spec.tokens == plain.tokens and spec.text == plain.text and spec.reasons == plain.reasons
    assert [(lp.token_id, lp.logprob, lp.top) for lp in spec.logprobs] == \
        [(lp.token_id, lp.logprob, lp.top) for lp in plain.logprobs]
    s = spec.engine.stats
    assert s.accepted_tokens > 0 and s.drafted_tokens > s.accepted_tokens  # drafts hit and missed
    assert s.generated_tokens == plain.engine.stats.generated_tokens
    # several drafted tokens verified in one decode: fewer decode calls for the same tokens
    assert len(spec.runner.calls) < len(plain.runner.calls)
    assert max(len(e.tokens) for call in spec.runner.calls for e in call if e.n_logits > 1) > 2


async def test_eos_inside_an_accepted_draft_ends_there() -> None:
    kw = {"temperature": 0.0, "max_tokens": 200}
    plain = await generate(FakeRunner(eos_at=150), PROMPT, None, **kw)
    spec = await generate(FakeRunner(eos_at=150), PROMPT, DEEP, **kw)
    assert spec.tokens == plain.tokens and spec.reasons[0] is FinishReason.STOP
    assert spec.tokens[0][-1] == EOS and spec.engine.stats.accepted_tokens > 0


class MostlyGreedy(FakeRunner):
    """Seeded sampling that usually agrees with the logits' argmax: a draw per token."""

    def new_sampler(self, params: SamplingParams) -> Any:
        runner = self

        class Sampler:
            rng = np.random.default_rng(params.seed)

            def sample(self, logits_index: int) -> int:
                top = int(np.argmax(runner.logits(logits_index)))
                return top if self.rng.random() < 0.85 else int(self.rng.integers(ord("a"), ord("z") + 1))

            def free(self) -> None:
                pass

        return Sampler()


async def test_seeded_sampling_tokens_are_those_of_plain_decoding() -> None:
    kw = {"temperature": 0.8, "seed": 1234, "max_tokens": 200}
    plain = await generate(MostlyGreedy(), PROMPT, None, **kw)
    spec = await generate(MostlyGreedy(), PROMPT, DEEP, **kw)
    assert spec.tokens == plain.tokens
    assert spec.engine.stats.accepted_tokens > 0


async def test_default_policy_drafts_deep_only_once_guesses_prove_right() -> None:
    plain = await generate(FakeRunner(), PROMPT, None, temperature=0.0, max_tokens=150)
    spec = await generate(FakeRunner(), PROMPT, SPEC, temperature=0.0, max_tokens=150)
    assert spec.tokens == plain.tokens
    drafts = [len(e.tokens) - 1 for call in spec.runner.calls for e in call if e.n_logits == len(e.tokens)]
    # the first guesses are scored before anything is drafted; drafts grow as they prove right
    assert drafts[:2] == [0, 0] and drafts[2] < SPEC.k_max and max(drafts) == SPEC.k_max
    assert len(spec.runner.calls) < len(plain.runner.calls) / 2


async def test_a_request_can_turn_speculation_off() -> None:
    run = await generate(FakeRunner(), PROMPT, SPEC, temperature=0.0, max_tokens=100, speculative=False)
    assert run.engine.stats.drafted_tokens == 0
    assert all(e.n_logits <= 1 for call in run.runner.calls for e in call)


async def test_drafts_stay_inside_the_token_budget_and_the_context() -> None:
    runner = FakeRunner(n_seq_max=4, n_batch=8)
    eng = Engine(runner, seq_ctx=120, spec=DEEP)
    eng.start()

    async def one(i: int) -> FinishReason | None:
        r = EngineRequest(f"r{i}", list(PROMPT[: 30 + i]), SamplingParams(temperature=0.0))
        return [o async for o in eng.generate(r)][-1].deltas[-1].finish_reason

    try:
        # three sequences grow to the end of their context, together
        assert await asyncio.gather(*(one(i) for i in range(3))) == [FinishReason.LENGTH] * 3
        assert eng.stats.accepted_tokens > 0
        assert max(e.pos0 + len(e.tokens) for call in runner.calls for e in call) <= 120
        assert all(sum(len(e.tokens) for e in call) <= 8 for call in runner.calls)
    finally:
        eng.stop()


def test_settings_refuse_an_unknown_kv_type_and_a_bad_draft_length() -> None:
    from hearth.config import Settings

    assert Settings(kv_type="q4_0", spec_draft=0).kv_type == "q4_0"
    with pytest.raises(ValueError, match="--kv-type must be one of f16, q8_0, q4_0"):
        Settings(kv_type="f32")
    with pytest.raises(ValueError, match="--spec-draft"):
        Settings(spec_draft=-1)


class FakeClock:
    """Time that moves only when a fake decode runs: `fixed + per_token * rows` seconds a step."""

    def __init__(self, fixed: float, per_token: float) -> None:
        self.now, self.fixed, self.per_token = 0.0, fixed, per_token

    def __call__(self) -> float:
        return self.now


class TimedRunner(FakeRunner):
    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock

    def decode(self, entries: list[BatchEntry]) -> list[int]:
        self.clock.now += self.clock.fixed + self.clock.per_token * sum(len(e.tokens) for e in entries)
        return super().decode(entries)


@pytest.mark.parametrize(("fixed", "per_token", "deep"), [(0.040, 0.001, True), (0.0, 0.010, False)])
async def test_engine_drafts_by_the_measured_cost(fixed: float, per_token: float, deep: bool) -> None:
    """Same greedy tokens either way; cheap rows (big fixed part) let drafts grow to k_max, rows
    that cost a whole step each stop drafting once measured."""
    clock = FakeClock(fixed, per_token)
    plain = await generate(FakeRunner(), PROMPT, None, temperature=0.0, max_tokens=150)
    spec = await generate(TimedRunner(clock), PROMPT, SpecConfig(k_max=8),
                          temperature=0.0, max_tokens=150)
    assert spec.tokens == plain.tokens
    assert spec.engine.step_cost is not None
    measured = spec.engine.step_cost.measured()
    assert measured[1] == pytest.approx(fixed + per_token)
    drafts = [len(e.tokens) - 1 for call in spec.runner.calls for e in call if e.n_logits == len(e.tokens)]
    if deep:
        assert max(drafts) == 8 and len(spec.runner.calls) < len(plain.runner.calls) / 2
    else:  # the prior tries a draft or two; once measured, not one more drafted row
        assert 0 < len(measured) - 1 <= 3
        assert sum(drafts[len(drafts) // 2:]) == 0, drafts


async def test_a_text_that_repeats_nothing_is_never_drafted() -> None:
    """Guesses are scored before anything is drafted: where they are wrong (chat), no step
    ever carries a draft, so speculation costs nothing but the lookups."""
    rng = np.random.default_rng(5)
    runner = FakeRunner(script=bytes(rng.integers(ord("a"), ord("z") + 1, 400).tolist()))
    run = await generate(runner, b"Tell me a story.", SpecConfig(k_max=8), temperature=0.0, max_tokens=300)
    plain = await generate(FakeRunner(script=runner.script), b"Tell me a story.", None,
                           temperature=0.0, max_tokens=300)
    assert run.tokens == plain.tokens
    assert run.engine.stats.drafted_tokens == 0 and len(run.runner.calls) == len(plain.runner.calls)
