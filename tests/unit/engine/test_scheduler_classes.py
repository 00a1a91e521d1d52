"""Classes within a step (scheduler.py, "Classes within a step"): a higher class's prefill runs
alone, lower-class work sits out at most `patience` steps in a row, flex prompt chunks are
bounded, and nothing sits out when no higher class is prefilling (work-conserving).

The scheduler on its own (no runner, no clock: steps are calls to `schedule`), then the engine
on the fake runner, where the interactive request is submitted from a flex request's own sink
on the engine thread, so the step that follows certainly finds the flex work decoding.
"""

from __future__ import annotations

import asyncio
import threading

from hearth.engine import Engine
from hearth.engine.fair_share import Priority
from hearth.engine.fake_runner import FakeRunner
from hearth.engine.kv import SlotTable
from hearth.engine.scheduler import Scheduler, Work
from hearth.engine.sequence import ActiveRequest, Sequence
from hearth.engine.types import EngineRequest, SamplingParams
from tests.helpers import until
from tests.unit.engine.held_step import arrive_during_held_step
from tests.unit.engine.test_preempt import Collect, alone, request
from tests.unit.engine.test_scheduler import ran, start_decoding

FLEX, DEFAULT, PRIORITY = int(Priority.FLEX), int(Priority.DEFAULT), int(Priority.PRIORITY)


def make(rid: str, priority: int, prompt_len: int = 4, tenant: str | None = None) -> ActiveRequest:
    """A request of its own tenant (`rid`) unless `tenant` is given."""
    prompt = [1000 + sum(map(ord, rid)), *range(1, prompt_len)]
    req = EngineRequest(rid, prompt, SamplingParams(), priority=priority, tenant=rid if tenant is None else tenant)
    return ActiveRequest(req, lambda out: None, max_len=4096)


def admit(sched: Scheduler, *ars: ActiveRequest) -> None:
    for ar in ars:
        sched.add(ar)
    for adm in sched.admit():
        adm.ar.seqs.extend(Sequence.placeholder(i, s) for i, s in enumerate(adm.placement.slots))
    assert all(ar in sched.running for ar in ars)


def who(work: list[Work]) -> list[tuple[str, str]]:
    return [(w.ar.request_id, "decode" if w.seq is not None else "prefill") for w in work]


def decode_all(sched: Scheduler, *ars: ActiveRequest) -> None:
    """Admit `ars` and bring each to its decode phase."""
    admit(sched, *ars)
    for ar in ars:
        start_decoding(ar)


def decoding(sched: Scheduler, *rids_classes: tuple[str, int]) -> list[ActiveRequest]:
    ars = [make(rid, c) for rid, c in rids_classes]
    decode_all(sched, *ars)
    return ars


def test_a_higher_class_prefill_is_not_shared_with_lower_class_work() -> None:
    sched = Scheduler(SlotTable(4), 64)
    decoding(sched, ("f1", FLEX), ("f2", FLEX))
    late_flex = make("f3", FLEX, 10)
    urgent = make("u", DEFAULT, 10)
    admit(sched, late_flex, urgent)
    work = sched.schedule()
    assert who(work) == [("u", "prefill")]  # no flex decode, no flex prompt chunk
    assert work[0].entry.n_logits == 1  # its whole prompt: the first token comes out of this step
    ran(work)
    start_decoding(urgent)
    # its first token is out: everyone runs again
    assert sorted(who(sched.schedule())) == [("f1", "decode"), ("f2", "decode"), ("f3", "prefill"),
                                             ("u", "decode")]
    assert sched.sat_out == 0 and sched.yields == 1


def test_each_class_yields_to_every_higher_one_prefilling() -> None:
    sched = Scheduler(SlotTable(4), 64)
    decoding(sched, ("f", FLEX), ("d", DEFAULT))
    p = make("p", PRIORITY, 6)
    admit(sched, p)
    assert who(sched.schedule()) == [("p", "prefill")]
    start_decoding(p)
    d2 = make("d2", DEFAULT, 6)
    admit(sched, d2)
    # a default prefill: the flex decode sits out, the priority and default decodes run
    assert sorted(who(sched.schedule())) == [("d", "decode"), ("d2", "prefill"), ("p", "decode")]


def test_lower_class_work_sits_out_at_most_patience_steps_in_a_row() -> None:
    sched = Scheduler(SlotTable(2), 8, patience=2)
    decoding(sched, ("f", FLEX))
    long = make("u", DEFAULT, 40)  # 5 steps of prefill at 8 tokens each
    admit(sched, long)
    steps = []
    for _ in range(5):
        work = sched.schedule()
        steps.append(sorted(who(work)))
        ran(work)
    alone_step, shared = [("u", "prefill")], [("f", "decode"), ("u", "prefill")]
    assert steps == [alone_step, alone_step, shared, alone_step, alone_step]
    assert long.prefill_pos == 40 - 1  # the shared step gave the flex decode one of the 8 tokens


def test_work_conserving_nothing_sits_out_without_a_higher_class_prefilling() -> None:
    sched = Scheduler(SlotTable(4), 64)
    decoding(sched, ("f1", FLEX), ("d", DEFAULT))  # a higher class decoding, not prefilling
    f2 = make("f2", FLEX, 10)
    admit(sched, f2)
    assert sorted(who(sched.schedule())) == [("d", "decode"), ("f1", "decode"), ("f2", "prefill")]
    # one class alone, prefilling beside its own decodes: all of it runs
    sched = Scheduler(SlotTable(4), 64)
    decoding(sched, ("a", DEFAULT))
    b = make("b", DEFAULT, 10)
    admit(sched, b)
    assert sorted(who(sched.schedule())) == [("a", "decode"), ("b", "prefill")]
    assert sched.yields == 0


def test_flex_prompt_chunks_are_bounded_per_step_and_others_are_not() -> None:
    sched = Scheduler(SlotTable(4), 64, flex_chunk=16)
    f1, f2 = make("f1", FLEX, 12), make("f2", FLEX, 12)
    admit(sched, f1, f2)
    work = sched.schedule()
    assert [(w.ar.request_id, len(w.entry.tokens)) for w in work] == [("f1", 12), ("f2", 4)]
    sched = Scheduler(SlotTable(4), 64, flex_chunk=16)
    d = make("d", DEFAULT, 40)
    admit(sched, d)
    assert [len(w.entry.tokens) for w in sched.schedule()] == [40]
    assert Scheduler(SlotTable(4), 512).flex_chunk == 128  # the default: a quarter of the budget


def test_flex_prompt_chunks_shrink_while_a_higher_class_decodes_beside_them() -> None:
    sched = Scheduler(SlotTable(4), 512)
    assert (sched.flex_chunk, sched.flex_chunk_beside) == (128, 16)  # defaults: a quarter, a thirty-second
    sched = Scheduler(SlotTable(4), 64, flex_chunk=32, flex_chunk_beside=8)
    flex = make("f", FLEX, 100)
    admit(sched, flex)
    assert [len(w.entry.tokens) for w in sched.schedule()] == [32]  # alone: the whole flex chunk
    flex.prefill_pos += 32
    decoding(sched, ("u", DEFAULT))
    work = sched.schedule()
    assert [(w.ar.request_id, len(w.entry.tokens)) for w in work] == [("u", 1), ("f", 8)]
    flex.prefill_pos += 8
    sched.running.remove(sched.find("u"))  # the interactive stream ended: whole chunks again
    decoding(sched, ("f2", FLEX))
    assert sorted(len(w.entry.tokens) for w in sched.schedule()) == [1, 32]  # a flex decode is no reason


def test_prompt_chunks_go_by_class_first() -> None:
    sched = Scheduler(SlotTable(4), 8, patience=0)  # patience 0: nothing ever sits out
    f, d = make("f", FLEX, 8), make("d", DEFAULT, 8)
    admit(sched, f, d)
    assert [(w.ar.request_id, len(w.entry.tokens)) for w in sched.schedule()] == [("d", 8)]


async def test_on_the_engine_the_interactive_prefill_step_holds_no_flex_work() -> None:
    runner = FakeRunner(n_seq_max=3)
    eng = Engine(runner, seq_ctx=256)
    eng.start()
    urgent = request("urgent", "an interactive question", DEFAULT, tokens=5)
    flex = [request("flex-a", "alpha prompt", FLEX), request("flex-b", "bravo prompt!", FLEX)]
    urgent_sink = Collect()
    first = Collect(after=3, hook=lambda: eng.submit(urgent, urgent_sink))
    second = Collect()
    eng.submit(flex[1], second)
    eng.submit(flex[0], first)
    try:
        for s in (first, second, urgent_sink):
            assert await asyncio.to_thread(s.done.wait, 10)
    finally:
        eng.stop()
    prompt = urgent.prompt_tokens
    steps = [i for i, call in enumerate(runner.calls) if any(e.tokens == prompt for e in call)]
    assert len(steps) == 1
    assert [e.tokens for e in runner.calls[steps[0]]] == [prompt]  # alone in its step
    assert len(runner.calls[steps[0] + 1]) == 3  # then the flex decodes run beside it again
    assert eng.scheduler.yields == 1 and eng.preempt.pauses == 0
    for r, s in zip(flex, (first, second), strict=True):  # sitting out changes no output
        ref = alone(r)
        assert s.ids == ref.ids and len(s.ids) == 40
    assert urgent_sink.finish == "length" and len(urgent_sink.ids) == 5


async def test_an_interactive_arrival_interrupts_a_flex_prompt_chunk_and_goes_first() -> None:
    """The flex request's prompt chunk is held in its decode (the fake runner's `hold`) until
    something interrupts it: only the interactive request's arrival can."""
    hold = threading.Event()
    hold.set()
    runner = FakeRunner(n_batch=64, hold=hold, hold_min_tokens=20)  # flex chunks: 32 tokens, held
    eng = Engine(runner, seq_ctx=512)
    eng.start()
    flex = request("flex", "x" * 100, FLEX, tokens=6)
    urgent = request("urgent", "hi", DEFAULT, tokens=4)
    flex_sink, urgent_sink = Collect(), Collect()
    # its first prompt chunk is held; the urgent request's first token comes before it goes on
    await arrive_during_held_step(eng, runner, hold, (flex, flex_sink), (urgent, urgent_sink),
                                  "the held flex chunk interrupted",
                                  before_release=lambda: until(lambda: len(urgent_sink.ids) >= 1,
                                                               "the urgent request's first token"))
    assert [len(e.tokens) for e in runner.aborted[0]] == [32]  # the flex chunk, rolled back
    after = runner.calls[runner.calls.index(runner.aborted[0]) + 1]
    assert [e.tokens for e in after] == [urgent.prompt_tokens]  # then the urgent prompt, alone
    assert eng.stats.interrupted_decodes == 1
    assert flex_sink.ids == alone(flex).ids and urgent_sink.ids == alone(urgent).ids  # nothing changed
    for slot in eng.slots.slots:
        assert runner.kv.get(slot.seq_id, []) == slot.tokens


async def test_a_flex_arrival_does_not_interrupt() -> None:
    hold = threading.Event()
    hold.set()
    runner = FakeRunner(n_batch=64, hold=hold, hold_min_tokens=20)
    eng = Engine(runner, seq_ctx=512)
    eng.start()
    first, second = Collect(), Collect()
    try:
        eng.submit(request("f1", "x" * 100, FLEX, tokens=3), first)
        assert await asyncio.to_thread(runner.held.wait, 10)
        eng.submit(request("f2", "y", FLEX, tokens=3), second)
        await until(lambda: eng.in_flight == 2 and eng.queue.new == 1, "f2 queued")
        assert runner.aborted == [] and runner.held.is_set()  # still held: not interrupted
        hold.clear()
        for s in (first, second):
            assert await asyncio.to_thread(s.done.wait, 10)
    finally:
        hold.clear()
        eng.stop()
    assert runner.aborted == [] and eng.stats.interrupted_decodes == 0


async def test_an_arrival_interrupts_a_flex_chunk_beside_a_decode_of_its_own_class() -> None:
    """A `priority` request decodes beside a flex prompt chunk (held in the fake runner); a
    second `priority` request arrives: the step's class is its chunk's (flex), so the arrival
    stops it, and its prompt runs next beside the first one's decode, without the flex chunk."""
    hold = threading.Event()
    hold.set()
    runner = FakeRunner(n_seq_max=3, n_batch=64, hold=hold, hold_min_tokens=9)  # a decode beside an 8-token flex chunk
    eng = Engine(runner, seq_ctx=512)
    p1, flex = request("p1", "now!", PRIORITY, tokens=6), request("flex", "x" * 100, FLEX, tokens=4)
    p2 = request("p2", "me too", PRIORITY, tokens=4)
    sinks = {"p1": Collect(), "flex": Collect(), "p2": Collect()}
    eng.submit(p1, sinks["p1"])  # before the thread starts: p1's prompt runs first, alone
    eng.submit(flex, sinks["flex"])
    eng.start()
    try:
        assert await asyncio.to_thread(runner.held.wait, 10)  # p1's decode beside the first flex chunk
        eng.submit(p2, sinks["p2"])
        await until(lambda: len(runner.aborted) == 1, "the step with the flex chunk interrupted")
        hold.clear()
        for s in sinks.values():
            assert await asyncio.to_thread(s.done.wait, 10)
    finally:
        hold.clear()
        eng.stop()
    assert sorted(len(e.tokens) for e in runner.aborted[0]) == [1, 8]
    after = runner.calls[runner.calls.index(runner.aborted[0]) + 1]
    assert sorted(len(e.tokens) for e in after) == [1, len(p2.prompt_tokens)]  # p1's token and p2's prompt
    assert eng.preempt.pauses == 0  # a third slot was free
    for r in (p1, flex, p2):
        assert sinks[r.request_id].ids == alone(r).ids
