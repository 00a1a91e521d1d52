"""Tenants within a class (scheduler.py, "Tenants within a class"): a newcomer's prefill runs
alone beside a tenant running several requests, bounded by patience, never for the tenant that
runs several, never making a higher class wait, and work-conserving. Then on the engine with
the fake runner: a newcomer's arrival (or a higher class's) interrupts the step in flight, and
its prompt runs alone in the next one, with every output unchanged.

The scheduler tests count steps (calls to `schedule`); the engine tests hold a decode in the
fake runner until something interrupts it, so no verdict depends on timing.
"""

from __future__ import annotations

import asyncio
import threading

from hearth.engine import Engine
from hearth.engine.fair_share import Priority
from hearth.engine.fake_runner import FakeRunner
from hearth.engine.kv import SlotTable
from hearth.engine.scheduler import Scheduler
from hearth.engine.sequence import ActiveRequest
from hearth.engine.types import EngineRequest
from tests.helpers import until
from tests.unit.engine import test_scheduler_classes as classes
from tests.unit.engine.held_step import arrive_during_held_step
from tests.unit.engine.test_preempt import Collect, alone, request, tenant_request
from tests.unit.engine.test_scheduler import ran, start_decoding
from tests.unit.engine.test_scheduler_classes import admit, who
from tests.unit.engine.test_scheduler_classes import decode_all as decoding

FLEX, DEFAULT, PRIORITY = int(Priority.FLEX), int(Priority.DEFAULT), int(Priority.PRIORITY)


def make(rid: str, tenant: str, prompt_len: int = 4, priority: int = DEFAULT) -> ActiveRequest:
    return classes.make(rid, priority, prompt_len, tenant)


def test_a_newcomers_prefill_runs_alone_beside_a_tenant_running_several() -> None:
    sched = Scheduler(SlotTable(4), 64)
    decoding(sched, make("a1", "a"), make("a2", "a"), make("a3", "a"))
    b = make("b1", "b", 10)
    admit(sched, b)
    work = sched.schedule()
    assert who(work) == [("b1", "prefill")]
    assert work[0].entry.n_logits == 1  # its whole prompt: its first token comes out of this step
    ran(work)
    start_decoding(b)
    assert sorted(who(sched.schedule())) == [("a1", "decode"), ("a2", "decode"), ("a3", "decode"),
                                             ("b1", "decode")]
    assert sched.sat_out == 0 and sched.yields == 1


def test_the_tenant_running_several_never_makes_its_neighbours_sit_out() -> None:
    sched = Scheduler(SlotTable(4), 64)
    decoding(sched, make("a1", "a"), make("a2", "a"), make("b1", "b"))
    a3 = make("a3", "a", 10)  # A's own new request: A is no newcomer
    admit(sched, a3)
    assert sorted(who(sched.schedule())) == [("a1", "decode"), ("a2", "decode"), ("a3", "prefill"),
                                             ("b1", "decode")]
    assert sched.yields == 0


def test_work_conserving_one_tenant_alone_or_one_request_each_never_sits_out() -> None:
    sched = Scheduler(SlotTable(4), 64)
    decoding(sched, make("a1", "a"), make("a2", "a"))
    admit(sched, make("a3", "a", 10))
    assert sorted(who(sched.schedule())) == [("a1", "decode"), ("a2", "decode"), ("a3", "prefill")]
    sched = Scheduler(SlotTable(4), 64)
    decoding(sched, make("a1", "a"), make("c1", "c"))
    admit(sched, make("b1", "b", 10))  # nobody runs several: nobody is above its share
    assert sorted(who(sched.schedule())) == [("a1", "decode"), ("b1", "prefill"), ("c1", "decode")]
    assert sched.yields == 0


def test_a_newcomer_makes_others_sit_out_at_most_patience_steps_in_a_row() -> None:
    sched = Scheduler(SlotTable(4), 8, patience=2)
    decoding(sched, make("a1", "a"), make("a2", "a"))
    b = make("b1", "b", 40)  # 5 steps of prefill at 8 tokens each
    admit(sched, b)
    steps = []
    for _ in range(5):
        work = sched.schedule()
        steps.append(sorted(who(work)))
        ran(work)
    alone_step, shared = [("b1", "prefill")], [("a1", "decode"), ("a2", "decode"), ("b1", "prefill")]
    assert steps == [alone_step, alone_step, shared, alone_step, alone_step]


def test_a_higher_class_never_sits_out_for_a_newcomer_and_a_lower_one_does() -> None:
    sched = Scheduler(SlotTable(5), 64)
    decoding(sched, make("a1", "a"), make("a2", "a"), make("p1", "ops", priority=PRIORITY))
    decoding(sched, make("f1", "batch", priority=FLEX))
    admit(sched, make("b1", "b", 10))
    assert sorted(who(sched.schedule())) == [("b1", "prefill"), ("p1", "decode")]
    # a flex newcomer beside default work: the default tenant running several is not below it
    sched = Scheduler(SlotTable(4), 64)
    decoding(sched, make("a1", "a"), make("a2", "a"))
    admit(sched, make("f1", "batch", 10, priority=FLEX))
    assert sorted(who(sched.schedule())) == [("a1", "decode"), ("a2", "decode"), ("f1", "prefill")]


def test_a_newcomer_is_a_tenant_with_only_that_request_running() -> None:
    sched = Scheduler(SlotTable(4), 64)
    decoding(sched, make("a1", "a"), make("a2", "a"), make("b1", "b"))
    admit(sched, make("b2", "b", 10))  # B runs one already: it has its share, no newcomer
    assert sorted(who(sched.schedule())) == [("a1", "decode"), ("a2", "decode"), ("b1", "decode"),
                                             ("b2", "prefill")]


# ---- on the engine ---------------------------------------------------------------------------


async def test_a_newcomers_arrival_interrupts_the_step_in_flight_and_its_prompt_runs_alone() -> None:
    """Tenant A's two prompts are held in their decode until something interrupts it: only B's
    arrival (a newcomer) can; A's own third request does not."""
    hold = threading.Event()
    hold.set()
    runner = FakeRunner(n_batch=64, hold=hold, hold_min_tokens=20)
    eng = Engine(runner, seq_ctx=512)
    eng.start()
    a = [tenant_request("a1", "a", "x" * 40, tokens=6), tenant_request("a2", "a", "y" * 40, tokens=6)]
    a3 = tenant_request("a3", "a", "z", tokens=3)
    b = tenant_request("b1", "b", "hi", tokens=4)
    a_sinks, a3_sink, b_sink = [Collect(), Collect()], Collect(), Collect()
    try:
        for r, s in zip(a, a_sinks, strict=True):
            eng.submit(r, s)
        assert await asyncio.to_thread(runner.held.wait, 10)  # A's prompt chunks, held
        eng.submit(a3, a3_sink)
        await until(lambda: eng.queue.new == 1, "a3 queued")
        assert runner.aborted == [] and runner.held.is_set()  # A's own request: not interrupted
        eng.submit(b, b_sink)
        await until(lambda: len(runner.aborted) == 1, "the held step interrupted")
        await until(lambda: len(b_sink.ids) >= 1, "B's first token")
        hold.clear()
        for s in (*a_sinks, a3_sink, b_sink):
            assert await asyncio.to_thread(s.done.wait, 10)
    finally:
        hold.clear()
        eng.stop()
    after = runner.calls[runner.calls.index(runner.aborted[0]) + 1]
    assert [e.tokens for e in after] == [b.prompt_tokens]  # B's prompt, alone
    assert eng.stats.interrupted_decodes == 1
    for r, s in zip((*a, a3, b), (*a_sinks, a3_sink, b_sink), strict=True):
        assert s.ids == alone(r).ids  # interrupted, sat out or not: the same output
    for slot in eng.slots.slots:
        assert runner.kv.get(slot.seq_id, []) == slot.tokens


async def test_an_interactive_arrival_interrupts_a_flex_decode_only_step() -> None:
    """Every decode is held (hold_min_tokens 1): the flex request's one-token decode waits
    until the interactive request's arrival interrupts it; the interactive prompt runs next,
    alone, and the flex output is unchanged."""
    hold = threading.Event()
    runner = FakeRunner(n_batch=64, hold=hold, hold_min_tokens=1)
    eng = Engine(runner, seq_ctx=512)
    eng.start()
    flex = request("flex", "a flex prompt", FLEX, tokens=8)
    urgent = request("urgent", "hi", DEFAULT, tokens=3)
    urgent_sink = Collect()
    flex_sink = Collect(after=2, hook=hold.set)  # from its second token on, its decodes are held

    def decode_only() -> None:
        assert all(len(e.tokens) == 1 for e in runner.calls[-1])  # a decode-only step

    await arrive_during_held_step(eng, runner, hold, (flex, flex_sink), (urgent, urgent_sink),
                                  "the flex decode interrupted", on_held=decode_only)
    after = runner.calls[runner.calls.index(runner.aborted[0]) + 1]
    assert [e.tokens for e in after] == [urgent.prompt_tokens]
    assert flex_sink.ids == alone(flex).ids and urgent_sink.ids == alone(urgent).ids


async def test_a_newcomer_taken_with_a_busy_tenants_request_gets_the_free_slot_first() -> None:
    """A runs two requests on three slots; A's third and B's first arrive in the same step (both
    submitted from A's sink on the engine thread, A's first). B takes the free slot: its prompt
    runs before A's third's, and nobody is paused for it; A's third waits for A's own slot."""
    eng = Engine(FakeRunner(n_seq_max=3), seq_ctx=256)
    eng.start()
    a3 = tenant_request("a3", "a", "third of a", tokens=3)
    b = tenant_request("b1", "b", "b's", tokens=3)
    a3_sink, b_sink = Collect(), Collect()

    def both() -> None:
        eng.submit(a3, a3_sink)
        eng.submit(b, b_sink)

    a = [tenant_request("a1", "a", "first of a", tokens=12), tenant_request("a2", "a", "second one of a", tokens=12)]
    sinks = [Collect(after=3, hook=both), Collect()]
    try:
        for r, s in zip(a, sinks, strict=True):
            eng.submit(r, s)
        for s in (*sinks, a3_sink, b_sink):
            assert await asyncio.to_thread(s.done.wait, 10)
    finally:
        eng.stop()
    runner = eng.runner
    assert isinstance(runner, FakeRunner)

    def first_run(req: EngineRequest) -> int:
        return next(i for i, call in enumerate(runner.calls) if any(e.tokens == req.prompt_tokens for e in call))

    assert first_run(b) < first_run(a3)
    assert eng.preempt.pauses == 0
    for r, s in zip((*a, a3, b), (*sinks, a3_sink, b_sink), strict=True):
        assert s.ids == alone(r).ids
