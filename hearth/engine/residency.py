"""Residency: what each KV slot holds, and where a session's KV lives when no slot holds it.

The scheduler decides which slots a request gets (`SlotTable.acquire` / `release`: `busy`,
`last_used`); this module decides what they hold (`tokens`, `owner`) and moves KV between
slots, host RAM and disk: session KV through `SwapStore`, stateless prompts' KV through the
durable prompt cache (`PrefixCache`: blocks in RAM and on disk). It is the only part of the
engine that changes a sequence's KV other than by decoding (`Runner.kv_remove` / `kv_copy` / `state_get` / `state_set`).

Thread ownership: every method runs on the engine thread: `place`, `unplace`, `truncate` and
`fork` inside a step; the session-KV methods (`export_kv`, `import_kv`, `drop_kv`, `trim_kv`,
`spill_all`) between steps, through `Engine.call`. The one exception is `kv_where`, a racy
read from any thread, good enough for reporting.

Invariant (the one every other module relies on): a slot's `tokens` are exactly what its KV
sequence holds at positions 0..len-1; every method here keeps it.

Namespaces (`EngineRequest.cache_ns`, one per tenant): a request reuses KV only of its own
namespace, from every source: its first slot, other idle slots, sessions' swapped KV and the
prompt cache. A slot records the namespace of what it holds (`Slot.ns`), a swapped session the
namespace its KV was made in; KV whose namespace is unknown (imported from a snapshot) serves
only its own session.
"""

from __future__ import annotations

import logging

from hearth.engine.kv import Placement, Slot, SlotTable, common_prefix_len
from hearth.engine.prefix_cache import Match, PrefixCache
from hearth.engine.runner import Runner
from hearth.engine.swap import SwapStore
from hearth.engine.types import EngineRequest, EngineStats

log = logging.getLogger("hearth.engine")

MIN_COPY = 16  # prompt tokens a prefix copy from another slot or swapped state must save


class Residency:
    def __init__(self, runner: Runner, slots: SlotTable, swap: SwapStore, stats: EngineStats,
                 cache: PrefixCache | None = None) -> None:
        self.runner = runner
        self.cache = cache  # the durable prompt cache (blocks in RAM and on disk); None: off
        self.slots = slots
        self.swap = swap  # session KV that left its slot (without a directory, in RAM only)
        self.stats = stats  # counts swap_ins and swap_outs
        self._swap_ns: dict[str, str] = {}  # a swapped session's KV namespace (absent: unknown)

    # ---- session KV (between steps, through Engine.call) ----------------------------------------

    def kv_where(self, owner: str) -> tuple[str, int]:
        """(residency, tokens) of a session's KV: resident, host, disk or none. A racy read
        from any thread, good enough for reporting."""
        slot = self.slots.owned_by(owner)
        if slot is not None:
            return "resident", len(slot.tokens)
        return (self.swap.where(owner) or "none"), self.swap.n_tokens(owner)

    def sessions_where(self) -> dict[str, list[str]]:
        """Session ids by residency (resident, host, disk); racy like `kv_where`."""
        out: dict[str, list[str]] = {"resident": sorted(s.owner for s in list(self.slots.slots) if s.owner),
                                     "host": [], "disk": []}
        for owner, where in self.swap.owners():
            out[where].append(owner)
        return out

    def slots_digest(self, ns: str = "") -> tuple[list[str], list[str], list[str]]:
        """(hashes of the full prompt-cache blocks the idle slots hold, the tail keys of their
        last partial blocks, the conversation keys of the stateless requests that filled them):
        the slot tier of the node's digest, for a router. Racy like `kv_where` (each slot's
        tokens are copied at once, under the GIL); a busy slot is left out (what it holds is
        changing, and it is offered to the cache when its request ends). Only namespace `ns`'s
        slots, hashed from its root. Hashing, no lookup:
        call it off the engine thread and the event loop."""
        if self.cache is None:
            return [], [], []
        blocks: set[str] = set()
        tails: set[str] = set()
        keys: set[str] = set()
        for slot in list(self.slots.slots):
            if slot.busy or slot.ns != ns:
                continue
            full, tail = self.cache.slot_digest(list(slot.tokens), ns)
            blocks.update(k.hex() for k in full)
            tails.update(k.hex() for k in tail)
            if slot.key is not None and slot.owner is None:
                keys.add(slot.key)
        return sorted(blocks), sorted(tails), sorted(keys)

    def export_kv(self, owner: str) -> tuple[list[int], bytes] | None:
        """Engine thread: a copy of a session's tokens and KV bytes, wherever they are."""
        slot = self._idle_slot(owner)
        if slot is not None:
            if not slot.tokens:
                return None
            return list(slot.tokens), self.runner.state_get(slot.seq_id)
        return self.swap.peek(owner)

    def drop_kv(self, owner: str) -> None:
        """Engine thread: forget a session's KV (its slot becomes an ordinary free slot)."""
        slot = self._idle_slot(owner)
        if slot is not None:
            self.truncate(slot, 0)
            slot.owner = None
        self.swap.drop(owner)
        self._swap_ns.pop(owner, None)

    def trim_kv(self, owner: str, tokens: list[int]) -> int:
        """Engine thread: cut a session's KV back to its common prefix with `tokens` (after a
        rollback or resize the transcript is shorter); returns the tokens kept. Swapped KV keeps
        its bytes with a shorter token list: placement removes what lies past the tokens."""
        slot = self._idle_slot(owner)
        if slot is not None:
            n = common_prefix_len(slot.tokens, tokens)
            self.truncate(slot, n)
            return n
        got = self.swap.peek(owner)
        if got is None:
            return 0
        n = common_prefix_len(got[0], tokens)
        if n < len(got[0]):
            self.swap.put(owner, got[0][:n], got[1])
        return n

    def import_kv(self, owner: str, tokens: list[int], data: bytes) -> None:
        """Engine thread: make `tokens`/`data` the session's KV (swapped in on its next turn).
        ValueError, and nothing changed, unless `data` is KV this runner lays out, holding at
        least `tokens` (`Runner.kv_checked`, which cuts it to them): crafted KV (a cell count
        past the data, positions out of order, ids out of range) would otherwise fail the
        session's next decode."""
        data = self.runner.kv_checked(tokens, data)
        self.drop_kv(owner)  # its namespace is now unknown: it serves its own session only
        self.swap.put(owner, tokens, data)

    def spill_all(self) -> int:
        """Engine thread: move every idle session's KV out of its slot and write all swapped
        KV to disk (graceful shutdown). Returns how many sessions were written."""
        n = 0
        for slot in self.slots.slots:
            if slot.owner is not None and not slot.busy:
                self._swap_out(slot, slot.owner)
                n += 1
        self.swap.flush()
        return n

    def _idle_slot(self, owner: str) -> Slot | None:
        """The session's slot, if it has one; RuntimeError while its turn runs there."""
        slot = self.slots.owned_by(owner)
        if slot is not None and slot.busy:
            raise RuntimeError(f"session {owner!r} is running")
        return slot

    def evict(self, placement: Placement) -> None:
        """Swap out the idle sessions whose slots `placement` took (`place` does it itself)."""
        for slot, old in placement.evict:
            self._swap_out(slot, old)

    def _swap_out(self, slot: Slot, owner: str) -> None:
        if slot.tokens:
            self.swap.put(owner, list(slot.tokens), self.runner.state_get(slot.seq_id), slot.priority)
            self._swap_ns[owner] = slot.ns
            self.stats.swap_outs += 1
        self.truncate(slot, 0)
        slot.owner = None

    # ---- placement and upkeep (inside a step) ---------------------------------------------------

    def place(self, req: EngineRequest, placement: Placement) -> tuple[int, str | None]:
        """Make the first slot hold the longest usable prefix of the prompt; return its length
        and the tier it came from ("slot", "ram", "disk"; None: nothing reused). The slot may
        hold more than that: the caller `truncate`s it to the returned length.

        Evicted sessions are swapped out first. A session's own KV is used in place
        (resident) or swapped back in; otherwise the longest prefix among the slot itself,
        other idle slots (copied), sessions' swapped KV in RAM and the prompt cache's RAM tier
        (joined from blocks) is used. A copy must save at least MIN_COPY tokens of prefill to
        be worth moving a whole KV stream. What the first slot held is offered to the prompt
        cache before it is dropped (usually already there: requests offer theirs as they end)."""
        owner, prompt, ns = req.owner, req.prompt_tokens, req.cache_ns
        for slot, old in placement.evict:
            self._swap_out(slot, old)
        first = placement.slots[0]
        first.owner, first.key = owner, None
        held_class = first.priority  # the class of what it held (offered below), then the new one's
        offer_held = first.offer  # whether what it held may be offered (below)
        for s in placement.slots:
            s.priority, s.offer = req.priority, req.cache_prompt
        limit = len(prompt) - 1
        if placement.resident:  # the session's own KV, in the namespace it was made in
            return self._served("slot", placement.reuse)
        here = min(common_prefix_len(first.tokens, prompt), limit) if first.ns == ns else 0
        if offer_held and len(first.tokens) - here >= MIN_COPY and self.cache is not None:
            seq_id = first.seq_id
            self.cache.offer(list(first.tokens), lambda: self.runner.state_get(seq_id), ns=first.ns,
                             priority=held_class)
        if first.ns != ns:  # another namespace's KV (offered to the cache under its own): none serves here
            self.truncate(first, 0)
            first.ns = ns
        swapped_ns = self._swap_ns.pop(owner, ns) if owner is not None else ns
        if owner is not None and (where := self.swap.where(owner)) is not None and (got := self.swap.take(owner)):
            tokens, data = got
            try:
                self.runner.state_set(first.seq_id, data)
                first.tokens[:] = tokens
                first.ns = swapped_ns
                self.stats.swap_ins += 1
                return self._served("ram" if where == "host" else where,
                                    min(common_prefix_len(tokens, prompt), limit))
            except ValueError as e:  # incompatible state: re-prefill from the transcript
                log.warning("could not restore the KV of session %s: %s", owner, e)
                self.stats.kv_reprefills += 1
                first.tokens.clear()
        if not req.cache_prompt:
            self.truncate(first, 0)
            return self._served(None, 0)
        best, tier = here, "slot"
        source: Slot | str | Match | None = None
        for slot in self.slots.slots:  # idle slots, their own or sessions', of this namespace
            if not slot.busy and slot is not first and slot.ns == ns:
                n = min(common_prefix_len(slot.tokens, prompt), limit)
                if n > best:
                    best, source = n, slot
        for other, tokens in self.swap.prefix_candidates():
            if self._swap_ns.get(other) != ns:
                continue
            n = min(common_prefix_len(tokens, prompt), limit)
            if n > best:
                best, source = n, other
        if self.cache is not None and (m := self.cache.match(prompt[:limit], ns)) is not None and m.n_tokens > best:
            best, source = m.n_tokens, m
        if best - here < MIN_COPY:
            source = None
        if isinstance(source, Slot):  # llama.cpp copies whole streams between sequences
            self.runner.kv_remove(first.seq_id, 0, -1)
            self.runner.kv_copy(source.seq_id, first.seq_id, -1, -1)
            first.tokens[:] = source.tokens
        elif isinstance(source, str):  # a session's swapped KV in RAM stays its own (peek)
            got = self.swap.peek(source)
            tier = "ram"
            if got is not None:
                self.runner.state_set(first.seq_id, got[1])
                first.tokens[:] = got[0]
        elif isinstance(source, Match):
            assert self.cache is not None
            try:
                self.runner.state_set_blocks(first.seq_id, source.parts)
                first.tokens[:] = prompt[:source.n_tokens]
                self.cache.use(source)
                return min(source.n_tokens, limit), source.tier
            except ValueError as e:  # cannot happen for blocks this runner cut; never fail the request
                log.warning("could not load a cached prefix: %s", e)
                first.tokens.clear()
        n = min(common_prefix_len(first.tokens, prompt), limit)
        return self._served(tier if n else None, n)

    def _served(self, tier: str | None, n: int) -> tuple[int, str | None]:
        """Count where a placement's prefix came from (the cache's report covers every tier)."""
        if self.cache is not None:
            self.cache.record(tier if n else None, n)
        return n, (tier if n else None)

    def offer(self, slot: Slot, req: EngineRequest) -> int:
        """A stateless request ended: offer what its slot holds to the prompt cache (blocks
        up to `keep_tokens` kept, all of them for a keyed conversation), and mark the slot as
        the conversation's. Returns the tokens written at the client's breakpoints."""
        slot.key = req.cache_key
        if self.cache is None or not slot.tokens:
            return 0
        seq_id = slot.seq_id
        keep = len(slot.tokens) if req.cache_key is not None else req.keep_tokens
        return self.cache.offer(list(slot.tokens), lambda: self.runner.state_get(seq_id), keep=keep,
                                counted=min(req.keep_tokens, len(req.prompt_tokens)), ns=slot.ns,
                                priority=req.priority)

    def unplace(self, req: EngineRequest, placement: Placement) -> None:
        """After a failed `place`: the placement's slots hold nothing (a session keeps its slot,
        empty; its next turn re-prefills from the transcript)."""
        for slot in placement.slots:
            self.truncate(slot, 0)
            if slot.owner != req.owner:
                slot.owner = None

    def truncate(self, slot: Slot, n: int) -> None:
        """Keep only the first `n` tokens of a slot's KV (0: empty it; len(tokens): drop what a
        decode wrote past them, e.g. drafted tokens the sampler rejected)."""
        self.runner.kv_remove(slot.seq_id, n, -1)
        del slot.tokens[n:]

    def fork(self, first: Slot, others: list[Slot]) -> None:
        """n > 1: the other candidates' slots start from a copy of the prompt's KV."""
        for slot in others:
            self.runner.kv_remove(slot.seq_id, 0, -1)
            self.runner.kv_copy(first.seq_id, slot.seq_id, -1, -1)
            slot.tokens[:] = first.tokens
            slot.ns = first.ns
