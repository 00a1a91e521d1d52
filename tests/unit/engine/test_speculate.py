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
from hearth.engine.speculate import Drafter, SpecConfig, find_draft

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


def test_drafter_drafts_deeper_as_its_drafts_prove_right_and_backs_off_while_missing() -> None:
    d = Drafter.start(SPEC, [1, 2, 3, 1, 2])
    assert d.p == pytest.approx(0.8) and d.length(1) == 1  # the prior: one token
    assert d.propose(8) == [3]
    # with 8 streams one token is not sure enough: only a long match is probed
    assert d.length(8) == 0 and d.propose(8, n_decoding=8) == []
    long = Drafter.start(SPEC, [5, 6, 7, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10])
    assert long.propose(8, n_decoding=8) == [11]
    for _ in range(6):
        d.observe(d.length(1), d.length(1))
    assert d.p > 0.95 and d.length(1) == 8
    # the bar rises with the number of sequences decoding (the step's fixed cost is shared)
    assert SPEC.worth(1) < SPEC.worth(8) < 1.0 and d.length(8) < d.length(1)
    # where extra tokens cost next to nothing, drafting always pays; where a step is all
    # per-token cost, it never does
    assert DEEP.worth(8) < 1e-6 and SpecConfig(fixed_over_token=0.0).worth(1) == 1.0
    d.observe(8, 2)
    assert d.p < 0.95 and d.length(8) == 0
    for _ in range(3):  # three misses at the first token: skip 2, then 4 lookups
        d.observe(1, 0)
    assert d.wait == 4 and d.propose(8) == [] and d.wait == 3
    d.push(7)
    assert d.n == 6 and list(d.hist[: d.n]) == [1, 2, 3, 1, 2, 7]


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


async def test_default_policy_drafts_deep_only_once_drafts_prove_right() -> None:
    plain = await generate(FakeRunner(), PROMPT, None, temperature=0.0, max_tokens=150)
    spec = await generate(FakeRunner(), PROMPT, SPEC, temperature=0.0, max_tokens=150)
    assert spec.tokens == plain.tokens
    drafts = [len(e.tokens) - 1 for call in spec.runner.calls for e in call if e.n_logits > 1]
    assert drafts[0] == 1 and max(drafts) == SPEC.k_max
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


def test_step_cost_learns_the_line_only_once_batch_sizes_spread() -> None:
    cost = StepCost(clock=FakeClock(0, 0))
    for _ in range(50):  # plain decoding: one row a step, fixed and per-token cost inseparable
        cost.observe(1, 0.022)
    assert cost.fixed_over_token() is None
    for k in (1, 3, 5, 9, 2, 1, 7, 1):  # drafts of several lengths: t = 20 ms + 2 ms a row
        cost.observe(k, 0.020 + 0.002 * k)
    cost.observe(1, 5.0)  # the machine was busy elsewhere: not a point
    assert cost.line() is not None
    assert cost.fixed_over_token() == pytest.approx(10.0, rel=0.35)
    for _ in range(150):  # steps got 5× slower for good (a bigger context, a busier machine): learnt
        cost.observe(1, 0.110)
        cost.observe(5, 0.150)
    assert cost.fixed_over_token() == pytest.approx(10.0, rel=0.35)
    assert cost.line() == pytest.approx((0.100, 0.010), rel=0.2)
    flat = StepCost()
    for k in (1, 2, 4, 8) * 4:  # extra rows free: the ratio is as high as it goes
        flat.observe(k, 0.01)
    assert flat.fixed_over_token() == flat.max_ratio
    dear = StepCost()
    for k in (1, 2, 4, 8) * 4:  # no fixed part at all: drafts never pay
        dear.observe(k, 0.01 * k)
    assert dear.fixed_over_token() == pytest.approx(0.0, abs=1e-9)


def test_the_measured_ratio_replaces_the_prior() -> None:
    d = Drafter.start(SPEC, [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4])
    assert d.length(1) == 1  # prior 0.45: one token at p = 0.8
    assert d.length(1, fixed_over_token=8.0) == SPEC.k_max  # rows nearly free: draft deep
    assert d.length(1, fixed_over_token=0.0) == 0 and d.propose(8, 1, 0.0) == []  # rows dear: none
    assert d.length(8, fixed_over_token=8.0) == 3  # shared with 8 streams: surer drafts only


@pytest.mark.parametrize(("fixed", "per_token", "deep"), [(0.040, 0.001, True), (0.0, 0.010, False)])
async def test_engine_drafts_by_the_measured_cost(fixed: float, per_token: float, deep: bool) -> None:
    """Same greedy tokens either way; cheap rows (big fixed part) let drafts grow to k_max, rows
    that cost a whole step each stop drafting once measured."""
    clock = FakeClock(fixed, per_token)
    plain = await generate(FakeRunner(), PROMPT, None, temperature=0.0, max_tokens=150)
    spec = await generate(TimedRunner(clock), PROMPT, SpecConfig(k_max=8),
                          temperature=0.0, max_tokens=150)
    assert spec.tokens == plain.tokens
    ratio = spec.engine.step_cost.fixed_over_token() if spec.engine.step_cost else None
    drafts = [len(e.tokens) - 1 for call in spec.runner.calls for e in call if e.n_logits == len(e.tokens)]
    assert ratio is not None
    if deep:
        assert ratio > 10 and max(drafts) == 8
    else:  # the prior drafts a little until the line is known; then not one more drafted row
        assert ratio == pytest.approx(0.0, abs=1e-6)
        assert sum(drafts[-len(drafts) // 2:]) == 0, drafts
