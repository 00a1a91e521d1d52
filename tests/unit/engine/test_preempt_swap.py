"""Paused requests' KV is bounded in RAM (issue 40; preempt.py, swap.py): it waits in the swap
store under an owner of its own (`paused~<n>`, never a session id), counted in the one RAM budget
with the sessions' swapped KV, spilled to disk past it by the store's writer (lowest class first,
then least recently used), read back on resume exactly, and removed, RAM and file, however its
request ends. Without a swap directory it is never forgotten: a pause that would not fit is not
made.

No verdict depends on timing: the urgent request is submitted from the victim's own sink (engine
thread) after its first tokens, and the checks of a paused request run in the urgent request's
first output (engine thread), when the victim certainly waits paused (one slot, held by the urgent
request) and cannot resume before that hook returns. A hook that waits for the writer thread to
put the KV on disk holds the engine there until it has (`wait_until`, no fixed sleep).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from hearth.engine import Engine, EngineRequest
from hearth.engine import swap as swap_module
from hearth.engine.fair_share import Priority
from hearth.engine.preempt import Paused
from hearth.engine.swap import SwapStore, check_owner, is_paused_owner, paused_owner, write_kv_file
from hearth.ids import is_session_id
from tests.helpers import wait_until
from tests.unit.engine.test_engine_sessions import sreq
from tests.unit.engine.test_preempt import Collect, alone, request, run_to_end
from tests.unit.engine.test_preempt_prefill import HookedRunner, kv_tokens

FLEX, DEFAULT, PRIORITY = int(Priority.FLEX), int(Priority.DEFAULT), int(Priority.PRIORITY)
KV = b"x" * 100


def kv_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def only_paused(eng: Engine) -> Paused:
    (p,) = eng.preempt.paused
    assert p.key is not None and is_paused_owner(p.key)
    return p


async def pause_one(swap: SwapStore | None, victim: EngineRequest,
                    on_paused: Callable[[Engine, Paused], None] | None,
                    urgent_tokens: int = 5, runner: HookedRunner | None = None
                    ) -> tuple[Engine, HookedRunner, Collect, Collect]:
    """One slot: `victim` runs, a `priority` request arrives after its first two tokens and
    pauses it (if it may); `on_paused(engine, paused)` runs on the engine thread at the urgent
    request's first output. Returns once both requests ended (the engine stopped)."""
    runner = runner or HookedRunner(n_seq_max=1)
    eng = Engine(runner, seq_ctx=256, swap=swap)
    eng.clock = lambda: 1000.0
    urgent = request("urgent", "urgent!", PRIORITY, tokens=urgent_tokens)
    urgent_sink = (Collect() if on_paused is None else
                   Collect(after=1, hook=lambda: on_paused(eng, eng.preempt.paused[0])))
    victim_sink = Collect(after=2, hook=lambda: eng.submit(urgent, urgent_sink))
    await run_to_end(eng, [(victim, victim_sink)], (urgent_sink,), timeout=30)
    return eng, runner, victim_sink, urgent_sink


# ---- the owner id ------------------------------------------------------------------------------

def test_a_paused_owner_is_never_a_session_id_and_is_refused_as_one(tmp_path: Path) -> None:
    for n in (0, 1, 42, 10**19):
        owner = paused_owner(n)
        assert is_paused_owner(owner) and not is_session_id(owner)
        with pytest.raises(ValueError):
            check_owner(owner)  # the session-file rule (kv.py) never reaches a paused file
    # session ids that look alike are sessions, and never paused owners
    for sid in ("paused-1", "paused.1", "paused_1", "paused1"):
        assert is_session_id(sid) and not is_paused_owner(sid)
    swap = SwapStore(tmp_path, ram_budget=1 << 20, fingerprint={})
    for bad in ("paused~", "paused~x", "paused~1/../../x", "../paused~1", "x~1"):
        with pytest.raises(ValueError):
            swap.put(bad, [1], KV)
    swap.put("paused-1", [1], KV, DEFAULT)
    swap.put(paused_owner(1), [2], KV, FLEX)
    assert swap.where("paused-1") == "host" and swap.where(paused_owner(1)) == "host"
    # a paused entry is no session: not listed, not a prefix source
    assert swap.owners() == [("paused-1", "host")]
    assert [o for o, _ in swap.prefix_candidates()] == ["paused-1"]
    assert swap.take(paused_owner(1)) == ([2], KV) and swap.take("paused-1") == ([1], KV)


# ---- the budget and the spill order (the store alone) --------------------------------------------

def test_paused_kv_counts_in_the_budget_and_spills_by_class_then_recency(tmp_path: Path) -> None:
    swap = SwapStore(tmp_path, ram_budget=2 * len(KV), fingerprint={})
    swap.put("chat", [1], KV, DEFAULT)  # the least recently used
    swap.put(paused_owner(1), [2], KV, FLEX)  # a paused flex request
    assert swap.bytes_held() == swap_module.SwapBytes(session_ram=100, paused_ram=100, paused_disk=0)
    swap.put("chat2", [3], KV, DEFAULT)  # past the budget: the flex paused KV goes, not the older chat
    wait_until(lambda: swap.ram_bytes() <= swap.ram_budget, "the spill")
    assert swap.where(paused_owner(1)) == "disk" and swap.where("chat") == "host"
    assert swap.bytes_held() == swap_module.SwapBytes(session_ram=200, paused_ram=0, paused_disk=100)
    assert kv_files(tmp_path) == [f"{paused_owner(1)}.kv"]
    # a paused request of a higher class than a session (a fairness pause of `priority` work)
    # stays in RAM while the lower-class session goes
    swap.put(paused_owner(2), [4], KV, PRIORITY)
    swap.put("batch-session", [5], KV, FLEX)
    wait_until(lambda: swap.ram_bytes() <= swap.ram_budget, "the spill")
    assert swap.where(paused_owner(2)) == "host" and swap.where("batch-session") == "disk"
    assert swap.take(paused_owner(1)) == ([2], KV)  # read back from disk, whole, and the file gone
    assert f"{paused_owner(1)}.kv" not in kv_files(tmp_path)


def test_without_a_directory_paused_kv_is_never_forgotten_sessions_are() -> None:
    swap = SwapStore(None, ram_budget=250, fingerprint={})
    swap.put("chat", [1], KV, PRIORITY)
    swap.put(paused_owner(1), [2], KV, FLEX)
    assert swap.room_for_paused(100) and not swap.room_for_paused(151)
    swap.put(paused_owner(2), [3], KV, FLEX)  # over the budget: the session goes, whatever its class
    assert swap.where("chat") is None
    assert swap.where(paused_owner(1)) == "host" and swap.where(paused_owner(2)) == "host"
    assert not swap.room_for_paused(51)  # the paused KV alone would pass the budget


def test_a_paused_entry_whose_write_fails_stays_in_ram(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(swap_module, "write_kv_file", broken)
    swap = SwapStore(tmp_path, ram_budget=0, fingerprint={})
    swap.put(paused_owner(1), [1], KV, FLEX)
    swap.put("chat", [2], KV, FLEX)
    wait_until(lambda: swap.where("chat") is None, "the session's failed spill")  # a session's is dropped
    wait_until(lambda: swap._writer is None, "the writer to end")
    assert swap.where(paused_owner(1)) == "host" and swap.take(paused_owner(1)) == ([1], KV)


def test_paused_files_of_a_previous_run_are_removed_at_start_and_never_flushed(tmp_path: Path) -> None:
    write_kv_file(tmp_path / f"{paused_owner(3)}.kv", [1, 2], KV, {})  # a killed process's
    write_kv_file(tmp_path / "chat.kv", [1, 2], KV, {})
    swap = SwapStore(tmp_path, ram_budget=1 << 20, fingerprint={})
    assert kv_files(tmp_path) == ["chat.kv"] and swap.owners() == [("chat", "disk")]
    swap.put(paused_owner(1), [5], KV, FLEX)
    swap.put("chat2", [6], KV, DEFAULT)
    swap.flush()  # graceful shutdown: sessions are written, paused KV is not
    assert kv_files(tmp_path) == ["chat.kv", "chat2.kv"]


# ---- the engine ------------------------------------------------------------------------------

async def test_paused_kv_is_counted_in_ram_and_gone_after_resume(tmp_path: Path) -> None:
    swap = SwapStore(tmp_path, ram_budget=1 << 20, fingerprint=HookedRunner().fingerprint)
    seen: list[tuple[str | None, int, int]] = []

    def look(eng: Engine, p: Paused) -> None:
        p = only_paused(eng)
        held = swap.bytes_held()
        seen.append((swap.where(p.key or ""), held.paused_ram, len(eng.preempt.saved(p))))

    victim = request("victim", "victim prompt", FLEX, tokens=30)
    eng, _, v, _ = await pause_one(swap, victim, look)
    ((where, ram, size),) = seen
    assert where == "host" and ram == size > 0
    assert eng.preempt.pauses == eng.preempt.resumes == 1 and v.ids == alone(victim).ids
    assert len(swap) == 0 and swap.bytes_held() == swap_module.SwapBytes() and kv_files(tmp_path) == []


async def test_past_the_budget_paused_kv_goes_to_disk_and_resumes_exactly(tmp_path: Path) -> None:
    """A budget of zero: the paused KV is written to disk (the hook waits until it is, and the
    RAM copy is gone), then read back on resume: the KV restored holds exactly the tokens it
    had, the output equals a run never paused, no prompt token is decoded twice, and the file
    is removed."""
    swap = SwapStore(tmp_path, ram_budget=0, fingerprint=HookedRunner().fingerprint)
    seen: list[tuple[list[int], bytes]] = []

    def on_disk(eng: Engine, p: Paused) -> None:
        p = only_paused(eng)
        wait_until(lambda: swap.where(p.key or "") == "disk", "the paused KV on disk")
        assert swap.bytes_held().paused_ram == 0 and swap.bytes_held().paused_disk > 0
        assert kv_files(tmp_path) == [f"{p.key}.kv"]
        seen.append((list(p.tokens), (tmp_path / f"{p.key}.kv").read_bytes()))

    victim = request("victim", "victim prompt", FLEX, tokens=30)
    eng, runner, v, urgent = await pause_one(swap, victim, on_disk)
    ((tokens, _),) = seen
    assert runner.restored == [(0, tokens)]  # the one state_set: the KV read back from the file
    assert v.finish == "length" and v.ids == alone(victim).ids and len(v.ids) == 30
    assert urgent.finish == "length"
    assert eng.stats.prompt_tokens == len(victim.prompt_tokens) + len("urgent!")
    assert kv_files(tmp_path) == [] and len(swap) == 0


async def test_a_paused_flex_request_leaves_ram_before_an_interactive_session(tmp_path: Path) -> None:
    """An interactive session's KV, swapped out earlier (older), and a flex request paused later,
    with room in RAM for one of them: the paused flex KV is the one on disk."""
    runner = HookedRunner(n_seq_max=1)
    swap = SwapStore(tmp_path, ram_budget=1 << 20, fingerprint=runner.fingerprint)
    eng = Engine(runner, seq_ctx=256, swap=swap)
    eng.start()
    try:
        chat = Collect()
        eng.submit(sreq("turn", [60] * 40, "chat", priority=PRIORITY), chat)
        assert await asyncio.to_thread(chat.done.wait, 30)
    finally:
        eng.stop()  # writes the session's KV to disk
    assert swap.owners() == [("chat", "disk")]
    chat_kv = swap.take("chat")
    assert chat_kv is not None
    swap.put("chat", *chat_kv, priority=PRIORITY)  # back in RAM, the least recently used entry
    swap.ram_budget = len(chat_kv[1]) + 8  # room for the session's KV, not for the paused one's too
    where: list[tuple[str | None, str | None]] = []

    def look(eng: Engine, p: Paused) -> None:
        p = only_paused(eng)
        wait_until(lambda: swap.ram_bytes() <= swap.ram_budget, "the spill")
        where.append((swap.where("chat"), swap.where(p.key or "")))

    victim = request("victim", "a flex prompt here", FLEX, tokens=20)
    _, _, v, _ = await pause_one(swap, victim, look)
    assert where == [("host", "disk")]
    assert v.ids == alone(victim).ids
    # the stop wrote the session to disk (graceful shutdown); of the paused KV nothing is left
    assert swap.owners() == [("chat", "disk")] and kv_files(tmp_path) == ["chat.kv"]


@pytest.mark.parametrize("on_disk", [False, True])
async def test_a_request_cancelled_while_paused_leaves_no_kv(tmp_path: Path, on_disk: bool) -> None:
    swap = SwapStore(tmp_path, ram_budget=0 if on_disk else 1 << 20, fingerprint=HookedRunner().fingerprint)

    def cancel(eng: Engine, p: Paused) -> None:
        p = only_paused(eng)
        if on_disk:
            wait_until(lambda: swap.where(p.key or "") == "disk", "the paused KV on disk")
        eng.abort("victim")

    eng, _, v, urgent = await pause_one(swap, request("victim", "victim prompt", FLEX, tokens=60), cancel)
    assert v.finish == "cancelled" and eng.preempt.resumes == 0 and urgent.finish == "length"
    assert len(swap) == 0 and kv_files(tmp_path) == []


async def test_a_shutdown_while_paused_leaves_no_kv(tmp_path: Path) -> None:
    """The engine is stopped while the victim waits on disk: its request ends (cancelled), its
    file is removed, and no session file is written for it."""
    swap = SwapStore(tmp_path, ram_budget=0, fingerprint=HookedRunner().fingerprint)
    runner = HookedRunner(n_seq_max=1)
    eng = Engine(runner, seq_ctx=256, swap=swap)
    spilled, go = threading.Event(), threading.Event()

    def hold() -> None:  # engine thread, the victim paused: wait for its file, then for the stop
        p = only_paused(eng)
        wait_until(lambda: swap.where(p.key or "") == "disk", "the paused KV on disk")
        spilled.set()
        assert go.wait(30)

    urgent = request("urgent", "urgent!", PRIORITY, tokens=200)
    urgent_sink = Collect(after=1, hook=hold)
    victim = Collect(after=2, hook=lambda: eng.submit(urgent, urgent_sink))
    eng.start()
    try:
        eng.submit(request("victim", "victim prompt", FLEX, tokens=200), victim)
        assert await asyncio.to_thread(spilled.wait, 30)
        eng.abort_all()  # what stop does first: queued before the engine goes on from the hook
    finally:
        go.set()
        await asyncio.to_thread(eng.stop)
    assert victim.done.is_set() and victim.finish == "cancelled" and urgent_sink.finish == "cancelled"
    assert eng.preempt.resumes == 0 and not eng.preempt.paused
    assert len(swap) == 0 and kv_files(tmp_path) == []


async def test_a_paused_kv_that_cannot_be_read_back_ends_its_request_with_an_error(tmp_path: Path) -> None:
    swap = SwapStore(tmp_path, ram_budget=0, fingerprint=HookedRunner().fingerprint)

    def corrupt(eng: Engine, p: Paused) -> None:
        p = only_paused(eng)
        wait_until(lambda: swap.where(p.key or "") == "disk", "the paused KV on disk")
        path = tmp_path / f"{p.key}.kv"
        raw = bytearray(path.read_bytes())
        raw[-1] ^= 0xFF  # a flipped bit in the KV bytes: the checksum fails
        path.write_bytes(bytes(raw))

    eng, runner, v, urgent = await pause_one(swap, request("victim", "victim prompt", FLEX, tokens=30), corrupt)
    assert v.finish == "error" and urgent.finish == "length"
    assert runner.restored is None and eng.preempt.resumes == 0 and not eng.preempt.paused
    assert len(swap) == 0 and kv_files(tmp_path) == []


async def test_without_a_directory_a_pause_that_does_not_fit_is_not_made() -> None:
    """A budget too small for the victim's KV and no directory: nothing is paused (its KV would
    have to be forgotten); the urgent request waits for the slot and both answer in full."""
    runner = HookedRunner(n_seq_max=1)
    victim = request("victim", "victim prompt", FLEX, tokens=30)
    swap = SwapStore(None, ram_budget=runner.state_bytes_bound(len(victim.prompt_tokens)), fingerprint={})
    eng, _, victim_sink, urgent_sink = await pause_one(swap, victim, None, runner=runner)
    assert eng.preempt.pauses == 0 and eng.preempt.refused >= 1
    assert len(victim_sink.ids) == 30 and urgent_sink.finish == "length"


async def test_without_a_directory_a_pause_that_fits_keeps_its_kv_in_ram() -> None:
    runner = HookedRunner(n_seq_max=1)
    victim = request("victim", "victim prompt", FLEX, tokens=30)
    swap = SwapStore(None, ram_budget=runner.state_bytes_bound(64), fingerprint={})
    seen: list[list[int]] = []

    def look(eng: Engine, p: Paused) -> None:
        p = only_paused(eng)
        assert swap.where(p.key or "") == "host"
        seen.append(kv_tokens(eng.preempt.saved(p)))

    eng, _, v, _ = await pause_one(swap, victim, look)
    assert eng.preempt.pauses == 1 and seen and v.ids == alone(victim).ids and len(swap) == 0
