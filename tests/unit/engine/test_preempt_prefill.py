"""Preemption of a request still in its (chunked) prefill (hearth/engine/preempt.py): a `flex`
prompt half processed pauses for a `priority` request at a step boundary, its KV (exactly the
prompt tokens already decoded) goes to RAM, and it resumes in its prefill from where it
stopped: no prompt token is decoded twice, and its output equals a run alone (greedy, seeded,
with speculation). Then an abort of a request paused in its prefill, the rollback of a chunk
the arrival interrupted, fair shares of the slots with the busy tenant's request prefilling,
and the order of victims.

No verdict depends on timing: the engine's clock is frozen, and the urgent request is submitted
on the engine thread right after the decode that ran the flex prompt's k-th chunk (the fake
runner's `after` hook), so the next step boundary certainly finds that prompt half done. The
interrupted-chunk case holds that chunk's decode in the fake runner until the arrival stops it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hearth.engine import Engine, EngineRequest, RequestOutput
from hearth.engine.fair_share import Priority
from hearth.engine.fake_runner import FakeRunner
from hearth.engine.runner import BatchEntry
from hearth.engine.sequence import Phase
from hearth.engine.speculate import SpecConfig
from tests.unit.engine.held_step import arrive_during_held_step
from tests.unit.engine.test_preempt import Collect, alone_on, request, run_to_end, tenant_request
from tests.unit.engine.test_scheduler import start_decoding
from tests.unit.engine.test_scheduler_classes import admit, make

FLEX, DEFAULT, PRIORITY = int(Priority.FLEX), int(Priority.DEFAULT), int(Priority.PRIORITY)
CHUNK = 8  # flex prompt tokens per step in these tests
LONG = "The quick brown fox jumps over the lazy dog. " * 2  # 90 tokens: 12 flex chunks
SPEC = SpecConfig(k_max=4, fixed_over_token=1e9, measure_cost=False)  # drafts whenever it has a guess


@dataclass
class HookedRunner(FakeRunner):
    """The fake runner, calling `after(entries, decodes)` on the engine thread once a decode's
    KV is written and the decode can no longer be interrupted; `restored` records every
    `state_set` (seq id, the tokens of the KV it loaded)."""

    after: Callable[[list[BatchEntry], int], None] | None = None
    decodes: int = 0
    restored: list[tuple[int, list[int]]] | None = None

    def decode(self, entries: list[BatchEntry]) -> list[int]:
        first = super().decode(entries)
        self.decodes += 1
        if self.after is not None:
            self.after(entries, self.decodes)
        return first

    def state_set(self, seq_id: int, data: bytes) -> None:
        if self.restored is None:
            self.restored = []
        self.restored.append((seq_id, kv_tokens(data)))
        super().state_set(seq_id, data)


def kv_tokens(data: bytes) -> list[int]:
    """The token ids a fake runner's saved KV holds."""
    assert data.startswith(b"FAKE")
    return [int(t) for t in np.frombuffer(data[4:], dtype="<i4")]


class Outputs(Collect):
    """`Collect`, keeping the last output too (its cached tokens and prompt chunks)."""

    def __init__(self, after: int = 0, hook: Any = None) -> None:
        super().__init__(after, hook)
        self.last: RequestOutput | None = None

    def __call__(self, out: RequestOutput) -> None:
        self.last = out
        super().__call__(out)


def engine(runner: FakeRunner, spec: SpecConfig | None = None) -> Engine:
    eng = Engine(runner, seq_ctx=256, spec=spec)
    eng.clock = lambda: 1000.0  # frozen: nothing here depends on time
    eng.scheduler.flex_chunk = CHUNK
    return eng


def chunks_of(runner: FakeRunner, seq_ids: set[int], req: EngineRequest, start: int = 0) -> list[BatchEntry]:
    """The decoded entries holding `req`'s prompt chunks (found by content and position)."""
    prompt = req.prompt_tokens
    return [e for call in runner.calls for e in call
            if e.seq_id in seq_ids and len(e.tokens) > 1 and e.pos0 >= start
            and e.tokens == prompt[e.pos0: e.pos0 + len(e.tokens)]]


def run_alone(req: EngineRequest, spec: SpecConfig | None = None) -> Outputs:
    return alone_on(engine(FakeRunner(n_seq_max=1), spec), req, Outputs())


@dataclass
class PausedRun:
    eng: Engine
    runner: HookedRunner
    flex: Outputs
    urgent: Outputs
    seen: list[tuple[Phase, list[int], list[int], int, int]]  # at the pause: phase, tokens, KV, pos, chunks


async def pause_in_prefill(flex: EngineRequest, at_chunk: int, spec: SpecConfig | None = None,
                           urgent_tokens: int = 4) -> PausedRun:
    """One slot: `flex` prefills alone; right after its `at_chunk`-th chunk's decode an urgent
    `priority` request arrives. What the pause saved is read from the urgent request's first
    output (it is placed: the flex request certainly waits in RAM then)."""
    runner = HookedRunner(n_seq_max=1)
    eng = engine(runner, spec)
    urgent = request("urgent", "now!", PRIORITY, tokens=urgent_tokens)
    seen: list[tuple[Phase, list[int], list[int], int, int]] = []

    def look() -> None:
        (p,) = eng.preempt.paused
        seen.append((p.phase, p.tokens, kv_tokens(eng.preempt.saved(p)) if p.key else [], p.ar.prefill_pos,
                     p.ar.prefill_chunks))

    urgent_sink = Outputs(hook=look)

    def after(entries: list[BatchEntry], n: int) -> None:
        if n == at_chunk:
            assert [len(e.tokens) for e in entries] == [CHUNK]  # the flex prompt's chunk, alone
            eng.submit(urgent, urgent_sink)

    runner.after = after
    flex_sink = Outputs()
    await run_to_end(eng, [(flex, flex_sink)], (urgent_sink,))
    return PausedRun(eng, runner, flex_sink, urgent_sink, seen)


async def test_a_flex_prompt_paused_mid_prefill_resumes_where_it_stopped_and_answers_as_alone() -> None:
    flex = request("flex", LONG, FLEX, tokens=20)
    run = await pause_in_prefill(flex, at_chunk=3)
    eng, runner = run.eng, run.runner
    assert eng.preempt.pauses == 1 and eng.preempt.resumes == 1 and not eng.preempt.paused
    # paused in its prefill, its KV exactly the three chunks decoded, and that KV restored
    prefix = flex.prompt_tokens[: 3 * CHUNK]
    assert run.seen == [(Phase.PREFILL, prefix, prefix, 3 * CHUNK, 3)]
    assert runner.restored == [(0, prefix)]
    # the urgent request ran before the flex prompt went on, and finished first
    assert run.urgent.finish == "length" and len(run.urgent.ids) == 4
    # zero re-prefill: each prompt token decoded once, the flex prompt in order from where it stopped
    assert eng.stats.prompt_tokens == len(flex.prompt_tokens) + 4
    entries = chunks_of(runner, {0}, flex)
    assert [e.pos0 for e in entries] == list(range(0, len(flex.prompt_tokens), CHUNK))
    assert b"".join(bytes(e.tokens) for e in entries) == bytes(flex.prompt_tokens)
    # its output, cached count and chunk count are those of a run alone
    ref = run_alone(flex)
    assert run.flex.ids == ref.ids and run.flex.text == ref.text and len(ref.ids) == 20
    assert run.flex.last is not None and ref.last is not None
    assert (run.flex.last.cached_tokens, run.flex.last.prefill_chunks) == (0, ref.last.prefill_chunks) == (0, 12)


async def test_a_prompt_paused_before_its_first_chunk_keeps_its_reused_prefix_and_counts() -> None:
    """Placed with 41 prompt tokens reused from a slot (a warm-up request's 40-token prompt and
    its first answer token, the script's next byte: the flex prompt's 41st), but no chunk of its own decoded yet (it
    sits out while a `default` prompt runs): paused, it saves exactly the reused prefix, and
    resumes with its cached count and cache tier as placed (it is not placed a second time)."""
    runner = HookedRunner(n_seq_max=2)
    eng = engine(runner)
    warm = request("warm", LONG[:40], FLEX, tokens=2)
    d1 = request("d1", "another prompt, processed before the flex one: " * 2, DEFAULT, tokens=3)
    f1 = request("f1", LONG, FLEX, tokens=8)
    urgent = request("urgent", "now!", PRIORITY, tokens=3)
    seen: list[tuple[Phase, list[int], list[int], int, int]] = []

    def look() -> None:
        (p,) = eng.preempt.paused
        seen.append((p.phase, p.tokens, kv_tokens(eng.preempt.saved(p)), p.ar.cached_tokens, p.ar.prefill_chunks))

    sinks = {r.request_id: Outputs() for r in (warm, d1, f1)} | {"urgent": Outputs(hook=look)}
    eng.start()
    try:
        eng.submit(warm, sinks["warm"])
        assert await asyncio.to_thread(sinks["warm"].done.wait, 10)
        runner.decodes = 0
        runner.after = lambda entries, n: eng.submit(urgent, sinks["urgent"]) if n == 1 else None

        def both() -> None:  # on the engine thread, between steps: the next step takes both
            eng.submit(d1, sinks["d1"])
            eng.submit(f1, sinks["f1"])

        eng.call(both).result(10)
        for s in sinks.values():
            assert await asyncio.to_thread(s.done.wait, 10)
    finally:
        eng.stop()
    reused = 41
    prefix = f1.prompt_tokens[:reused]
    assert seen == [(Phase.PREFILL, prefix, prefix, reused, 0)]
    f1_slot = next(seq_id for seq_id, tokens in (runner.restored or []) if tokens == prefix)
    assert [e.pos0 for e in chunks_of(runner, {f1_slot}, f1, start=reused)][:1] == [reused]
    last = sinks["f1"].last
    assert last is not None and (last.cached_tokens, last.cache_tier, last.prefill_chunks) == (reused, "slot", 7)
    assert eng.stats.cached_tokens == reused  # counted once: not placed again on resume
    assert eng.stats.prompt_tokens == sum(len(r.prompt_tokens) for r in (warm, d1, urgent)) + len(LONG) - reused
    assert sinks["f1"].ids == run_alone(f1).ids


async def test_a_seeded_sampled_prompt_paused_in_its_prefill_samples_the_same_tokens() -> None:
    flex = request("flex-s", LONG, FLEX, tokens=20, temperature=0.9, seed=77)
    run = await pause_in_prefill(flex, at_chunk=5)
    assert run.eng.preempt.pauses == 1 and run.seen[0][0] is Phase.PREFILL
    assert run.flex.ids == run_alone(flex).ids


async def test_speculation_starts_on_the_resumed_prompt_and_the_output_is_unchanged() -> None:
    """With speculation on, the drafter starts at the first token from the whole prompt in the
    restored slot: the same drafts, the same output."""
    flex = request("flex-d", LONG, FLEX, tokens=30)
    run = await pause_in_prefill(flex, at_chunk=2, spec=SPEC)
    assert run.eng.preempt.pauses == 1 and run.seen[0][0] is Phase.PREFILL
    assert run.eng.stats.drafted_tokens > 0 and run.eng.stats.prompt_tokens == len(flex.prompt_tokens) + 4
    ref = run_alone(flex, SPEC)
    assert run.flex.ids == ref.ids and len(ref.ids) == 30


async def test_the_chunk_the_arrival_interrupts_is_not_saved_and_runs_after_the_resume() -> None:
    """The flex prompt's third chunk is held in the runner when the urgent request arrives: the
    arrival stops it (rolled back), the pause saves the two chunks before it, and the third
    runs again after the resume, from the same position."""
    hold = threading.Event()
    runner = HookedRunner(n_seq_max=1, hold=hold, hold_min_tokens=CHUNK)
    runner.after = lambda entries, n: hold.set() if n == 2 else None  # from the third chunk on
    eng = engine(runner)
    flex = request("flex", LONG, FLEX, tokens=10)
    urgent = request("urgent", "now!", PRIORITY, tokens=4)
    seen: list[tuple[Phase, int, list[int]]] = []

    def look() -> None:
        (p,) = eng.preempt.paused
        seen.append((p.phase, p.ar.prefill_pos, kv_tokens(eng.preempt.saved(p))))

    flex_sink, urgent_sink = Outputs(), Outputs(hook=look)
    eng.start()
    await arrive_during_held_step(eng, runner, hold, (flex, flex_sink), (urgent, urgent_sink),
                                  "the flex chunk interrupted")
    (aborted,) = runner.aborted[0]
    assert (aborted.pos0, len(aborted.tokens)) == (2 * CHUNK, CHUNK)
    assert seen == [(Phase.PREFILL, 2 * CHUNK, flex.prompt_tokens[: 2 * CHUNK])]
    after_resume = chunks_of(runner, {0}, flex, start=2 * CHUNK)
    assert after_resume[0].pos0 == 2 * CHUNK  # the rolled-back chunk, again, first
    assert eng.stats.prompt_tokens == len(flex.prompt_tokens) + 4 and eng.stats.interrupted_decodes == 1
    assert flex_sink.ids == run_alone(flex).ids


async def test_an_abort_ends_a_request_paused_in_its_prefill_and_frees_nothing_real() -> None:
    """Aborted while paused in its prefill (from the urgent request's first output): it ends
    cancelled with no token; the slot the urgent request holds stays busy and its KV intact
    (the paused request's detached slot is nobody's), and nothing resumes."""
    runner = HookedRunner(n_seq_max=1)
    eng = engine(runner)
    urgent = request("urgent", "now!", PRIORITY, tokens=6)
    checks: list[tuple[int, int]] = []

    def paused_now() -> None:
        assert [(p.ar.request_id, p.phase) for p in eng.preempt.paused] == [("flex", Phase.PREFILL)]
        eng.abort("flex")

    def after_abort() -> None:  # the step after the abort was applied
        checks.append((eng.slots.n_busy, len(runner.kv[0])))

    urgent_sink = Outputs(hook=paused_now)
    urgent_sink_2 = Outputs(after=2, hook=after_abort)

    def both(out: RequestOutput) -> None:
        urgent_sink(out)
        urgent_sink_2(out)

    runner.after = lambda entries, n: eng.submit(urgent, both) if n == 4 else None
    flex_sink = Outputs()
    eng.start()
    try:
        eng.submit(request("flex", LONG, FLEX, tokens=20), flex_sink)
        for s in (flex_sink, urgent_sink):
            assert await asyncio.to_thread(s.done.wait, 10)
    finally:
        eng.stop()
    assert flex_sink.finish == "cancelled" and flex_sink.ids == []
    assert eng.preempt.pauses == 1 and eng.preempt.resumes == 0 and not eng.preempt.paused
    # two tokens out: its prompt (4) and its first token decoded, in the slot it holds
    assert checks == [(1, 4 + 1)]
    assert urgent_sink.finish == "length" and urgent_sink.ids == run_alone(urgent).ids
    assert eng.stats.cancelled == 1 and eng.slots.n_busy == 0


async def test_a_tenant_below_its_share_pauses_the_busy_tenants_request_in_its_prefill() -> None:
    """Fair shares of the slots: A runs two (a1 generating, a2 half way through a long prompt)
    on both slots; B's first request pauses a2 in its prefill, runs, and a2 resumes from where
    it stopped; every answer equals a run alone."""
    runner = HookedRunner(n_seq_max=2, n_batch=16)
    eng = engine(runner)
    a1 = tenant_request("a1", "a", "short", tokens=30)
    a2 = tenant_request("a2", "a", LONG, tokens=6)
    b1 = tenant_request("b1", "b", "b's", tokens=4)
    seen: list[tuple[str, Phase, int]] = []

    def look() -> None:
        (p,) = eng.preempt.paused
        seen.append((p.ar.request_id, p.phase, len(p.tokens)))

    b_sink = Outputs(hook=look)
    runner.after = lambda entries, n: eng.submit(b1, b_sink) if n == 3 else None
    sinks = [Outputs(), Outputs()]
    for r, s in zip((a1, a2), sinks, strict=True):
        eng.submit(r, s)  # before the thread starts: both are admitted in its first step
    eng.start()
    try:
        for s in (*sinks, b_sink):
            assert await asyncio.to_thread(s.done.wait, 10)
    finally:
        eng.stop()
    # step 1: a1's prompt (5) and 11 of a2's; steps 2-3: a1's token and 15 of a2's each
    assert seen == [("a2", Phase.PREFILL, 11 + 15 + 15)]
    assert eng.preempt.pauses == 1 and eng.preempt.resumes == 1 and b_sink.finish == "length"
    assert eng.stats.prompt_tokens == sum(len(r.prompt_tokens) for r in (a1, a2, b1))
    for r, s in zip((a1, a2, b1), (*sinks, b_sink), strict=True):
        assert s.ids == run_alone(r).ids


def test_victims_lowest_class_first_then_a_prefilling_one_then_the_last_admitted() -> None:
    eng = engine(FakeRunner(n_seq_max=4))
    sched, victim = eng.scheduler, eng.preempt.victim
    head = make("urgent", PRIORITY)
    f_dec, d_pre = make("f-dec", FLEX), make("d-pre", DEFAULT)
    admit(sched, d_pre, f_dec)
    start_decoding(f_dec)
    assert victim(head) is f_dec  # the lowest class, though it generates
    f_pre = make("f-pre", FLEX)
    admit(sched, f_pre)
    assert f_pre.phase is Phase.PREFILL and d_pre.phase is Phase.PREFILL
    assert victim(head) is f_pre  # within the class, one in its prefill first
    f_dec2 = make("f-dec2", FLEX)
    admit(sched, f_dec2)
    start_decoding(f_dec2)
    assert victim(head) is f_pre  # even before one admitted after it
    sched.running.remove(f_pre)
    assert victim(head) is f_dec2  # then the last admitted


def test_a_busy_tenants_prefilling_request_goes_first_for_a_fair_share_pause() -> None:
    eng = engine(FakeRunner(n_seq_max=4))
    sched = eng.scheduler
    a_pre, a1, a2 = make("a-pre", DEFAULT, tenant="a"), make("a1", DEFAULT, tenant="a"), make("a2", DEFAULT, tenant="a")
    admit(sched, a_pre, a1, a2)
    start_decoding(a1)
    start_decoding(a2)
    assert eng.preempt.victim(make("b1", DEFAULT, tenant="b")) is a_pre


def test_a_sessions_prefill_and_a_prefill_of_several_candidates_are_never_paused() -> None:
    eng = engine(FakeRunner(n_seq_max=4))
    sched = eng.scheduler
    turn = make("turn", FLEX)
    turn.req.owner = "session-1"
    several = make("several", FLEX)
    several.req.n = 2
    admit(sched, turn, several)
    assert all(ar.phase is Phase.PREFILL for ar in (turn, several))
    assert eng.preempt.victim(make("urgent", PRIORITY)) is None
