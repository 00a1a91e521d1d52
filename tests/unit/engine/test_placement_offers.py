"""What a placement offers to the prompt cache when it overwrites a free slot (residency.place,
kv.Slot.offer): the slot's previous KV, unless it is a `cache_prompt: false` request's (never
cached: its end does not offer it either) or a paused request's (preempt.py: that request keeps
its own copy and offers its whole KV when it ends; a second `state_get` of the same bytes would
sit on the engine thread in the critical path of the request that paused it).

No verdict depends on timing: requests run one after another on one slot, and the priority
request is submitted from the flex request's own sink (test_preempt.py's way), so the next step
boundary finds the flex request decoding."""

from __future__ import annotations

from hearth.engine import Engine, EngineRequest, SamplingParams
from hearth.engine.fair_share import Priority
from hearth.engine.fake_runner import FakeRunner
from hearth.engine.prefix_cache import PrefixCache
from tests.unit.engine.test_preempt import Collect, run_to_end

FLEX, PRIORITY = int(Priority.FLEX), int(Priority.PRIORITY)


class CountingRunner(FakeRunner):
    """Records the token count of every `state_get` (the fake state is the sequence's tokens)."""

    def __init__(self, n_seq_max: int) -> None:
        super().__init__(n_seq_max=n_seq_max)
        self.gets: list[int] = []

    def state_get(self, seq_id: int) -> bytes:
        data = super().state_get(seq_id)
        self.gets.append((len(data) - 4) // 4)
        return data


def request(rid: str, prompt: str, tokens: int, priority: int = int(Priority.DEFAULT),
            cache_prompt: bool = True) -> EngineRequest:
    sampling = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    return EngineRequest(rid, list(prompt.encode()), sampling, priority=priority, tenant=rid,
                         cache_prompt=cache_prompt)


def engine(runner: FakeRunner) -> tuple[Engine, PrefixCache]:
    cache = PrefixCache(runner, runner.fingerprint, directory=None, ram_budget=1 << 20, disk_budget=0,
                        block_tokens=8, min_new=1)
    return Engine(runner, seq_ctx=256, prefix_cache=cache), cache


async def test_a_cache_prompt_false_requests_kv_is_not_offered_when_its_slot_is_overwritten() -> None:
    private = "a prompt that asked not to be cached, long enough to be worth a copy"
    for cache_prompt in (False, True):  # True: the same run offers it (the check can fail)
        eng, cache = engine(CountingRunner(n_seq_max=1))
        try:  # one after the other: the second waits for the one slot
            await run_to_end(eng, [(request("private", private, 4, cache_prompt=cache_prompt), Collect()),
                                   (request("next", "something else entirely, in the same one slot", 4), Collect())])
            assert cache.flush()
            found = cache.match([*private.encode(), 0])
            assert (found is not None) is cache_prompt, cache_prompt
        finally:
            cache.close()


async def test_a_paused_requests_kv_is_copied_once_not_again_by_the_placement_that_follows() -> None:
    runner = CountingRunner(n_seq_max=1)
    eng, cache = engine(runner)
    try:
        flex = request("flex", "a flex batch line with a prompt of its own to decode", 40, FLEX)
        urgent = request("urgent", "an interactive question arriving meanwhile", 4, PRIORITY)
        urgent_sink = Collect()
        flex_sink = Collect(after=3, hook=lambda: eng.submit(urgent, urgent_sink))
        await run_to_end(eng, [(flex, flex_sink)], (urgent_sink,))
        assert eng.preempt.pauses == 1
        # the pause copied the flex request's KV (its prompt and the tokens it had decoded);
        # the urgent request's placement in that slot did not copy the same KV again
        paused_len = next(n for n in runner.gets if len(flex.prompt_tokens) <= n < len(flex.prompt_tokens) + 40)
        assert runner.gets.count(paused_len) == 1, runner.gets
        # and both requests still offered their whole KV as they ended
        assert cache.flush()
        for r, sink in ((flex, flex_sink), (urgent, urgent_sink)):
            m = cache.match([*r.prompt_tokens, *sink.ids, 0])
            assert m is not None and m.n_tokens >= len(r.prompt_tokens), r.request_id
    finally:
        cache.close()
