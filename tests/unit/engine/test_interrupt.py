"""An abort that arrives during a decode holding a prompt chunk interrupts that decode: the
runner rolls every sequence of the batch back, the aborted request ends at once, and its
neighbours' work runs again in the next step with the same result as without the abort."""

from __future__ import annotations

import asyncio
import threading

from hearth.engine import Engine, EngineRequest, FinishReason, SamplingParams
from hearth.engine.fake_runner import FakeRunner
from tests.helpers import until

SCRIPT = FakeRunner.script


def expected_text(prompt_len: int, n: int) -> str:
    return "".join(chr(SCRIPT[(prompt_len + i) % len(SCRIPT)]) for i in range(n))


def req(rid: str, prompt: bytes, max_tokens: int) -> EngineRequest:
    return EngineRequest(rid, list(prompt), SamplingParams(temperature=0.0, max_tokens=max_tokens))


async def collect(eng: Engine, r: EngineRequest) -> tuple[str, FinishReason | None, int]:
    text, reason, n = "", None, 0
    async for out in eng.generate(r):
        for d in out.deltas:
            text += d.text
            n += len(d.token_ids)
            reason = d.finish_reason or reason
    return text, reason, n


async def wait_for(event: threading.Event, timeout: float = 60.0) -> None:
    assert await asyncio.to_thread(event.wait, timeout), "the held decode never started"


async def test_abort_interrupts_a_prefill_shared_with_a_running_sequence() -> None:
    hold = threading.Event()
    hold.set()
    # Decodes of 20+ tokens (the long prompt's chunks) wait until interrupted; one-token decode steps run.
    runner = FakeRunner(n_batch=64, hold=hold, hold_min_tokens=20)
    # b's decode steps after its first few wait until a is queued, so a's prompt chunk always
    # finds b still decoding (with free-running steps, a slow event loop could submit a only
    # after b had finished, and the batch would hold a alone).
    a_queued = threading.Event()
    plain_decode = runner.decode

    def paced_decode(entries):  # type: ignore[no-untyped-def]
        if len(runner.calls) >= 4 and not a_queued.wait(60):
            raise RuntimeError("the test never queued a")
        return plain_decode(entries)

    runner.decode = paced_decode  # type: ignore[method-assign]
    eng = Engine(runner, seq_ctx=512)
    eng.start()
    try:
        neighbour = asyncio.ensure_future(collect(eng, req("b", b"hello", 60)))
        # b is decoding (then its next step waits for a)
        await until(lambda: eng.stats.generated_tokens >= 3, "b to decode")
        long = asyncio.ensure_future(collect(eng, req("a", bytes(300), 8)))
        await until(lambda: eng.in_flight == 2, "a to be submitted")
        a_queued.set()
        await wait_for(runner.held)
        held_batch = runner.calls[-1]
        assert {e.seq_id for e in held_batch} == {0, 1}  # a's prompt chunk rides with b's token
        eng.abort("a")
        text_a, reason_a, n_a = await asyncio.wait_for(long, 60)
        assert reason_a is FinishReason.CANCELLED and n_a == 0 and text_a == ""
        assert len(runner.aborted) == 1 and eng.stats.interrupted_decodes == 1
        text_b, reason_b, _ = await asyncio.wait_for(neighbour, 60)
        # b's token from the interrupted step was decoded again; its text is the uninterrupted one
        assert text_b == expected_text(5, 60) and reason_b is FinishReason.LENGTH
        # every sequence's KV holds exactly its slot's tokens (the fake runner checks positions too)
        for slot in eng.slots.slots:
            assert runner.kv.get(slot.seq_id, []) == slot.tokens
        assert eng.slots.n_busy == 0
    finally:
        hold.clear()
        eng.stop()


async def test_abort_interrupts_a_lone_prefill_and_frees_its_slot() -> None:
    hold = threading.Event()
    hold.set()
    runner = FakeRunner(n_batch=64, hold=hold, hold_min_tokens=20)
    eng = Engine(runner, seq_ctx=512)
    eng.start()
    try:
        task = asyncio.ensure_future(collect(eng, req("a", bytes(200), 8)))
        await wait_for(runner.held)
        assert eng.slots.n_busy == 1
        eng.abort("a")
        _, reason, n = await asyncio.wait_for(task, 60)
        assert reason is FinishReason.CANCELLED and n == 0
        assert eng.slots.n_busy == 0 and eng.stats.interrupted_decodes == 1
        slot = eng.slots.slots[0]
        assert runner.kv.get(slot.seq_id, []) == slot.tokens  # the interrupted chunk left no trace
        hold.clear()
        # the engine goes on: the same prompt runs to completion afterwards
        text, reason, _ = await asyncio.wait_for(collect(eng, req("a2", bytes(200), 8)), 60)
        assert reason is FinishReason.LENGTH and text == expected_text(200, 8)
    finally:
        hold.clear()
        eng.stop()


async def test_abort_of_a_request_outside_the_running_decode_does_not_interrupt_it() -> None:
    hold = threading.Event()
    hold.set()
    runner = FakeRunner(n_seq_max=1, n_batch=64, hold=hold, hold_min_tokens=20)
    eng = Engine(runner, seq_ctx=512)
    eng.start()
    try:
        first = asyncio.ensure_future(collect(eng, req("a", bytes(100), 4)))
        await wait_for(runner.held)
        queued = asyncio.ensure_future(collect(eng, req("q", b"hello", 4)))  # waits for the only slot
        await until(lambda: eng.waiting > 0, "q to queue")
        eng.abort("q")  # interrupt() would have been called inside abort(), synchronously
        assert runner.held.is_set() and not runner._interrupted.is_set()
        hold.clear()
        _, reason_q, n_q = await asyncio.wait_for(queued, 60)
        assert reason_q is FinishReason.CANCELLED and n_q == 0
        text, reason, _ = await asyncio.wait_for(first, 60)
        assert reason is FinishReason.LENGTH and text == expected_text(100, 4)
        assert eng.stats.interrupted_decodes == 0
    finally:
        hold.clear()
        eng.stop()
