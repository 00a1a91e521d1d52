"""Session KV in the engine: ownership, swap-out/in through RAM and disk, prefix reuse,
against the fake runner (which checks every decode lands where the KV ends)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hearth.engine import Engine, EngineRequest, SamplingParams
from hearth.engine.fake_runner import FakeRunner
from hearth.engine.prefix_cache import PrefixCache
from hearth.engine.swap import SwapStore, read_kv_file, write_kv_file
from hearth.engine.types import ContextOverflow
from tests.helpers import wait_until
from tests.unit.engine.test_engine import run


def sreq(rid: str, prompt: list[int], owner: str | None, max_tokens: int = 3, **kw: object) -> EngineRequest:
    return EngineRequest(rid, prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens), owner=owner,
                         **kw)  # type: ignore[arg-type]


def kv_consistent(eng: Engine, runner: FakeRunner) -> None:
    for slot in eng.slots.slots:
        assert runner.kv.get(slot.seq_id, []) == slot.tokens, f"slot {slot.seq_id} KV != its tokens"


def make(n_slots: int, swap: SwapStore | None = None, cache_dir: Path | None = None,
         with_cache: bool = False) -> tuple[Engine, FakeRunner]:
    runner = FakeRunner(n_seq_max=n_slots, n_batch=256)
    cache = (PrefixCache(runner, runner.fingerprint, directory=cache_dir, ram_budget=1 << 20, disk_budget=1 << 20,
                         block_tokens=16) if with_cache or cache_dir is not None else None)
    eng = Engine(runner, seq_ctx=1024, swap=swap, prefix_cache=cache)
    eng.start()
    return eng, runner


async def test_a_session_turn_prefills_only_its_new_tokens() -> None:
    eng, runner = make(2)
    try:
        first = list(range(1, 41))
        _, _, outs = await run(eng, sreq("t1", first, "s"))
        assert outs[0].cached_tokens == 0
        slot = eng.slots.owned_by("s")
        assert slot is not None and len(slot.tokens) == 40 + 2  # the last sampled token is not in the KV
        second = [*slot.tokens, 99, 98, 97]
        runner.calls.clear()
        _, _, outs = await run(eng, sreq("t2", second, "s"))
        assert outs[0].cached_tokens == 42
        assert runner.calls[0][0].tokens == [99, 98, 97]
        kv_consistent(eng, runner)
    finally:
        eng.stop()


async def test_twelve_sessions_on_four_slots_all_keep_their_kv() -> None:
    eng, runner = make(4)
    try:
        prompts = {f"s{i}": [100 + i] * 20 + list(range(1, 11)) for i in range(12)}
        for sid, p in prompts.items():
            await run(eng, sreq(f"{sid}-1", p, sid))
            kv_consistent(eng, runner)
        where = [eng.residency.kv_where(sid)[0] for sid in prompts]
        assert where.count("resident") == 4 and where.count("host") == 8
        for sid, p in prompts.items():
            _, n = eng.residency.kv_where(sid)
            assert n == 32
            runner.calls.clear()
            _, _, outs = await run(eng, sreq(f"{sid}-2", [*p, 7, 7], sid))
            # everything but the two tokens generated last turn that the new prompt does not hold
            assert outs[0].cached_tokens == 30
            assert runner.calls[0][0].tokens == [7, 7]
            kv_consistent(eng, runner)
    finally:
        eng.stop()


async def test_swapped_sessions_spill_to_disk_past_the_ram_budget_and_come_back(tmp_path: Path) -> None:
    fake = FakeRunner()
    swap = SwapStore(tmp_path, ram_budget=3 * (4 + 4 * 32), fingerprint=fake.fingerprint)
    eng, runner = make(1, swap)
    try:
        for i in range(6):
            await run(eng, sreq(f"a{i}", [50 + i] * 30, f"s{i}"))
        eng.call(lambda: None).result(60)
        # The spill thread runs in the background: wait until it has brought RAM use under the
        # budget (a fixed 1 s of polling was a race with that thread on a loaded machine).
        wait_until(lambda: swap.ram_bytes() <= swap.ram_budget)
        kinds = [eng.residency.kv_where(f"s{i}")[0] for i in range(6)]
        assert kinds[5] == "resident" and "disk" in kinds and "host" in kinds
        assert swap.ram_bytes() <= swap.ram_budget
        disk_one = kinds.index("disk")
        runner.calls.clear()
        _, _, outs = await run(eng, sreq("back", [*([50 + disk_one] * 30), 1, 2], f"s{disk_one}"))
        assert outs[0].cached_tokens == 30
        assert runner.calls[0][0].tokens == [1, 2]
        assert not (tmp_path / f"s{disk_one}.kv").exists()
        kv_consistent(eng, runner)
    finally:
        eng.stop()


async def test_stateless_requests_reuse_a_prefix_from_an_idle_or_swapped_session() -> None:
    eng, runner = make(2)
    try:
        system = list(range(1, 31))
        await run(eng, sreq("a", [*system, 5], "a"))
        await run(eng, sreq("b", [*system, 6], "b"))
        await run(eng, sreq("c", [*system, 8], "c"))  # "a" is swapped out to make room
        assert eng.residency.kv_where("a")[0] == "host"
        _, _, outs = await run(eng, sreq("x", [*system, 9, 9], None))
        assert outs[0].cached_tokens == 30
        kv_consistent(eng, runner)
        for sid in "abc":  # the sessions' own KV is untouched
            assert eng.residency.kv_where(sid)[1] == 33
    finally:
        eng.stop()


async def test_export_import_and_drop() -> None:
    eng, runner = make(2)
    try:
        await run(eng, sreq("a", [3] * 10, "a"))
        tokens, data = eng.call(lambda: eng.residency.export_kv("a")).result(5)
        assert tokens == eng.slots.owned_by("a").tokens  # type: ignore[union-attr]
        eng.call(lambda: eng.residency.import_kv("copy", tokens, data)).result(5)
        assert eng.residency.kv_where("copy") == ("host", 12)
        _, _, outs = await run(eng, sreq("c", [*tokens, 4], "copy"))
        assert outs[0].cached_tokens == 12
        eng.call(lambda: eng.residency.drop_kv("a")).result(5)
        assert eng.residency.kv_where("a") == ("none", 0)
        kv_consistent(eng, runner)
    finally:
        eng.stop()


async def test_an_incompatible_saved_state_is_re_prefilled() -> None:
    eng, runner = make(1)
    try:
        eng.swap.put("s", [1, 2, 3], b"garbage")
        _, _, outs = await run(eng, sreq("a", [1, 2, 3, 4], "s"))
        assert outs[0].cached_tokens == 0
        kv_consistent(eng, runner)
    finally:
        eng.stop()


def test_max_len_caps_a_session_below_the_context() -> None:
    eng, _ = make(1)
    try:
        with pytest.raises(ContextOverflow):
            eng.validate(sreq("a", [1] * 50, "s", max_tokens=20, max_len=64))
        eng.validate(sreq("b", [1] * 40, "s", max_tokens=20, max_len=64))
    finally:
        eng.stop()


def test_kv_files_reject_corruption_and_other_models(tmp_path: Path) -> None:
    path = tmp_path / "s.kv"
    write_kv_file(path, [1, 2, 3], b"state-bytes", {"m": 1})
    assert read_kv_file(path, {"m": 1}) == ([1, 2, 3], b"state-bytes")
    with pytest.raises(ValueError, match="another model"):
        read_kv_file(path, {"m": 2})
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="checksum"):
        read_kv_file(path, {"m": 1})
    store = SwapStore(tmp_path, 1 << 20, {"m": 1})  # the corrupt file is found at start...
    assert store.where("s") == "disk"
    assert store.take("s") is None  # ...and dropped when read
    assert not path.exists()
    with pytest.raises(ValueError):
        store.put("../evil", [1], b"x")


def test_kv_files_written_with_the_older_sha256_checksum_still_load_and_are_still_checked(tmp_path: Path) -> None:
    import hashlib
    import json
    import struct

    def old_file(data: bytes, digest: str) -> Path:
        path = tmp_path / "old.kv"
        header = json.dumps({"fingerprint": {"m": 1}, "n_tokens": 2, "kv_bytes": len(data),
                             "sha256": digest}).encode()
        path.write_bytes(b"HKV1" + struct.pack("<I", len(header)) + header + struct.pack("<2i", 7, 8) + data)
        return path

    good = hashlib.sha256(b"kv").hexdigest()
    assert read_kv_file(old_file(b"kv", good), {"m": 1}) == ([7, 8], b"kv")
    with pytest.raises(ValueError, match="checksum"):
        read_kv_file(old_file(b"kw", good), {"m": 1})
    new = tmp_path / "new.kv"
    write_kv_file(new, [7, 8], b"kv", {"m": 1})
    assert b'"xxh3_128"' in new.read_bytes() and b'"sha256"' not in new.read_bytes()


async def test_stateless_prompts_pushed_out_of_their_slot_come_back_from_the_prompt_cache() -> None:
    eng, runner = make(1, with_cache=True)
    assert eng.cache is not None
    try:
        a, b = [1] * 40, [2] * 40
        await run(eng, sreq("a1", a, None))
        assert eng.cache.flush()
        await run(eng, sreq("b1", b, None))  # takes the only slot: "a" is in the cache, not lost
        assert eng.cache.flush()
        runner.calls.clear()
        _, _, outs = await run(eng, sreq("a2", [*a, 3, 3], None))
        assert outs[0].cached_tokens == 40 and outs[0].cache_tier == "ram"
        assert runner.calls[0][0].tokens == [3, 3]
        _, _, outs = await run(eng, sreq("b2", [*b, 4], None))  # and so is "b"
        assert outs[0].cached_tokens == 40
        kv_consistent(eng, runner)
    finally:
        eng.stop()


async def test_trim_cuts_resident_and_swapped_kv_to_the_kept_transcript() -> None:
    eng, runner = make(1)
    try:
        prompt = list(range(1, 31))
        await run(eng, sreq("a", prompt, "a"))
        assert eng.residency.kv_where("a") == ("resident", 32)
        kept = eng.call(lambda: eng.residency.trim_kv("a", [*prompt[:20], 77, 78])).result(5)
        assert kept == 20 and eng.residency.kv_where("a") == ("resident", 20)
        kv_consistent(eng, runner)
        _, _, outs = await run(eng, sreq("a2", [*prompt[:20], 5, 6], "a"))  # continues from the cut
        assert outs[0].cached_tokens == 20
        await run(eng, sreq("b", [9] * 12, "b"))  # one slot: "a" is swapped out to RAM
        assert eng.residency.kv_where("a")[0] == "host"
        kept = eng.call(lambda: eng.residency.trim_kv("a", prompt[:10])).result(5)
        assert kept == 10 and eng.residency.kv_where("a") == ("host", 10)
        _, _, outs = await run(eng, sreq("a3", [*prompt[:10], 4, 4], "a"))
        assert outs[0].cached_tokens == 10
        kv_consistent(eng, runner)
    finally:
        eng.stop()


async def test_an_unrelated_burst_takes_strangers_slots_before_a_keyed_conversations() -> None:
    eng, runner = make(3)
    try:
        convo = [7] * 30
        await run(eng, sreq("k1", convo, None, cache_key="conv-1"))  # the oldest slot: LRU would take it first
        await run(eng, sreq("x1", [8] * 30, None))
        await run(eng, sreq("x2", [9] * 30, None))
        for i in range(4):  # unrelated prompts, no key
            await run(eng, sreq(f"burst{i}", [20 + i] * 30, None))
        held = list(next(s for s in eng.slots.slots if s.key == "conv-1").tokens)
        assert held[:30] == convo
        _, _, outs = await run(eng, sreq("k2", [*held, 5, 5], None, cache_key="conv-1"))
        assert outs[0].cached_tokens == len(held) and outs[0].cache_tier == "slot"
        kv_consistent(eng, runner)
    finally:
        eng.stop()


async def test_a_keyed_conversation_yields_its_slot_when_no_stranger_is_left() -> None:
    eng, runner = make(2)
    try:
        await run(eng, sreq("k1", [7] * 30, None, cache_key="a"))
        await run(eng, sreq("k2", [8] * 30, None, cache_key="b"))
        _, _, outs = await run(eng, sreq("x", [9] * 30, None))  # both keyed: the older one goes
        assert outs[-1].finished and outs[-1].error is None
        assert {s.key for s in eng.slots.slots} == {None, "b"}
        kv_consistent(eng, runner)
    finally:
        eng.stop()


async def test_a_decode_that_fails_on_restored_kv_drops_it_and_prefills_again() -> None:
    """Crafted KV can pass every check and still fail the decode on top of it (issue 27): the
    turn re-prefills its whole prompt, once, answers as a session without KV would, and says so
    in the stats; a stateless request (no restored KV) still fails as before."""
    eng, runner = make(2)
    try:
        prompt = list(range(1, 41))
        await run(eng, sreq("t1", prompt, "s"))
        eng.call(eng.residency.spill_all).result(10)  # its KV now comes back from the swap
        slot = eng.slots.owned_by("s")
        assert slot is None or not slot.tokens
        runner.fail_decodes = 1
        runner.calls.clear()
        texts, reasons, _ = await run(eng, sreq("t2", [*prompt, 5, 6, 7], "s"))
        assert reasons[0] != "error"
        first = runner.calls[0][0]  # (the failed decode is not recorded)
        assert first.pos0 == 0 and first.tokens[:3] == [1, 2, 3]  # prefilled again from the first token
        assert eng.stats.kv_reprefills == 1
        kv_consistent(eng, runner)
        clean, _, _ = await run(eng, sreq("t3", [*prompt, 5, 6, 7], "other", cache_prompt=False))
        assert texts == clean  # the answer of the same prompt prefilled from scratch
        runner.fail_decodes = 1
        _, reasons, _ = await run(eng, sreq("t4", [9, 9, 9], None))
        assert reasons[0] == "error"
    finally:
        eng.stop()
