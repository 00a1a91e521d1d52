from hearth.engine.kv import SlotTable, common_prefix_len


def test_common_prefix_len() -> None:
    assert common_prefix_len([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix_len([], [1]) == 0
    assert common_prefix_len([1, 2], [1, 2]) == 2


def test_acquire_prefers_the_slot_with_the_longest_shared_prefix() -> None:
    table = SlotTable(3)
    table.slots[1].tokens = [1, 2, 3, 4]
    table.slots[2].tokens = [1, 9]
    slots, reuse = table.acquire([1, 2, 3, 7, 8], 1)
    assert slots[0].seq_id == 1 and reuse == 3
    assert slots[0].tokens == [1, 2, 3] and slots[0].busy


def test_reuse_always_leaves_the_last_prompt_token_to_decode() -> None:
    table = SlotTable(1)
    table.slots[0].tokens = [1, 2, 3]
    slots, reuse = table.acquire([1, 2, 3], 1)
    assert reuse == 2 and slots[0].tokens == [1, 2]


def test_extra_candidates_get_cleared_least_recently_used_slots() -> None:
    table = SlotTable(3)
    for s in table.slots:
        s.tokens = [5]
    slots, _ = table.acquire([5, 6], 2)
    assert len(slots) == 2 and slots[1].tokens == []
    assert table.n_free == 1
    for s in slots:
        table.release(s)
    assert table.n_free == 3
