import pytest

from hearth.engine.kv import SlotTable, common_prefix_len


def test_common_prefix_len() -> None:
    assert common_prefix_len([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix_len([], [1]) == 0
    assert common_prefix_len([1, 2], [1, 2]) == 2


def test_acquire_prefers_the_slot_with_the_longest_shared_prefix() -> None:
    table = SlotTable(3)
    table.slots[1].tokens = [1, 2, 3, 4]
    table.slots[2].tokens = [1, 9]
    p = table.acquire([1, 2, 3, 7, 8], 1)
    assert p.slots[0].seq_id == 1 and p.reuse == 3 and p.slots[0].busy
    assert not p.evict and not p.resident


def test_reuse_always_leaves_the_last_prompt_token_to_decode() -> None:
    table = SlotTable(1)
    table.slots[0].tokens = [1, 2, 3]
    p = table.acquire([1, 2, 3], 1)
    assert p.reuse == 2


def test_extra_candidates_get_cleared_least_recently_used_slots() -> None:
    table = SlotTable(3)
    for s in table.slots:
        s.tokens = [5]
    p = table.acquire([5, 6], 2)
    assert len(p.slots) == 2 and p.slots[1].tokens == []
    assert table.n_free == 1
    for s in p.slots:
        table.release(s)
    assert table.n_free == 3


def test_a_session_gets_its_own_resident_slot_back() -> None:
    table = SlotTable(3)
    table.slots[2].owner, table.slots[2].tokens = "a", [1, 2, 3, 4]
    table.slots[0].tokens = [1, 2, 3, 4, 5]  # a longer stateless prefix does not win over the session's own
    p = table.acquire([1, 2, 3, 9], 1, owner="a")
    assert p.slots[0].seq_id == 2 and p.resident and p.reuse == 3 and not p.evict


def test_stateless_requests_do_not_take_idle_sessions_slots_while_unowned_ones_are_free() -> None:
    table = SlotTable(2)
    table.slots[0].owner, table.slots[0].tokens = "a", [1, 2, 3]
    p = table.acquire([1, 2, 3, 4], 1)
    assert p.slots[0].seq_id == 1 and not p.evict and p.reuse == 0


def test_when_only_idle_sessions_remain_the_least_recently_used_is_evicted() -> None:
    table = SlotTable(2)
    for i, owner in enumerate(("a", "b")):
        table.slots[i].owner, table.slots[i].tokens = owner, [i, i]
    table.release(table.slots[1])
    table.release(table.slots[0])  # "a" used most recently
    p = table.acquire([7, 7], 1, owner="c")
    assert p.evict == [(table.slots[1], "b")]
    assert p.slots[0] is table.slots[1] and p.reuse == 0
    assert table.slots[1].tokens == [1, 1], "the caller swaps out before the tokens are dropped"


def test_a_running_session_cannot_be_placed_twice() -> None:
    table = SlotTable(2)
    table.slots[0].owner = "a"
    table.slots[0].busy = True
    with pytest.raises(RuntimeError):
        table.acquire([1], 1, owner="a")
