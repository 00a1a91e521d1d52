"""Admission and batch building: which tokens go into the next decode call.

Pure bookkeeping (no runner calls), so it is unit-tested on its own
(tests/unit/engine/test_scheduler.py). Policy:
- FCFS admission while enough slots are free for all of a request's candidates, and one
  request per session at a time (a session's next turn waits for its running one);
- every decoding sequence gets its one token first (decodes never starve behind prefill),
  followed by the tokens drafted for it this step, if any (speculative decoding: `draft`
  shares out what the budget leaves after those single tokens);
- the rest of the per-step token budget goes to prompt chunks, the highest class first, then
  the oldest request (chunked prefill: a long prompt is spread over several steps, so running
  streams keep flowing and aborts are seen between chunks);
- every token scheduled is `charge`d to its request's tenant (the fair-share tally the
  admission queue picks by, hearth/engine/fair_share.py), prompt chunks and decodes alike.

Classes within a step (issue 40: a `default`/`priority` request's time to first token beside a
`flex` batch). A request's first token comes out of the step that runs its last prompt chunk,
so its time to first token is the step in flight when it arrives, plus its own prefill steps.
Both are kept short of lower-class work:
- *a higher class's prefill runs alone*: while a running request is still prefilling (it has
  no first token yet), the work of every running request of a lower class than the highest
  such prefilling one sits out the step (its decodes and its prompt chunks). Its sequences
  keep their KV and pending token; they run again the step after;
- *patience* (no starvation): lower-class work sits out at most `patience` steps in a row;
  the step after that schedules everyone as if no class were prefilling, so a stream of
  higher-class arrivals slows lower-class decodes down by at most (patience + 1)x, never
  stops them;
- *short lower-class chunks*: prompt chunks of `flex` requests (the lowest class) take at
  most `flex_chunk` tokens per step in all, so the step in flight when an interactive request
  arrives is never a full budget of batch prefill. A flex prompt takes more steps; each runs
  beside the decodes anyway. And the step running when a request of a higher class than all
  its prompt chunks arrives (than all its work, in a decode-only step) is interrupted
  (request_queue.py `put`, the engine's `_decode`): rolled back, it runs again after that
  request's prompt (its decodes of that class and above beside that prompt);
- *smaller lower-class chunks beside a higher class's decode*: while a request above `flex`
  decodes in the step, flex prompt chunks take at most `flex_chunk_beside` tokens in all (a
  thirty-second of the budget by default, at least 8: 16 of 512), so a batch's long prompts slow
  an interactive stream's tokens by a few decode-times per step instead of a whole `flex_chunk`
  (`bench.fairness --only-prefill`, 2 CPU cores: a priority stream beside flex prefills got a
  token every 0.26 s with 128-token chunks, 0.10 s with 32, 0.06 s with 16). The flex prompt
  still advances every step (no starvation), in smaller pieces while interactive streams run;
- *work-conserving*: nothing sits out unless a request of a higher class is prefilling; a
  class alone on the node (a batch with no interactive traffic) gets every step and all of
  the budget except the `flex_chunk` bound on its own prompt chunks.

Tenants within a class (issue 40, the noisy neighbour: tenant B's time to first token while
tenant A keeps many streams). Admission already lets B's first request in at once (a fairness
pause, preempt.py). Its prompt then runs alone as a higher class's does:
- *a newcomer's prefill runs alone*: a *newcomer* is a tenant whose one running request is
  still prefilling (it has no first token yet), of the highest class prefilling, while another
  tenant runs several requests of that class or below (a tenant below its fair share of the
  slots beside one above it). The work of every other request of that class or below sits out
  the step; higher classes' work runs. A tenant running several requests is never a newcomer,
  so A's own new prompts never make A's decodes sit out, and each newcomer request gets this for
  its own prefill only (a few steps);
- the same `patience` bounds it (no starvation), and it is work-conserving: a tenant alone on
  the node, or tenants running one request each, never sit out.
Invariants: a step never schedules a lower-class token while a higher-class request prefills,
nor another tenant's token of the newcomer's class or below while a newcomer prefills, except
on a patience step; `sat_out` counts the steps in a row that left work out and is reset by any
step that did not.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from hearth.engine.fair_share import Priority
from hearth.engine.kv import Placement, SlotTable
from hearth.engine.runner import BatchEntry
from hearth.engine.sequence import ActiveRequest, Phase, Sequence
from hearth.engine.spec_cost import StepCost
from hearth.engine.speculate import plan


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


FLEX = int(Priority.FLEX)  # the lowest class: its prompt chunks are bounded (`flex_chunk`)


class Scheduler:
    def __init__(self, slots: SlotTable, token_budget: int, *, patience: int = 8,
                 flex_chunk: int | None = None, flex_chunk_beside: int | None = None) -> None:
        if token_budget < len(slots.slots):
            raise ValueError("token budget must cover one decode token per slot")
        if patience < 0:
            raise ValueError("patience must be >= 0")
        self.slots = slots
        self.token_budget = token_budget
        self.patience = patience  # steps in a row lower-class work may sit out
        # prompt tokens of flex requests per step (default: a quarter of the budget, at least 32)
        self.flex_chunk = flex_chunk if flex_chunk is not None else max(32, token_budget // 4)
        # ... and while a higher class decodes in the step (default: a thirty-second, at least 8)
        self.flex_chunk_beside = min(self.flex_chunk, flex_chunk_beside if flex_chunk_beside is not None
                                     else max(8, token_budget // 32))
        self.sat_out = 0  # steps in a row that left lower-class work out
        self.yields = 0  # steps that left lower-class work out, in all (reporting)
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

    def draft(self, step_time: Callable[[int], float] | None = None, margin: float = 0.0) -> None:
        """Give each decoding sequence this step's speculative draft, within the token budget
        (one decode token per sequence comes first) and what the sequence may still grow.
        Called before `schedule` when speculation is on; drafting asks no runner. Every
        drafter looks up its guess (scored against what it emits next, drafted or not); how
        much of each guess is drafted is `speculate.plan`'s choice by `step_time(b)`, a decode
        step's time with b tokens (None: the prior line of a default `StepCost`)."""
        decoding = [(ar, seq) for ar in self.running if ar.phase is Phase.DECODE
                    for seq in ar.live_seqs()]
        room = self.token_budget - len(decoding)
        offers: list[tuple[Sequence, list[int], float, int]] = []
        for ar, seq in decoding:
            seq.draft = []
            if seq.drafter is None:
                continue
            mt = ar.req.params.max_tokens
            # the pending token and a draft of k are positions len(tokens) .. len(tokens) + k
            limit = min(ar.max_len - len(seq.slot.tokens) - 1,
                        (mt - seq.n_generated - 1) if mt is not None else room)
            guess = seq.drafter.lookup()
            if guess and limit > 0:
                offers.append((seq, guess, seq.drafter.p, min(len(guess), limit)))
        if not offers or room <= 0:
            return
        lengths = plan([(p, cap) for _, _, p, cap in offers], len(decoding), room,
                       step_time or StepCost().seconds, margin)
        for (seq, guess, _, _), k in zip(offers, lengths, strict=True):
            seq.draft = guess[:k]

    def lead(self) -> int | None:
        """The class whose prefill runs alone this step: the highest class of a running request
        still prefilling, if some running request is of a lower class; else None."""
        prefilling = [ar.req.priority for ar in self.running if ar.phase is Phase.PREFILL]
        if not prefilling:
            return None
        top = max(prefilling)
        return top if any(ar.req.priority < top for ar in self.running) else None

    def newcomers(self) -> tuple[int, frozenset[str]] | None:
        """The newcomers whose prefill runs alone this step, and their class (see "Tenants
        within a class"); None if there are none."""
        prefilling = [ar for ar in self.running if ar.phase is Phase.PREFILL]
        if not prefilling:
            return None
        top = max(ar.req.priority for ar in prefilling)
        counts = Counter(ar.req.tenant for ar in self.running)
        new = frozenset(ar.req.tenant for ar in prefilling if ar.req.priority == top and counts[ar.req.tenant] == 1)
        if not new:
            return None
        below = Counter(ar.req.tenant for ar in self.running if ar.req.priority <= top)
        if not any(n >= 2 and t not in new for t, n in below.items()):
            return None
        return top, new

    def sits_out(self) -> Callable[[ActiveRequest], bool] | None:
        """Whose work sits out this step (a higher class prefilling, else newcomers
        prefilling), or None if everyone runs (nobody to yield to, or a patience step)."""
        if self.sat_out >= self.patience:
            return None  # patience: everyone runs this step
        lead, found = self.lead(), self.newcomers()
        if found is not None:
            top, new = found  # top >= lead: both are the highest class prefilling
            return lambda ar: ar.req.priority <= top and ar.req.tenant not in new
        if lead is not None:
            return lambda ar: ar.req.priority < lead
        return None

    def schedule(self) -> list[Work]:
        work: list[Work] = []
        budget = self.token_budget
        out = self.sits_out()
        left_out = False
        for ar in self.running:
            if ar.phase is not Phase.DECODE:
                continue
            if out is not None and out(ar):
                for seq in ar.live_seqs():
                    seq.draft = []
                left_out = True
                continue
            for seq in ar.live_seqs():
                assert seq.pending is not None
                tokens = [seq.pending, *seq.draft]
                entry = BatchEntry(seq.slot.seq_id, tokens, len(seq.slot.tokens), len(tokens))
                work.append(Work(ar, seq, entry))
                budget -= len(tokens)
        beside = any(w.ar.req.priority > FLEX for w in work)  # a higher class decodes in this step
        flex_left = self.flex_chunk_beside if beside else self.flex_chunk
        # the highest class first, then the oldest (sorted is stable)
        for ar in sorted(self.running, key=lambda ar: -ar.req.priority):
            if budget <= 0:
                break
            if ar.phase is not Phase.PREFILL:
                continue
            if out is not None and out(ar):
                left_out = True
                continue
            room = budget
            if ar.req.priority <= FLEX:
                room = min(room, flex_left)
                if room <= 0:
                    continue
            first = ar.seqs[0].slot
            chunk = ar.prompt[ar.prefill_pos: ar.prefill_pos + room]
            done = ar.prefill_pos + len(chunk) == len(ar.prompt)
            work.append(Work(ar, None, BatchEntry(first.seq_id, chunk, ar.prefill_pos, int(done))))
            budget -= len(chunk)
            if ar.req.priority <= FLEX:
                flex_left -= len(chunk)
        if left_out:
            self.sat_out += 1
            self.yields += 1
        else:
            self.sat_out = 0
        if self.charge is not None:
            spent: dict[str, int] = {}
            for w in work:
                spent[w.ar.req.tenant] = spent.get(w.ar.req.tenant, 0) + len(w.entry.tokens)
            for tenant, n in spent.items():
                self.charge(tenant, n)
        return work
