"""Which idle sequences a decode call fills (gap_fill.py): only where it saves a graph pass at
less than it costs, and never past the call's token budget or a sequence's context."""

from __future__ import annotations

from hearth.backends.llamacpp.gap_fill import gap_fills
from hearth.engine.runner import BatchEntry


def ones(*ids: int) -> list[BatchEntry]:
    return [BatchEntry(s, [1], 20, 1) for s in ids]


def fills(entries: list[BatchEntry], n_batch: int = 64, seq_ctx: int = 128) -> list[tuple[int, int]]:
    return gap_fills(entries, lambda sid: 20 + sid, n_batch=n_batch, seq_ctx=seq_ctx)


def test_one_idle_sequence_between_three_running_is_filled() -> None:
    assert fills(ones(0, 1, 2, 4)) == [(3, 23)]
    # a prompt chunk beside them: filled too (it would take a third pass after the gap)
    assert fills([*ones(0, 1, 3), BatchEntry(4, [1, 2, 3], 24, 1)]) == [(2, 22)]
    assert fills(ones(0, 1, 3, 4, 6, 7)) == [(2, 22), (5, 25)]


def test_no_fill_where_it_would_not_pay_or_fit() -> None:
    # d idle sequences need 2d + 1 running
    assert fills(ones(0, 2, 4)) == []
    assert fills(ones(0, 2)) == []
    assert fills(ones(0, 3, 4)) == []
    assert fills(ones(0, 1, 2, 3)) == []  # no gap
    # nor where the call has no room for it (a step may fill n_batch exactly)
    full = [*ones(0, 1, 3), BatchEntry(4, [1] * 61, 24, 1)]
    assert sum(len(e.tokens) for e in full) == 64 and fills(full) == []
    # nor where the idle sequence is full (its next position is past its context)
    assert fills(ones(0, 1, 2, 4), seq_ctx=23) == []
