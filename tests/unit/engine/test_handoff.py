"""The engine thread's handoff to the event loop (hearth.engine.handoff): one wakeup serves
every item put since the last drain, per-mailbox order is kept, nothing is lost when a
producer races the drain, and a stream closed among others still aborts within a step."""

from __future__ import annotations

import asyncio
import threading

from hearth.engine import Engine, EngineRequest, SamplingParams
from hearth.engine.fake_runner import FakeRunner
from hearth.engine.handoff import Handoff, Mailbox, for_loop
from tests.helpers import until

SCRIPT = FakeRunner.script


async def test_items_put_while_the_loop_is_busy_take_one_wakeup_in_order() -> None:
    loop = asyncio.get_running_loop()
    handoff = Handoff(loop)
    boxes: list[Mailbox[int]] = [Mailbox(loop) for _ in range(8)]

    def produce() -> None:
        for i in range(800):
            handoff.put(boxes[i % 8], i)

    t = threading.Thread(target=produce)
    t.start()
    t.join()  # the loop is blocked here: every put lands before the first drain runs
    assert handoff.wakeups == 1
    got = [[await boxes[b].get() for _ in range(100)] for b in range(8)]
    assert got == [list(range(b, 800, 8)) for b in range(8)]
    assert handoff.wakeups == 1 and all(len(b) == 0 for b in boxes)


async def test_a_producer_racing_the_drains_loses_nothing() -> None:
    loop = asyncio.get_running_loop()
    handoff = Handoff(loop)
    boxes: list[Mailbox[int]] = [Mailbox(loop) for _ in range(3)]
    n = 20000

    def produce() -> None:
        for i in range(n):
            handoff.put(boxes[i % 3], i)

    t = threading.Thread(target=produce)
    t.start()
    got: list[list[int]] = [[], [], []]
    for i in range(n):  # consume as they come, so drains interleave with the puts
        got[i % 3].append(await boxes[i % 3].get())
    t.join()
    assert got == [list(range(b, n, 3)) for b in range(3)]
    assert 1 <= handoff.wakeups <= n


async def test_one_handoff_per_loop() -> None:
    loop = asyncio.get_running_loop()
    assert for_loop(loop) is for_loop(loop)


async def test_a_stream_closed_among_others_aborts_within_a_step_and_the_others_finish() -> None:
    runner = FakeRunner(n_seq_max=4, step_delay=0.002)
    eng = Engine(runner, seq_ctx=100000)
    eng.start()

    def req(rid: str, max_tokens: int) -> EngineRequest:
        return EngineRequest(rid, [ord(c) for c in "hello"], SamplingParams(temperature=0.0, max_tokens=max_tokens))

    async def run(rid: str) -> str:
        text = ""
        async for out in eng.generate(req(rid, 40)):
            text += "".join(d.text for d in out.deltas)
        return text

    try:
        others = [asyncio.create_task(run(f"r{i}")) for i in range(3)]
        agen = eng.generate(req("cut", 10000))
        async for _out in agen:
            if len(runner.calls) > 5:
                break
        cut = eng.scheduler.find("cut")
        assert cut is not None
        cut_seq = cut.seqs[0].slot.seq_id
        await agen.aclose()  # type: ignore[attr-defined]
        steps_at_close = len(runner.calls)
        await until(lambda: eng.stats.cancelled == 1)
        # Within a step: no decode taken after the abort holds the cut stream's sequence (the one
        # in flight when it came may). Counted by what the decodes held, not by how many ran
        # meanwhile: the other streams keep the engine stepping at its own pace.
        held = [call for call in runner.calls[steps_at_close:] if any(e.seq_id == cut_seq for e in call)]
        assert len(held) <= 1
        expected = "".join(chr(SCRIPT[(5 + i) % len(SCRIPT)]) for i in range(40))
        assert await asyncio.gather(*others) == [expected] * 3
        await until(lambda: eng.in_flight == 0)
    finally:
        eng.stop()
