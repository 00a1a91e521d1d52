"""KV sequence slots: which tokens each slot's sequence holds, and prefix reuse.

The KV cache has `n_seq_max` sequence ids. A slot records the exact token ids that sit in
its sequence at positions 0..len-1 (the invariant every other module relies on). A free
slot keeps its tokens, so the next request whose prompt shares a prefix with them skips
that part of the prefill (a prefix cache).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(slots=True)
class Slot:
    seq_id: int
    tokens: list[int] = field(default_factory=list)
    busy: bool = False
    last_used: int = 0
    owner: str | None = None  # the session whose KV this is (kept between its turns)
    key: str | None = None  # the conversation key of the stateless request that filled it last
    ns: str = ""  # the prompt-cache namespace of what it holds: only that namespace reuses it
    # the admission class of the request that filled it last (fair_share.Priority: 0 flex, 1
    # default, 2 priority; set by residency.place): a free slot of a lower class is overwritten
    # before a higher one's
    priority: int = 1
    # whether what it holds is offered to the prompt cache when a placement overwrites it
    # (residency.place). False for a `cache_prompt: false` request's KV (never cached: the
    # request's end does not offer it either) and for a paused request's (preempt.py: the
    # request keeps its own copy and offers its whole KV when it ends, so an offer at the
    # overwrite would be a second `state_get` of the same bytes on the engine thread, in the
    # critical path of the request that paused it)
    offer: bool = True


@dataclass(slots=True)
class Placement:
    """Where a request runs. `evict` lists slots whose idle session must be swapped out
    before the slot is reused (their `tokens` are still intact); `resident` says the first
    slot already holds the owner's own KV."""

    slots: list[Slot]
    reuse: int
    evict: list[tuple[Slot, str]] = field(default_factory=list)
    resident: bool = False


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
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

    def owned_by(self, owner: str) -> Slot | None:
        return next((s for s in self.slots if s.owner == owner), None)

    def acquire(self, prompt: list[int], n: int, reuse_prefix: bool = True, owner: str | None = None,
                key: str | None = None, ns: str = "") -> Placement:
        """Take `n` free slots for a prompt.

        The first slot is the owner's own (its session KV is resident), else the unowned free
        slot whose tokens share the longest prefix with the prompt if that keeps at least half
        of what it caches, else an empty or the least recently used unowned slot, else the
        least recently used idle session's slot (to be swapped out). Among unowned slots, a
        stranger's (filled by a request without a conversation key, or with `key`) goes before
        one another conversation's key keeps warm. The
        other candidates take unowned slots first, then idle sessions' slots. `reuse` is how
        many prompt tokens the first slot already holds (at most len(prompt) - 1, so the last
        prompt token is decoded for its logits). The caller swaps out `evict`, then trims each
        slot's KV to what its `tokens` say. A slot of another namespace (`ns`) shares nothing
        with the prompt, whatever its tokens. Classes come before recency: of the unowned
        slots to overwrite, one a lower class (`Slot.priority`: a `flex` batch line's) filled goes
        before one an interactive request's KV keeps warm, however recently either was used."""
        free = [s for s in self.slots if not s.busy]
        if len(free) < n:
            raise RuntimeError("not enough free slots")
        mine = self.owned_by(owner) if owner is not None else None
        if mine is not None and mine.busy:
            raise RuntimeError(f"session {owner!r} already has a running request")
        unowned = [s for s in free if s.owner is None]

        def keyed(s: Slot) -> bool:  # warm for another conversation that named itself
            return s.key is not None and s.key != key

        def shared(s: Slot) -> int:
            return common_prefix_len(s.tokens, prompt) if s.ns == ns else 0

        strangers = [s for s in unowned if not keyed(s)] or unowned
        sessions = sorted((s for s in free if s.owner is not None and s is not mine),
                          key=lambda s: (s.priority, s.last_used))
        if mine is not None:
            first = mine
        elif unowned and reuse_prefix:
            best = max(strangers, key=lambda s: (shared(s), -s.last_used))
            # Reuse a slot in place only when most of what it caches is kept (like llama-server's
            # slot similarity): else taking it would destroy another conversation's cache for a
            # short shared prefix (a system prompt), which the engine can copy instead.
            if 2 * shared(best) >= len(best.tokens) > 0:
                first = best
            else:
                first = min(unowned, key=lambda s: (bool(s.tokens), s.priority, keyed(s), s.last_used))
        elif unowned:
            first = min(unowned, key=lambda s: (s.priority, keyed(s), s.last_used))
        else:
            first = sessions[0]
        others = sorted((s for s in unowned if s is not first), key=lambda s: (s.priority, keyed(s), s.last_used))
        others += [s for s in sessions if s is not first]
        chosen = [first, *others[: n - 1]]
        evict = [(s, s.owner) for s in chosen if s.owner is not None and s is not mine]
        reuse = 0
        if not evict or evict[0][0] is not first:
            keep = (common_prefix_len(first.tokens, prompt) if mine is not None
                    else shared(first) if reuse_prefix else 0)
            reuse = min(keep, len(prompt) - 1)
        for s in chosen:
            s.busy = True
            s.last_used = next(self._clock)
        for s in chosen[1:]:
            if s.owner is None:
                s.tokens.clear()
        return Placement(chosen, reuse, evict, resident=mine is not None)

    def release(self, slot: Slot) -> None:
        slot.busy = False
        slot.last_used = next(self._clock)
