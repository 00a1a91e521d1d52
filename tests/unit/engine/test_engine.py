"""Engine scheduling, batching and cancellation against the fake runner."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from hearth.engine import Engine, EngineRequest, FinishReason, RequestOutput, SamplingParams
from hearth.engine.fake_runner import FakeRunner
from hearth.engine.types import ContextOverflow, StopKind
from tests.helpers import until, wait_until

SCRIPT = FakeRunner.script


def expected_text(prompt_len: int, n: int) -> str:
    return "".join(chr(SCRIPT[(prompt_len + i) % len(SCRIPT)]) for i in range(n))


def make(runner: FakeRunner | None = None, seq_ctx: int = 256, budget: int | None = None) -> Engine:
    eng = Engine(runner or FakeRunner(), seq_ctx=seq_ctx, token_budget=budget)
    eng.start()
    return eng


async def run(eng: Engine, req: EngineRequest) -> tuple[dict[int, str], dict[int, FinishReason], list[RequestOutput]]:
    texts: dict[int, str] = {}
    reasons: dict[int, FinishReason] = {}
    outs = []
    async for out in eng.generate(req):
        outs.append(out)
        for d in out.deltas:
            texts[d.index] = texts.get(d.index, "") + d.text
            if d.finish_reason:
                reasons[d.index] = d.finish_reason
    return texts, reasons, outs


def req(rid: str, prompt: str = "hello", **kw: object) -> EngineRequest:
    n = int(kw.pop("n", 1))  # type: ignore[call-overload]
    params = SamplingParams(temperature=0.0, **kw)  # type: ignore[arg-type]
    return EngineRequest(rid, list(prompt.encode()), params, n=n)


async def test_greedy_generation_to_max_tokens() -> None:
    eng = make()
    try:
        texts, reasons, outs = await run(eng, req("a", max_tokens=10))
        assert texts[0] == expected_text(5, 10)
        assert reasons[0] is FinishReason.LENGTH
        assert outs[-1].finished and outs[-1].prompt_tokens == 5
    finally:
        eng.stop()


async def test_eos_stops_with_stop_and_ignore_eos_goes_on() -> None:
    eng = make(FakeRunner(eos_at=9))
    try:
        texts, reasons, _ = await run(eng, req("a", max_tokens=20))
        # prompt at positions 0-4, text at 5-8, EOS predicted for position 9
        assert texts[0] == expected_text(5, 4) and reasons[0] is FinishReason.STOP
        texts, reasons, _ = await run(eng, req("b", max_tokens=6, ignore_eos=True))
        assert reasons[0] is FinishReason.LENGTH and len(texts[0]) == 4  # EOS tokens add no text
    finally:
        eng.stop()


async def test_stop_string_ends_the_sequence_and_is_not_emitted() -> None:
    eng = make()
    try:
        # prompt of 5 bytes: generation starts at script[5] = "uick brown"
        texts, reasons, outs = await run(eng, req("a", max_tokens=30, stop=["brown"]))
        assert texts[0] == "uick " and reasons[0] is FinishReason.STOP
        assert outs[-1].deltas[0].stop_reason == "brown"
    finally:
        eng.stop()


async def test_default_max_tokens_is_the_rest_of_the_context() -> None:
    eng = make(seq_ctx=20)
    try:
        texts, reasons, _ = await run(eng, req("a", prompt="x" * 8))
        assert len(texts[0]) == 12 and reasons[0] is FinishReason.LENGTH
    finally:
        eng.stop()


async def test_prompt_too_long_and_overlong_max_tokens_are_rejected_before_queueing() -> None:
    eng = make(seq_ctx=16)
    try:
        with pytest.raises(ContextOverflow, match="16 tokens"):
            eng.submit(req("a", prompt="x" * 16), lambda o: None)
        with pytest.raises(ContextOverflow, match="requested 20 tokens"):
            eng.submit(req("b", prompt="x" * 10, max_tokens=10), lambda o: None)
        with pytest.raises(ValueError, match="n must be"):
            eng.submit(req("c", n=9), lambda o: None)
        # the size is checked before the ids, so the linear id scan never runs on a huge prompt
        huge = EngineRequest("d", [10**9] * 100_000, SamplingParams())
        with pytest.raises(ContextOverflow):
            eng.submit(huge, lambda o: None)
        assert eng.in_flight == 0
    finally:
        eng.stop()


async def test_n_candidates_share_the_prompt_kv() -> None:
    runner = FakeRunner()
    eng = make(runner)
    try:
        texts, _reasons, _ = await run(eng, req("a", prompt="abcdefgh", max_tokens=4, n=3))
        assert set(texts) == {0, 1, 2}
        assert all(t == expected_text(8, 4) for t in texts.values())
        prefill_tokens = sum(len(e.tokens) for call in runner.calls for e in call if len(e.tokens) > 1)
        assert prefill_tokens == 8  # prompt prefilled once, not three times
    finally:
        eng.stop()


async def submitted_before_start(eng: Engine, n: int, *reqs: EngineRequest) -> list[asyncio.Task[Any]]:
    """Start `run` for each request on an engine that is not started yet, wait until all of them
    are queued, then start it: its first step sees them all at once, whatever the scheduling of
    this thread and the engine's (a started engine could finish the first request before the
    last one is even submitted on a loaded machine)."""
    tasks = [asyncio.create_task(run(eng, r)) for r in reqs]
    await until(lambda: eng.in_flight == n)
    eng.start()
    return tasks


async def test_concurrent_decodes_share_one_decode_call_per_step() -> None:
    runner = FakeRunner(n_seq_max=4)
    eng = Engine(runner, seq_ctx=256)
    try:
        tasks = await submitted_before_start(eng, 4, *(req(f"r{i}", max_tokens=20) for i in range(4)))
        results = await asyncio.gather(*tasks)
        for texts, _reasons, _ in results:
            assert texts[0] == expected_text(5, 20)
        # some step decoded all four sequences together
        assert max(sum(1 for e in call if len(e.tokens) == 1) for call in runner.calls) == 4
    finally:
        eng.stop()


async def test_fifth_request_waits_for_a_free_slot_then_runs() -> None:
    # All five are queued before the engine starts, and its first decode is held: the state
    # "four running, one waiting" holds until the test has seen it (a polling loop racing 15
    # real decode steps could miss it on a loaded machine).
    hold = threading.Event()
    hold.set()
    runner = FakeRunner(n_seq_max=4, hold=hold)
    eng = Engine(runner, seq_ctx=256)
    try:
        tasks = await submitted_before_start(eng, 5, *(req(f"r{i}", max_tokens=15) for i in range(5)))
        await until(lambda: runner.held.is_set())
        assert eng.running == 4 and eng.waiting == 1
        hold.clear()
        results = await asyncio.gather(*tasks)
        assert all(r[1][0] is FinishReason.LENGTH for r in results)
        assert eng.slots.n_free == 4 and eng.in_flight == 0
    finally:
        eng.stop()


async def test_long_prompt_is_prefilled_in_chunks_within_the_budget() -> None:
    runner = FakeRunner(n_batch=16)
    eng = make(runner, budget=16)
    try:
        texts, _, _ = await run(eng, req("a", prompt="p" * 50, max_tokens=3))
        assert texts[0] == expected_text(50, 3)
        chunks = [len(e.tokens) for call in runner.calls for e in call]
        assert chunks[:4] == [16, 16, 16, 2]
        assert all(sum(len(e.tokens) for e in call) <= 16 for call in runner.calls)
    finally:
        eng.stop()


async def test_prefix_of_a_finished_request_is_reused() -> None:
    runner = FakeRunner(n_seq_max=1)
    eng = make(runner)
    try:
        await run(eng, req("a", prompt="0123456789", max_tokens=3))
        runner.calls.clear()
        _, _, outs = await run(eng, req("b", prompt="0123456789AB", max_tokens=3))
        assert outs[0].cached_tokens == 10
        assert len(runner.calls[0][0].tokens) == 2
    finally:
        eng.stop()


async def test_closing_the_iterator_aborts_within_a_step() -> None:
    runner = FakeRunner(step_delay=0.005)
    eng = make(runner, seq_ctx=100000)
    try:
        agen = eng.generate(req("a", max_tokens=10000))
        async for out in agen:
            if sum(len(d.token_ids) for d in out.deltas) and len(runner.calls) > 5:
                break
        await agen.aclose()
        steps_at_close = len(runner.calls)
        await until(lambda: eng.in_flight == 0)  # the abort has been applied
        assert len(runner.calls) - steps_at_close <= 1
        assert eng.in_flight == 0 and eng.slots.n_free == runner.n_seq_max
        assert eng.stats.cancelled == 1
    finally:
        eng.stop()


async def test_abort_while_waiting_ends_with_cancelled() -> None:
    # The hog cannot finish on its own before the test is done with the waiter (90000 tokens):
    # "w" waits for the only slot for as long as the test needs, however slow this thread is.
    runner = FakeRunner(n_seq_max=1, step_delay=0.002)
    eng = make(runner, seq_ctx=100000)
    try:
        hog = asyncio.create_task(run(eng, req("hog", max_tokens=90000)))
        waiter = asyncio.create_task(run(eng, req("w", max_tokens=50)))
        await until(lambda: eng.running == 1 and eng.waiting == 1 and eng.in_flight == 2)
        eng.abort("w")
        _texts, reasons, outs = await waiter
        assert reasons[0] is FinishReason.CANCELLED and outs[-1].finished
        assert not hog.done()  # "w" was cancelled while it waited, not after the hog let it run
        eng.abort("hog")
        _texts, reasons, _outs = await hog
        assert reasons[0] is FinishReason.CANCELLED
    finally:
        eng.stop()


async def test_the_time_cap_ends_with_length_and_reason_timeout() -> None:
    runner = FakeRunner(step_delay=0.002)
    eng = make(runner, seq_ctx=100000)
    try:
        r = req("a", max_tokens=90000)
        r.max_time = 0.05
        _, reasons, outs = await run(eng, r)
        assert reasons[0] is FinishReason.LENGTH
        assert [d.stop_reason for o in outs for d in o.deltas if d.finish_reason] == [StopKind.TIMEOUT]
        assert eng.stats.cancelled == 0
    finally:
        eng.stop()


async def test_the_time_cap_counts_from_the_first_token_not_the_prefill() -> None:
    """The prompt's decode is held past the cap; the request still gets its one token (counted
    from arrival it would have ended with none, as `timeout`)."""
    hold = threading.Event()
    hold.set()
    runner = FakeRunner(hold=hold, hold_min_tokens=40)
    eng = make(runner)
    try:
        r = req("a", prompt="x" * 40, max_tokens=1)
        r.max_time = 0.05
        task = asyncio.ensure_future(run(eng, r))
        assert await asyncio.to_thread(runner.held.wait, 30)
        passed = time.monotonic() + 0.1
        await until(lambda: time.monotonic() > passed, "the cap to pass")
        hold.clear()
        texts, reasons, outs = await task
        assert reasons[0] is FinishReason.LENGTH and len(texts[0]) == 1
        assert [d.stop_reason for o in outs for d in o.deltas if d.finish_reason] == [None]
    finally:
        hold.clear()
        eng.stop()


async def test_decode_failure_fails_the_batch_and_the_engine_keeps_serving() -> None:
    runner = FakeRunner(fail_decodes=1)
    eng = make(runner)
    try:
        _, reasons, outs = await run(eng, req("a", max_tokens=5))
        assert reasons[0] is FinishReason.ERROR and outs[-1].error
        texts, reasons, _ = await run(eng, req("b", max_tokens=5))
        assert reasons[0] is FinishReason.LENGTH and texts[0] == expected_text(5, 5)
        assert eng.slots.n_free == runner.n_seq_max
    finally:
        eng.stop()


async def test_logprobs_are_reported_per_token() -> None:
    eng = make()
    try:
        _, _, outs = await run(eng, req("a", max_tokens=3, logprobs=True, top_logprobs=2))
        lps = [lp for o in outs for d in o.deltas for lp in (d.logprobs or [])]
        assert len(lps) == 3
        assert all(lp.logprob <= 0 and len(lp.top) == 2 for lp in lps)
        assert lps[0].top[0][0] == lps[0].token_id  # greedy: the sampled token is the most likely
    finally:
        eng.stop()


def test_many_threads_submitting_and_aborting_leave_nothing_behind() -> None:
    runner = FakeRunner(n_seq_max=4)
    eng = make(runner, seq_ctx=100000)
    done = threading.Event()
    finished: list[str] = []
    lock = threading.Lock()

    def sink_for(rid: str):
        def sink(out: RequestOutput) -> None:
            if out.finished:
                with lock:
                    finished.append(rid)
                    if len(finished) == 200:
                        done.set()
        return sink

    def worker(base: int) -> None:
        for i in range(50):
            rid = f"{base}-{i}"
            eng.submit(req(rid, max_tokens=1000), sink_for(rid))
            eng.abort(rid)

    try:
        threads = [threading.Thread(target=worker, args=(b,)) for b in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert done.wait(60)
        assert sorted(finished) == sorted(f"{b}-{i}" for b in range(4) for i in range(50))
        wait_until(lambda: eng.in_flight == 0 and eng.slots.n_free == 4 and not eng.scheduler.has_work())
    finally:
        eng.stop()


async def test_cache_prompt_false_recomputes_the_whole_prompt() -> None:
    runner = FakeRunner(n_seq_max=1)
    eng = make(runner)
    try:
        await run(eng, req("a", prompt="0123456789", max_tokens=3))
        runner.calls.clear()
        r = req("b", prompt="0123456789AB", max_tokens=3)
        r.cache_prompt = False
        _, _, outs = await run(eng, r)
        assert outs[0].cached_tokens == 0 and len(runner.calls[0][0].tokens) == 12
    finally:
        eng.stop()


def test_2000_cancels_racing_registration_leave_no_run_or_slot_behind() -> None:
    """Cancels by cancel_id race the registration and submission of 2000 runs (some arrive
    first and are stashed, some hit the run mid-flight): every run ends, the registry is empty,
    no engine slot is held."""
    from hearth.api.http.cancels import CancelRegistry

    runner = FakeRunner(n_seq_max=4)
    eng = make(runner, seq_ctx=100000)
    # A stopped clock: a cancel stashed ahead of its run must not expire however slowly the
    # launcher runs (a paused or loaded machine once made the 30 s TTL lapse mid-test).
    registry = CancelRegistry(clock=lambda: 0.0)
    n = 2000
    ended = threading.Semaphore(0)
    reasons: dict[str, FinishReason] = {}
    lock = threading.Lock()

    def launcher() -> None:
        for i in range(n):
            rid = f"r{i}"
            run = registry.open(cancel_id=f"c{i}")

            def sink(out: RequestOutput, rid: str = rid, run: object = run) -> None:
                if out.finished:
                    with lock:
                        reasons[rid] = out.deltas[0].finish_reason  # type: ignore[assignment]
                    registry.close(run)  # type: ignore[arg-type]
                    ended.release()

            eng.submit(req(rid, max_tokens=5000), sink)
            run.token.on_cancel(lambda rid=rid: eng.abort(rid))

    def canceller() -> None:
        for i in range(n):
            registry.cancel(cancel_id=f"c{i}")

    try:
        threads = [threading.Thread(target=launcher), threading.Thread(target=canceller)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for _ in range(n):
            assert ended.acquire(timeout=20)
        assert len(reasons) == n
        assert all(r is FinishReason.CANCELLED for r in reasons.values())
        assert len(registry) == 0 and registry.pending == 0
        wait_until(lambda: eng.in_flight == 0 and eng.slots.n_free == 4 and not eng.scheduler.has_work())
    finally:
        eng.stop()


class _GatedRunner(FakeRunner):
    """Every decode waits for the test to open the gate: a prefill that takes as long as we like."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.entered = threading.Event()

    def decode(self, entries):  # type: ignore[no-untyped-def]
        self.entered.set()
        if not self.gate.wait(60):
            raise RuntimeError("the test never opened the gate")
        return super().decode(entries)


async def test_a_placed_request_hears_of_it_before_its_prefill_runs() -> None:
    """The opening event of every protocol (and the ids a client cancels by) rides on this
    first output: it must not wait for the prefill."""
    runner = _GatedRunner()
    eng = make(runner, seq_ctx=512, budget=64)
    try:
        agen = eng.generate(req("a", prompt="x" * 200, max_tokens=3))
        first = await asyncio.wait_for(agen.__anext__(), 60)
        assert runner.entered.wait(60) and not runner.calls  # the first chunk is still running
        assert (first.prompt_tokens, first.cached_tokens, first.finished) == (200, 0, False)
        assert all(not d.text and d.finish_reason is None for d in first.deltas)
        runner.gate.set()
        rest = [out async for out in agen]
        assert "".join(d.text for o in rest for d in o.deltas) == expected_text(200, 3)
    finally:
        runner.gate.set()
        eng.stop()


async def test_a_reasoning_budget_never_forces_tokens_into_grammar_constrained_output() -> None:
    # regression: the budget's forced "</think>" went into output a grammar was constraining
    from hearth.engine.thinking import ThinkBudget

    eng = make()
    try:
        budget = ThinkBudget(0, list(b"</think>"), starts_inside=True)
        free = EngineRequest("free", list(b"hello"), SamplingParams(temperature=0.0, max_tokens=12), think=budget)
        texts, _, _ = await run(eng, free)
        assert texts[0].startswith("</think>")  # without a grammar the budget does force the marker
        constrained = EngineRequest("g", list(b"hello"), SamplingParams(temperature=0.0, max_tokens=12,
                                                                        grammar='root ::= [a-z]+'), think=budget)
        texts, _, _ = await run(eng, constrained)
        assert texts[0] == expected_text(5, 12)
    finally:
        eng.stop()


async def test_the_loop_detector_stops_a_sequence_with_a_repetition_stop() -> None:
    from hearth.engine.repetition import RepetitionSpec
    from hearth.engine.types import StopKind

    eng = make(seq_ctx=1024)
    period = len(SCRIPT)  # the fake model recites its script forever
    try:
        looping = req("loop", max_tokens=500)
        looping.repetition = RepetitionSpec(min_repeats=3, max_period=64, min_tokens=10)
        texts, reasons, outs = await run(eng, looping)
        assert reasons[0] is FinishReason.STOP
        assert [d.stop_reason for o in outs for d in o.deltas if d.finish_reason] == [StopKind.REPETITION]
        assert texts[0] == expected_text(5, 3 * period)
        off = req("off", max_tokens=200)
        off.repetition = RepetitionSpec(enabled=False)
        _, reasons, _ = await run(eng, off)
        assert reasons[0] is FinishReason.LENGTH
    finally:
        eng.stop()
