"""Preemption on the fake runner (hearth/engine/preempt.py): a `priority` request arriving while
every slot runs `flex` work pauses one at a step boundary; the paused request's KV goes to RAM
and comes back with no re-prefill, and its output equals an unpaused run's, greedy and seeded.

No verdict depends on timing: the priority request is submitted from the flex request's own
sink, on the engine thread, right after a step that gave it tokens, so the next step boundary
certainly finds the flex request decoding, with tokens still to go (max_tokens, ignore_eos).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, TypeVar

from hearth.engine import Engine, EngineRequest, RequestOutput, SamplingParams
from hearth.engine.fair_share import Priority
from hearth.engine.fake_runner import FakeRunner

FLEX, DEFAULT, PRIORITY = int(Priority.FLEX), int(Priority.DEFAULT), int(Priority.PRIORITY)


def request(rid: str, prompt: str, priority: int, tokens: int = 40, **params: Any) -> EngineRequest:
    sampling = SamplingParams(**{"temperature": 0.0, "max_tokens": tokens, "ignore_eos": True, **params})
    return EngineRequest(rid, list(prompt.encode()), sampling, priority=priority, tenant=rid)


class Collect:
    """A sink that gathers a request's text and token ids (engine thread), and can run a hook
    once the request has produced `after` tokens."""

    def __init__(self, after: int = 0, hook: Any = None) -> None:
        self.text, self.ids = "", list[int]()
        self.done = threading.Event()
        self.after, self.hook = after, hook
        self.finish: str | None = None

    def __call__(self, out: RequestOutput) -> None:
        for d in out.deltas:
            self.text += d.text
            self.ids += d.token_ids
            if d.finish_reason:
                self.finish = d.finish_reason.value
        if self.hook is not None and len(self.ids) >= self.after:
            hook, self.hook = self.hook, None
            hook()
        if out.finished:
            self.done.set()


C = TypeVar("C", bound=Collect)


def alone_on(eng: Engine, req: EngineRequest, sink: C) -> C:
    """`req` alone on `eng` (started here, stopped once it ended, also on a failure)."""
    eng.start()
    try:
        eng.submit(req, sink)
        assert sink.done.wait(10)
        return sink
    finally:
        eng.stop()


async def run_to_end(eng: Engine, submits: list[tuple[EngineRequest, Collect]], more: tuple[Collect, ...] = (),
                     timeout: float = 10) -> None:
    """Start `eng`, submit `submits` in order, wait until their sinks and `more` (requests a
    hook submits) are done, and stop it (also on a failure)."""
    eng.start()
    try:
        for req, sink in submits:
            eng.submit(req, sink)
        for s in (*(sink for _, sink in submits), *more):
            assert await asyncio.to_thread(s.done.wait, timeout)
    finally:
        eng.stop()


def alone(req: EngineRequest, slots: int = 1) -> Collect:
    return alone_on(Engine(FakeRunner(n_seq_max=slots), seq_ctx=256), req, Collect())


async def paused_run(flex: list[EngineRequest], urgent: EngineRequest, slots: int
                     ) -> tuple[list[Collect], Collect, Engine]:
    eng = Engine(FakeRunner(n_seq_max=slots), seq_ctx=256)
    urgent_sink = Collect()
    sinks = [Collect() for _ in flex[1:]]
    first = Collect(after=3, hook=lambda: eng.submit(urgent, urgent_sink))
    await run_to_end(eng, [*zip(flex[1:], sinks, strict=True), (flex[0], first)], (urgent_sink,))
    return [first, *sinks], urgent_sink, eng


async def test_a_priority_request_pauses_flex_work_whose_output_stays_the_same() -> None:
    flex = [request("flex-a", "alpha prompt", FLEX), request("flex-b", "bravo prompt!", FLEX)]
    urgent = request("urgent", "urgent", PRIORITY, tokens=5)
    sinks, urgent_sink, eng = await paused_run(flex, urgent, slots=2)
    assert eng.preempt.pauses == 1 and eng.preempt.resumes == 1 and not eng.preempt.paused
    # the urgent request finished before the paused one did
    assert urgent_sink.finish == "length" and len(urgent_sink.ids) == 5
    for r, s in zip(flex, sinks, strict=True):
        ref = alone(r)
        assert s.text == ref.text and s.ids == ref.ids and len(s.ids) == 40
    # zero re-prefill: every prompt token was decoded once
    assert eng.stats.prompt_tokens == sum(len(r.prompt_tokens) for r in (*flex, urgent))


async def test_a_seeded_sampled_request_resumes_with_the_same_tokens() -> None:
    flex = [request("flex-s", "sampled", FLEX, temperature=0.9, seed=1234)]
    urgent = request("urgent", "now", PRIORITY, tokens=3)
    sinks, _, eng = await paused_run(flex, urgent, slots=1)
    assert eng.preempt.pauses == 1
    ref = alone(flex[0])
    assert sinks[0].ids == ref.ids and len(ref.ids) == 40


async def test_nothing_pauses_for_its_own_class_or_a_lower_one() -> None:
    flex = [request("d1", "default one", DEFAULT)]
    for incoming in (DEFAULT, FLEX):
        _, other, eng = await paused_run(flex, request("x", "x", incoming, tokens=3), slots=1)
        assert eng.preempt.pauses == 0 and other.finish == "length"


async def test_an_abort_ends_a_paused_request() -> None:
    """Aborted while paused (from the urgent request's first output, when the victim certainly
    waits in RAM: one slot, and the urgent request holds it)."""
    eng = Engine(FakeRunner(n_seq_max=1), seq_ctx=256)
    eng.start()
    try:
        def paused_now() -> None:
            assert [p.ar.request_id for p in eng.preempt.paused] == ["victim"]
            eng.abort("victim")

        urgent_sink = Collect(after=1, hook=paused_now)
        urgent = request("urgent", "u", PRIORITY, tokens=30)
        victim = Collect(after=2, hook=lambda: eng.submit(urgent, urgent_sink))
        eng.submit(request("victim", "victim prompt", FLEX, tokens=60), victim)
        assert await asyncio.to_thread(victim.done.wait, 10)
        assert await asyncio.to_thread(urgent_sink.done.wait, 10)
        assert victim.finish == "cancelled" and len(victim.ids) < 60 and not eng.preempt.paused
        assert urgent_sink.finish == "length" and eng.preempt.resumes == 0
    finally:
        eng.stop()


def tenant_request(rid: str, tenant: str, prompt: str, tokens: int = 40) -> EngineRequest:
    sampling = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    return EngineRequest(rid, list(prompt.encode()), sampling, tenant=tenant)


async def test_a_tenants_first_request_pauses_one_of_a_tenant_running_several() -> None:
    """Fair shares within a class: A holds both slots, B's one request takes one of them now;
    A's paused request resumes after and answers as if never paused."""
    a = [tenant_request("a1", "a", "first of a"), tenant_request("a2", "a", "second one of a")]
    sinks, b_sink, eng = await paused_run(a, tenant_request("b1", "b", "b's", tokens=4), slots=2)
    assert eng.preempt.pauses == 1 and b_sink.finish == "length"
    for r, s in zip(a, sinks, strict=True):
        assert s.ids == alone(r).ids


async def test_no_fairness_pause_when_nobody_runs_several_or_the_tenant_runs_already() -> None:
    mixed = [tenant_request("a1", "a", "first of a"), tenant_request("c1", "c", "one of c")]
    _, b_sink, eng = await paused_run(mixed, tenant_request("b1", "b", "b's", tokens=4), slots=2)
    assert eng.preempt.pauses == 0 and b_sink.finish == "length"
    both_a = [tenant_request("a1", "a", "first of a"), tenant_request("a2", "a", "second one of a")]
    _, more_a, eng = await paused_run(both_a, tenant_request("a3", "a", "third", tokens=4), slots=2)
    assert eng.preempt.pauses == 0 and more_a.finish == "length"


async def test_a_tenant_below_its_share_of_the_slots_pauses_one_of_a_tenant_two_above() -> None:
    """B runs one request and A three of the four slots: B's second request pauses one of A's
    (A keeps two, B gets two: an even split); A's paused request resumes and answers as if
    never paused."""
    a = [tenant_request(f"a{i}", "a", f"prompt {i} of a") for i in range(1, 4)]
    sinks, b_sink, eng = await paused_run([*a, tenant_request("b1", "b", "b's first")],
                                          tenant_request("b2", "b", "b's second", tokens=4), slots=4)
    assert eng.preempt.pauses == 1 and b_sink.finish == "length"
    for r, sink in zip(a, sinks[:3], strict=True):
        assert sink.ids == alone(r).ids


async def test_no_fairness_pause_when_it_would_not_make_the_split_more_even() -> None:
    """A runs two, B and C one each (four slots): B's second request would leave A with one and
    B with two, so nothing pauses and it waits for a slot."""
    running = [tenant_request("a1", "a", "first of a"), tenant_request("a2", "a", "second one of a"),
               tenant_request("b1", "b", "b's first"), tenant_request("c1", "c", "one of c")]
    _, b_sink, eng = await paused_run(running, tenant_request("b2", "b", "b's second", tokens=4), slots=4)
    assert eng.preempt.pauses == 0 and b_sink.finish == "length"


async def test_a_paused_requests_time_cap_does_not_run_while_it_is_paused() -> None:
    """The victim has a time cap of 600 s (of the engine's clock). While it is paused (the
    urgent request's first output, when it certainly waits in RAM), the clock jumps an hour:
    time it spent paused, not running. It resumes and produces every token it asked for, and
    its deadline moved on by exactly the pause. (Counted while paused, the cap would end it at
    once on resume, with fewer tokens and the time cap's stop reason.)"""
    eng = Engine(FakeRunner(n_seq_max=1), seq_ctx=256)
    skew = [0.0]
    base = eng.clock
    eng.clock = lambda: base() + skew[0]
    eng.start()
    try:
        deadlines: list[float] = []

        def paused_now() -> None:
            (p,) = eng.preempt.paused
            assert p.ar.request_id == "victim" and p.ar.deadline is not None
            deadlines.append(p.ar.deadline)
            skew[0] += 3600.0

        urgent_sink = Collect(after=1, hook=paused_now)
        urgent = request("urgent", "u", PRIORITY, tokens=5)
        victim = Collect(after=2, hook=lambda: eng.submit(urgent, urgent_sink))
        capped = request("victim", "victim prompt", FLEX, tokens=30)
        capped.max_time = 600.0
        eng.submit(capped, victim)
        assert await asyncio.to_thread(victim.done.wait, 10)
        assert await asyncio.to_thread(urgent_sink.done.wait, 10)
        assert eng.preempt.pauses == 1 and eng.preempt.resumes == 1
        assert victim.finish == "length" and len(victim.ids) == 30, (victim.finish, len(victim.ids))
        assert deadlines and deadlines[0] < base() + 600.0  # before the pause: still the original cap
    finally:
        eng.stop()

