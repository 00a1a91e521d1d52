"""Preemption: a running request of a lower class pauses for a waiting one of a higher class,
and resumes later with zero re-prefill. It may be generating or still in its (chunked) prefill.

Engine thread only, at the step boundary (`Engine._step` calls `make_room` before admission
and `resume` after it), so a paused request's KV is exactly its slot's `tokens` (the module
invariant of residency.py) and nothing of a half-done step is in flight (a step interrupted
by the arrival was rolled back whole: its prompt chunk is not in `tokens`, nor in
`prefill_pos`). A decoding candidate has its pending token sampled and emitted but not yet
decoded; a prefilling one has the first `prefill_pos` prompt tokens in its KV (`tokens` is
exactly `prompt[:prefill_pos]`) and the rest of its prompt still to go.

Pause: the slot's KV is copied to host RAM with `Runner.state_get`, as an idle session's is
when it leaves its slot (residency.py `_swap_out`), the slot is released (what it holds stays
as a prefix for others, as any freed slot's does) and the request waits in `paused` with its
sequence, sampler, pending token, `prefill_pos`, `prefill_chunks`, `cached_tokens` and
`cache_tier` untouched, and the phase it left (`Paused.phase`); its stream stays open (the HTTP
layer's heartbeats keep it alive), no token is emitted while it waits. An empty KV (a prompt
paused before any of it was decoded or reused) is not copied at all. Resume: a free slot gets
the KV back with `Runner.state_set`, and the request goes on in the phase it left: decoding
from the pending token, or prefilling from `prefill_pos` (the next chunk starts exactly where
the saved KV ends: no prompt token is decoded twice). The same sampler state and the same KV,
so the output is the one an unpaused run gives (at temperature 0, and with a seed: the
sampler's RNG is the sequence's own and was never touched; a prefilling one has not sampled
yet). Its time cap (`max_time`, counted from its first token) does not run while it is paused:
the deadline moves on by the time it spent paused, so a request paused for a long `priority`
run is not ended on resume by a cap it never had the time to use (a prefilling one has no
deadline yet).

A request paused with nothing of its own prefilled (its KV only the prefix its placement
reused, `prefill_pos == cached_tokens`) is paused the same way, not sent back to `waiting`:
going back would place it again (a second `Residency.place`: another reuse, maybe from another
tier, so its reported `cached_tokens`/`cache_tier` and the engine's `cached_tokens` count would
change or count twice, a second "placed" output, new sequences and samplers) and would put it
among the admitted requests, ahead of requests paused before it. Saved, it resumes exactly as
placed, in the resume order of every paused request; its KV copy is only the reused prefix.

Who may be paused (`victim`): a stateless request (no session: a session's slot is its warm
KV, which the session manager tracks), with one candidate (`n` > 1 shares the prompt's KV
between slots), decoding or prefilling, of a class strictly below the waiting one; the lowest
class first, then one still in its prefill before one generating, then the one admitted last.
Or, for a request of a tenant running `mine` (paused ones counted), one of its own class from
the tenant that runs the most, if that tenant runs at least mine + 2 (fair shares of the slots,
`fair_share.slot_share_room`: a tenant's requests do not wait behind another tenant's many for
a slot to free); of that tenant's, again one prefilling first, then the one admitted last.

Why a prefilling victim first: it has produced no token, so pausing it delays its first token
and stalls no stream a client is reading; and a prefill is the heaviest work a slot can hold
(up to a chunk of the token budget each step, against one token for a decode), so pausing it
frees the most of every following step for the request that pauses it: a decoding victim paused
instead would leave the prompt chunks running beside that request's own decode steps, each of
them several times a decode-only step's time. Its KV may be larger (a long prompt far along) or
smaller than a decoding one's; the copy to RAM is a memory copy either way, short beside a step.

Who resumes: the highest class first, then the one paused first, into slots no admitted
request waits for (admission (backends/local/admission.py) overcommits the slots only for a
higher class and counts the paused requests as running, so resumes never crowd out what it
admitted). A resumed request joins the end of `running` (admitted last, for `victim`); a
resumed prefill is prefilling as any other (scheduler.py: its class or its tenant may lead a
step again, as before its pause).
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from hearth.engine.fair_share import Priority, slot_share_room
from hearth.engine.kv import Slot, SlotTable
from hearth.engine.residency import Residency
from hearth.engine.runner import Runner
from hearth.engine.scheduler import Scheduler
from hearth.engine.sequence import ActiveRequest, Phase

log = logging.getLogger("hearth.engine")


@dataclass(slots=True)
class Paused:
    ar: ActiveRequest
    tokens: list[int]  # what its slot's KV held
    data: bytes  # that KV (Runner.state_get)
    ns: str  # the slot's prompt-cache namespace
    order: int
    at: float  # when it was paused (the engine's clock): its deadline moves on by the pause
    phase: Phase  # what it resumes to: DECODE (a pending token to decode) or PREFILL (from prefill_pos)


def detached(seq_id: int) -> Slot:
    """What a paused candidate's `slot` points at while it holds none: empty, busy, never in
    the slot table (an abort that ends it offers nothing and frees nothing real)."""
    return Slot(seq_id=seq_id, busy=True)


class Preemptor:
    def __init__(self, runner: Runner, slots: SlotTable, scheduler: Scheduler, residency: Residency,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.runner = runner
        self.clock = clock
        self.slots = slots
        self.scheduler = scheduler
        self.residency = residency
        self.paused: list[Paused] = []
        self.on_pause: Callable[[str], None] | None = None  # (tenant): FairShare.preempted
        self.pauses = 0
        self.resumes = 0
        self._order = 0

    # ---- what the engine asks each step ----------------------------------------------------

    def make_room(self) -> None:
        """Before admission: order the waiting requests by class, then the requests of tenants
        with nothing running or paused first (stable: FCFS otherwise, and within a tenant), then
        pause running ones until the first waiting request fits (`victim`). A newcomer taken in
        the same step as requests of a tenant running several thus gets the free slot first,
        instead of waiting a step for a fairness pause while they fill it."""
        sched = self.scheduler
        if not sched.waiting:
            return
        busy = {ar.req.tenant for ar in sched.running} | {p.ar.req.tenant for p in self.paused}

        def order(ar: ActiveRequest) -> tuple[int, bool]:
            return -ar.req.priority, ar.req.tenant in busy

        first = order(sched.waiting[0])
        if any(order(ar) != first for ar in sched.waiting):
            sched.waiting = deque(sorted(sched.waiting, key=order))
        head = sched.waiting[0]
        while head.req.n > self.slots.n_free:
            victim = self.victim(head)
            if victim is None:
                return
            self.pause(victim)

    def victim(self, head: ActiveRequest) -> ActiveRequest | None:
        """The running request to pause for `head`; None if none may be. A lower class first
        (the lowest, then one prefilling before one decoding, then the one admitted last: the
        least far along); else one of its class of the tenant running the most, if that one
        runs at least two more than `head`'s tenant (fair shares of the slots; the admission
        queue lets `head` in by the same rule), again one prefilling first. See the module
        docstring for why a prefilling one goes first."""
        running = self.scheduler.running
        pausable = [ar for ar in running if ar.req.owner is None and ar.req.n == 1
                    and ar.phase in (Phase.DECODE, Phase.PREFILL) and len(ar.live_seqs()) == 1
                    and ar.req.priority <= head.req.priority]
        lower = [ar for ar in pausable if ar.req.priority < head.req.priority]
        if lower:
            return min(lower, key=lambda ar: (ar.req.priority, ar.phase is not Phase.PREFILL, -running.index(ar)))
        if head.req.n != 1:
            return None
        counts = Counter(ar.req.tenant for ar in running)
        mine = counts[head.req.tenant] + sum(1 for p in self.paused if p.ar.req.tenant == head.req.tenant)
        hogs = [ar for ar in pausable
                if ar.req.tenant != head.req.tenant and slot_share_room(mine, counts[ar.req.tenant]) > 0]
        if not hogs:
            return None
        return max(hogs, key=lambda ar: (counts[ar.req.tenant], ar.phase is Phase.PREFILL, running.index(ar)))

    def pause(self, ar: ActiveRequest) -> None:
        seq = ar.seqs[0]
        slot = seq.slot
        # the step boundary: a prefilling request's KV is its prompt's first prefill_pos tokens
        assert ar.phase is not Phase.PREFILL or len(slot.tokens) == ar.prefill_pos, "KV and prefill_pos disagree"
        data = self.runner.state_get(slot.seq_id) if slot.tokens else b""  # nothing to save: none copied
        self._order += 1
        self.paused.append(Paused(ar, list(slot.tokens), data, slot.ns, self._order, self.clock(), ar.phase))
        self.scheduler.running.remove(ar)
        slot.offer = False  # its KV is in `paused`, offered whole when the request ends (kv.Slot)
        self.slots.release(slot)
        seq.slot = detached(slot.seq_id)
        seq.draft = []
        ar.phase = Phase.WAITING
        self.pauses += 1
        if self.on_pause is not None:
            self.on_pause(ar.req.tenant)
        log.debug("paused %s (class %d, %s) at %d tokens", ar.request_id, ar.req.priority,
                  self.paused[-1].phase.value, len(self.paused[-1].tokens))

    def resume(self) -> None:
        """After admission: bring paused requests back into the free slots that the admitted
        requests still waiting (a session turn behind its running one) leave, best class first."""
        while self.paused and self.slots.n_free > sum(ar.req.n for ar in self.scheduler.waiting):
            p = min(self.paused, key=lambda p: (-p.ar.req.priority, p.order))
            self.paused.remove(p)
            self._restore(p)

    def _restore(self, p: Paused) -> None:
        ar, seq = p.ar, p.ar.seqs[0]
        placement = self.slots.acquire(p.tokens, 1, False, None, None, p.ns)
        self.residency.evict(placement)
        slot = placement.slots[0]
        slot.owner, slot.key, slot.ns, slot.priority = None, None, p.ns, ar.req.priority
        slot.offer = ar.req.cache_prompt
        self.runner.kv_remove(slot.seq_id, 0, -1)
        if p.data:
            self.runner.state_set(slot.seq_id, p.data)
        slot.tokens[:] = p.tokens
        seq.slot = slot
        ar.phase = p.phase  # a prefill goes on from prefill_pos: exactly where p.tokens end
        if ar.deadline is not None:  # the time cap does not run while paused
            ar.deadline += self.clock() - p.at
        self.scheduler.running.append(ar)
        self.resumes += 1

    # ---- ends ---------------------------------------------------------------------------

    def find(self, request_id: str) -> ActiveRequest | None:
        return next((p.ar for p in self.paused if p.ar.request_id == request_id), None)

    def by_class(self) -> dict[str, int]:
        """Paused requests per class name; a racy read from any thread, for reporting."""
        out: dict[str, int] = {}
        for p in list(self.paused):
            name = Priority(p.ar.req.priority).tier
            out[name] = out.get(name, 0) + 1
        return out

    def drain(self) -> list[ActiveRequest]:
        """Every paused request (the engine fails them all after a failed step)."""
        return [p.ar for p in self.paused]

    def forget(self, ar: ActiveRequest) -> bool:
        """A paused request ended (aborted, or the engine failed): drop its saved KV."""
        for p in self.paused:
            if p.ar is ar:
                self.paused.remove(p)
                return True
        return False
