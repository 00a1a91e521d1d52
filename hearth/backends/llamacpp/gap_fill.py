"""Which idle sequences get a throwaway token in a decode call, so it takes fewer graph passes.

With one KV stream per sequence, llama.cpp puts only a run of consecutive sequence ids in one
ubatch (`llama_batch_allocr::split_equal`): decode tokens of sequences 0, 1, 2 and 4 take two
graph passes (0-2, then 4), ~30 % more than one pass over five rows (SmolLM2, 2 threads: 28.4
against 25.7 ms; four rows 21.3 ms), and a prompt chunk beside them a third. A gap opens
whenever a sequence between running ones is idle (its request ended; fewer requests run than
there are slots). Each idle sequence inside the running range gets one token at its next
position (no logits), which the runner removes right after the call, so its KV and every other
sequence's output are as without it (tests/unit/backends/llamacpp/test_runner.py).

Only where it pays on the measured curve: a pass costs about two rows (a two-row pass costs two
one-row passes), so `d` idle sequences are filled when at least 2d + 1 sequences run and the
call has room for d more tokens (a step may fill `n_batch` exactly). The runner does not ask
with a shared KV buffer (one pass anyway) or a sliding-window model (a new position there can
drop the window's oldest cells).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hearth.engine.runner import BatchEntry


def gap_fills(entries: Sequence[BatchEntry], next_pos: Callable[[int], int], *, n_batch: int,
              seq_ctx: int) -> list[tuple[int, int]]:
    """(sequence id, position) of each idle sequence to fill in this call; [] if none should
    be. `next_pos(seq_id)`: the position after the last one the sequence holds."""
    if len(entries) < 3:
        return []
    running = {e.seq_id for e in entries}
    idle = [sid for sid in range(min(running), max(running)) if sid not in running]
    if not idle or len(running) < 2 * len(idle) + 1 or sum(len(e.tokens) for e in entries) + len(idle) > n_batch:
        return []
    fills = [(sid, next_pos(sid)) for sid in idle]
    return fills if all(pos < seq_ctx for _, pos in fills) else []
