"""Session swap spills by class (swap.py): past the RAM budget a `flex` owner's KV leaves RAM
(to disk, or forgotten without a directory) before an interactive session's, however recently
either was used; within a class the least recently used goes first."""

from __future__ import annotations

from pathlib import Path

from hearth.engine.fair_share import Priority
from hearth.engine.fake_runner import FakeRunner
from hearth.engine.swap import SwapStore
from tests.helpers import wait_until
from tests.unit.engine.test_engine import run
from tests.unit.engine.test_engine_sessions import make, sreq

FLEX, DEFAULT, PRIORITY = int(Priority.FLEX), int(Priority.DEFAULT), int(Priority.PRIORITY)
KV = b"x" * 100


def test_without_a_directory_the_flex_entry_is_forgotten_before_an_older_interactive_one() -> None:
    swap = SwapStore(None, ram_budget=2 * len(KV), fingerprint={})
    swap.put("old-chat", [1], KV, DEFAULT)  # the least recently used
    swap.put("batch", [2], KV, FLEX)
    swap.put("new-chat", [3], KV, DEFAULT)
    assert swap.where("batch") is None
    assert swap.where("old-chat") == "host" and swap.where("new-chat") == "host"
    swap.put("urgent", [4], KV, PRIORITY)  # one class: the least recently used goes
    assert swap.where("old-chat") is None and swap.where("new-chat") == "host"


def test_with_a_directory_the_flex_entry_spills_to_disk_first(tmp_path: Path) -> None:
    swap = SwapStore(tmp_path, ram_budget=2 * len(KV), fingerprint={})
    swap.put("old-chat", [1], KV, DEFAULT)
    swap.put("batch", [2], KV, FLEX)
    swap.put("new-chat", [3], KV, DEFAULT)
    wait_until(lambda: swap.ram_bytes() <= swap.ram_budget)
    assert swap.owners() == [("old-chat", "host"), ("batch", "disk"), ("new-chat", "host")]
    assert swap.take("batch") == ([2], KV)  # and it comes back whole


def test_a_put_without_a_class_keeps_the_entry_s_own() -> None:
    swap = SwapStore(None, ram_budget=2 * len(KV), fingerprint={})
    swap.put("batch", [2, 3], KV, FLEX)
    swap.put("batch", [2], KV)  # trimmed (residency.trim_kv): still flex
    swap.put("chat", [1], KV)
    swap.put("chat2", [1], KV, DEFAULT)
    assert swap.where("batch") is None and swap.where("chat") == "host"


async def test_the_engine_swaps_a_flex_session_out_with_its_class(tmp_path: Path) -> None:
    """One slot: each session's turn swaps the one before out of its slot (with the class of
    the turn that filled it); past the budget the flex session's KV is the one on disk."""
    fake = FakeRunner()
    swap = SwapStore(tmp_path, ram_budget=2 * (4 + 4 * 32), fingerprint=fake.fingerprint)
    eng, _ = make(1, swap)
    try:
        await run(eng, sreq("a", [50] * 30, "chat-old", priority=DEFAULT))
        await run(eng, sreq("b", [51] * 30, "batch", priority=FLEX))
        await run(eng, sreq("c", [52] * 30, "chat-new", priority=DEFAULT))
        await run(eng, sreq("d", [53] * 30, "last", priority=DEFAULT))  # swaps chat-new out: 3 in swap
        eng.call(lambda: None).result(60)
        wait_until(lambda: swap.ram_bytes() <= swap.ram_budget)
        assert dict(swap.owners()) == {"chat-old": "host", "batch": "disk", "chat-new": "host"}
    finally:
        eng.stop()
