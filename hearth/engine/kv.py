"""KV sequence slots: which tokens each slot's sequence holds, and prefix reuse.

The KV cache has `n_seq_max` sequence ids. A slot records the exact token ids that sit in
its sequence at positions 0..len-1 (the invariant every other module relies on). A free
slot keeps its tokens, so the next request whose prompt shares a prefix with them skips
that part of the prefill (a prefix cache).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field


@dataclass(slots=True)
class Slot:
    seq_id: int
    tokens: list[int] = field(default_factory=list)
    busy: bool = False
    last_used: int = 0


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class SlotTable:
    def __init__(self, n_slots: int) -> None:
        self.slots = [Slot(seq_id=i) for i in range(n_slots)]
        self._clock = itertools.count(1)

    @property
    def n_free(self) -> int:
        return sum(1 for s in self.slots if not s.busy)

    @property
    def n_busy(self) -> int:
        return len(self.slots) - self.n_free

    @property
    def kv_tokens(self) -> int:
        return sum(len(s.tokens) for s in self.slots)

    def acquire(self, prompt: list[int], n: int, reuse_prefix: bool = True) -> tuple[list[Slot], int]:
        """Take `n` free slots for a prompt. The first is the free slot whose tokens share the
        longest prefix with the prompt (ties: least recently used); the others are the least
        recently used. Returns the slots and how many prompt tokens the first already holds
        (always at most len(prompt) - 1, so the last prompt token is decoded for its logits).
        The caller must trim the KV of each slot to what the slot's `tokens` then say."""
        free = [s for s in self.slots if not s.busy]
        if len(free) < n:
            raise RuntimeError("not enough free slots")
        if reuse_prefix:
            first = max(free, key=lambda s: (common_prefix_len(s.tokens, prompt), -s.last_used))
            reuse = min(common_prefix_len(first.tokens, prompt), len(prompt) - 1)
        else:
            first, reuse = min(free, key=lambda s: s.last_used), 0
        rest = sorted((s for s in free if s is not first), key=lambda s: s.last_used)[: n - 1]
        chosen = [first, *rest]
        for s in chosen:
            s.busy = True
            s.last_used = next(self._clock)
        del first.tokens[reuse:]
        for s in rest:
            s.tokens.clear()
        return chosen, reuse

    def release(self, slot: Slot) -> None:
        slot.busy = False
        slot.last_used = next(self._clock)
