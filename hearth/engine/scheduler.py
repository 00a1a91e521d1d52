"""Admission and batch building: which tokens go into the next decode call.

Pure bookkeeping (no runner calls), so it is unit-tested on its own
(tests/unit/engine/test_scheduler.py). Policy:
- FCFS admission while enough slots are free for all of a request's candidates, and one
  request per session at a time (a session's next turn waits for its running one);
- every decoding sequence gets its one token first (decodes never starve behind prefill),
  followed by the tokens drafted for it this step, if any (speculative decoding: `draft`
  shares out what the budget leaves after those single tokens);
- the rest of the per-step token budget goes to prompt chunks, oldest request first
  (chunked prefill: a long prompt is spread over several steps, so running streams keep
  flowing and aborts are seen between chunks);
- every token scheduled is `charge`d to its request's tenant (the fair-share tally the
  admission queue picks by, hearth/engine/fair_share.py), prompt chunks and decodes alike.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from hearth.engine.kv import Placement, SlotTable
from hearth.engine.runner import BatchEntry
from hearth.engine.sequence import ActiveRequest, Phase, Sequence


@dataclass(slots=True)
class Work:
    """One batch entry and whom it belongs to. `seq` is None for a prefill chunk."""

    ar: ActiveRequest
    seq: Sequence | None
    entry: BatchEntry


@dataclass(slots=True)
class Admission:
    ar: ActiveRequest
    placement: Placement


class Scheduler:
    def __init__(self, slots: SlotTable, token_budget: int) -> None:
        if token_budget < len(slots.slots):
            raise ValueError("token budget must cover one decode token per slot")
        self.slots = slots
        self.token_budget = token_budget
        self.waiting: deque[ActiveRequest] = deque()
        self.running: list[ActiveRequest] = []
        self.charge: Callable[[str, int], None] | None = None  # (tenant, tokens) per step: FairShare.charge

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, ar: ActiveRequest) -> None:
        self.waiting.append(ar)

    def find(self, request_id: str) -> ActiveRequest | None:
        for ar in (*self.running, *self.waiting):
            if ar.request_id == request_id:
                return ar
        return None

    def remove(self, ar: ActiveRequest) -> None:
        """Forget a request and free its slots (their tokens stay as prefix cache)."""
        if ar in self.running:
            self.running.remove(ar)
            for seq in ar.seqs:
                self.slots.release(seq.slot)
        elif ar in self.waiting:
            self.waiting.remove(ar)
        ar.phase = Phase.DONE

    def admit(self) -> list[Admission]:
        admitted: list[Admission] = []
        while self.waiting and self.waiting[0].req.n <= self.slots.n_free:
            owner = self.waiting[0].req.owner
            mine = self.slots.owned_by(owner) if owner is not None else None
            if mine is not None and mine.busy:  # one request per session at a time
                break
            ar = self.waiting.popleft()
            placement = self.slots.acquire(ar.prompt, ar.req.n, ar.req.cache_prompt, ar.req.owner,
                                            ar.req.cache_key, ar.req.cache_ns)
            ar.phase = Phase.PREFILL
            ar.prefill_pos = placement.reuse  # the engine may raise it (swap-in, prefix copy)
            ar.cached_tokens = placement.reuse
            self.running.append(ar)
            admitted.append(Admission(ar, placement))
        return admitted

    def draft(self, fixed_over_token: float | None = None) -> None:
        """Give each decoding sequence this step's speculative draft, within the token budget
        (one decode token per sequence comes first) and what the sequence may still grow.
        Called before `schedule` when speculation is on; drafting asks no runner.
        `fixed_over_token`: the measured decode cost ratio (None: each drafter's prior)."""
        decoding = [(ar, seq) for ar in self.running if ar.phase is Phase.DECODE
                    for seq in ar.live_seqs()]
        room = self.token_budget - len(decoding)
        for ar, seq in decoding:
            seq.draft = []
            if seq.drafter is None or room <= 0:
                continue
            mt = ar.req.params.max_tokens
            # the pending token and a draft of k are positions len(tokens) .. len(tokens) + k
            limit = min(room, ar.max_len - len(seq.slot.tokens) - 1,
                        (mt - seq.n_generated - 1) if mt is not None else room)
            if limit > 0:
                seq.draft = seq.drafter.propose(limit, len(decoding), fixed_over_token)
                room -= len(seq.draft)

    def schedule(self) -> list[Work]:
        work: list[Work] = []
        budget = self.token_budget
        for ar in self.running:
            if ar.phase is not Phase.DECODE:
                continue
            for seq in ar.live_seqs():
                assert seq.pending is not None
                tokens = [seq.pending, *seq.draft]
                entry = BatchEntry(seq.slot.seq_id, tokens, len(seq.slot.tokens), len(tokens))
                work.append(Work(ar, seq, entry))
                budget -= len(tokens)
        for ar in self.running:
            if budget <= 0:
                break
            if ar.phase is not Phase.PREFILL:
                continue
            first = ar.seqs[0].slot
            chunk = ar.prompt[ar.prefill_pos: ar.prefill_pos + budget]
            done = ar.prefill_pos + len(chunk) == len(ar.prompt)
            work.append(Work(ar, None, BatchEntry(first.seq_id, chunk, ar.prefill_pos, int(done))))
            budget -= len(chunk)
        if self.charge is not None:
            spent: dict[str, int] = {}
            for w in work:
                spent[w.ar.req.tenant] = spent.get(w.ar.req.tenant, 0) + len(w.entry.tokens)
            for tenant, n in spent.items():
                self.charge(tenant, n)
        return work
