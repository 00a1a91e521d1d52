"""Eviction respects the class (hearth/engine/kv.py, prefix_cache/cache.py, residency.py): a
`flex` request's KV goes before an interactive one's, however recently either was used, in the
free slots a new prompt overwrites, in the idle sessions whose slots are swapped out, and in the
prompt cache's blocks; a block an interactive prompt shares keeps the higher class."""

from __future__ import annotations

import asyncio
import threading

import numpy as np

from hearth.engine import Engine, EngineRequest, RequestOutput, SamplingParams
from hearth.engine.fair_share import Priority
from hearth.engine.fake_runner import FakeRunner
from hearth.engine.kv import SlotTable
from hearth.engine.prefix_cache import PrefixCache

FLEX, DEFAULT = int(Priority.FLEX), int(Priority.DEFAULT)
B = 8


def request(rid: str, prompt: str, priority: int, tokens: int) -> EngineRequest:
    sampling = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    return EngineRequest(rid, list(prompt.encode()), sampling, priority=priority, tenant=rid)


class Done:
    def __init__(self) -> None:
        self.done = threading.Event()

    def __call__(self, out: RequestOutput) -> None:
        if out.finished:
            self.done.set()


def test_a_flex_slot_is_overwritten_before_an_older_interactive_one() -> None:
    table = SlotTable(2)
    table.slots[0].tokens, table.slots[0].priority = [1, 2, 3], DEFAULT
    table.slots[1].tokens, table.slots[1].priority = [4, 5, 6], FLEX
    table.release(table.slots[0])
    table.release(table.slots[1])  # the flex slot is the more recently used
    p = table.acquire([9, 9, 9], 1)
    assert p.slots[0] is table.slots[1] and table.slots[0].tokens == [1, 2, 3]
    # same class: least recently used, as before
    table.release(p.slots[0])
    table.slots[1].priority = DEFAULT
    assert table.acquire([8, 8], 1).slots[0] is table.slots[0]


def test_a_flex_sessions_slot_is_swapped_out_before_an_older_interactive_one() -> None:
    table = SlotTable(2)
    for i, (owner, cls) in enumerate((("chat", DEFAULT), ("job", FLEX))):
        table.slots[i].owner, table.slots[i].tokens, table.slots[i].priority = owner, [i, i], cls
    table.release(table.slots[0])
    table.release(table.slots[1])  # "job" used most recently
    p = table.acquire([7, 7], 1, owner="new")
    assert p.evict == [(table.slots[1], "job")]


def state(tokens: list[int]) -> bytes:
    return b"FAKE" + np.asarray(tokens, dtype="<i4").tobytes()


def test_the_prompt_cache_evicts_flex_blocks_first_and_a_shared_block_keeps_the_higher_class() -> None:
    r = FakeRunner()
    per_block = 4 * B
    cache = PrefixCache(r, r.fingerprint, directory=None, ram_budget=3 * per_block, disk_budget=0,
                        block_tokens=B, min_new=1)

    def put(tokens: list[int], priority: int) -> None:
        cache.offer(tokens, lambda: state(tokens), priority=priority)
        assert cache.flush()

    put([1] * B, DEFAULT)  # the oldest: an interactive conversation's
    put([2] * B, FLEX)
    put([2] * B + [3] * B, DEFAULT)  # shares the flex block [2]*B: it becomes interactive too
    put([4] * B, FLEX)  # over budget by one block: the newest, flex, is the one to go
    assert cache.stats().tiers["ram"].evictions == 1
    assert cache.match([4] * B) is None
    assert cache.match([1] * B) is not None and cache.match([2] * B + [3] * B) is not None
    cache.close()


async def test_on_the_engine_a_flex_requests_slot_goes_first() -> None:
    """Two slots: an interactive request, then a flex one (so the flex one's slot is the more
    recently used), then a third unrelated prompt: it takes the flex one's slot, and the
    interactive prompt's KV is still in its slot for its next turn."""
    eng = Engine(FakeRunner(n_seq_max=2), seq_ctx=256)
    eng.start()
    try:
        chat = request("chat", "an interactive conversation", DEFAULT, tokens=4)
        for r in (chat, request("line", "a flex batch line", FLEX, tokens=4),
                  request("other", "something else entirely", DEFAULT, tokens=4)):
            sink = Done()
            eng.submit(r, sink)
            assert await asyncio.to_thread(sink.done.wait, 10)
        held = [bytes(t for t in s.tokens if t < 256) for s in eng.slots.slots]
        assert any(h.startswith(b"an interactive conversation") for h in held), held
        assert not any(h.startswith(b"a flex batch line") for h in held), held
    finally:
        eng.stop()
