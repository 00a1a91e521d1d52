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
when it leaves its slot (residency.py `_swap_out`), into the same swap store (swap.py), under
an owner of its own (`paused~<n>`: no session id can be one) and the request's class, the slot
is released (what it holds stays as a prefix for others, as any freed slot's does) and the
request waits in `paused` with its sequence, sampler, pending token, `prefill_pos`,
`prefill_chunks`, `cached_tokens` and `cache_tier` untouched, and the phase it left
(`Paused.phase`); its stream stays open (the HTTP layer's heartbeats keep it alive), no token
is emitted while it waits. An empty KV (a prompt paused before any of it was decoded or reused)
is not copied at all. Resume: a free slot gets the KV back (`SwapStore.take`, from RAM or read
from disk) with `Runner.state_set`, and the request goes on in the phase it left: decoding from
the pending token, or prefilling from `prefill_pos` (the next chunk starts exactly where the
saved KV ends: no prompt token is decoded twice). The same sampler state and the same KV, so
the output is the one an unpaused run gives (at temperature 0, and with a seed: the sampler's
RNG is the sequence's own and was never touched; a prefilling one has not sampled yet). Its
time cap (`max_time`, counted from its first token) does not run while it is paused: the
deadline moves on by the time it spent paused, so a request paused for a long `priority` run is
not ended on resume by a cap it never had the time to use (a prefilling one has no deadline
yet).

Bounded in RAM (issue 40): paused KV counts in the swap store's one RAM budget
(`--session-ram-mb`) beside the swapped sessions'; past it, the store's writer thread puts it
on disk by its spill order (the lowest class first, then the least recently used: a paused
`flex` request's KV leaves RAM before an interactive session's), and resume reads it back (a
file checked by its checksum: the bytes `state_set` gets are the bytes `state_get` gave, so
the output stays exact). Its entry is dropped, RAM and file, when it resumes (`take`) or its
request ends while paused however it ends (`forget`, through `Engine._end`: aborted or
cancelled, a failed engine step, `Engine.stop`, which aborts everything first; `discard` after
a stop that left any); a paused file left by a killed process is removed when the next one
starts (swap.py). Without a swap directory a paused entry is never forgotten for the budget
(it must resume exact): sessions' KV is forgotten to make room, and a pause that would put
the paused KV alone past the budget is not made
(`SwapStore.room_for_paused`, from `Runner.state_bytes_bound`, asked before anything is
copied): the waiting request then waits for a slot as if nothing could be paused. An engine
built without a store (tests, embedding) has an unbounded one. A KV that cannot be read back
(a file corrupted on disk) ends its request with an error: there is nothing exact to resume.

The read from disk runs on the engine thread, inside the step that resumes the request: one
file read and a memory-speed checksum (xxh3). Measured with qwen2.5-coder-0.5b's f16 KV (12.3
KB a token): 2-9 ms for 2,048 tokens; synthetic KV of 50 and 400 MB ~25 and ~190 ms; the
pause's own `state_get` on this thread costs more (45 ms for 2,048 tokens). It comes once per resume,
when a slot frees, and delays the other streams by that once. Kept on the thread: reading
ahead in another one would hold the freed slot empty (or give it away) while the read runs and
make the resume order depend on reads finishing, against the order above; worth it only for
far larger KV (a big model at a long context), where a prefetch started when the paused
request becomes next to resume would be the way.

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
from hearth.engine.swap import SwapStore, paused_owner

log = logging.getLogger("hearth.engine")


@dataclass(slots=True)
class Paused:
    ar: ActiveRequest
    tokens: list[int]  # what its slot's KV held
    key: str | None  # the swap store's owner of that KV (Runner.state_get); None: empty, not copied
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
        self.swap: SwapStore = residency.swap  # where paused KV waits: RAM, past its budget disk
        self.paused: list[Paused] = []
        self.on_pause: Callable[[str], None] | None = None  # (tenant): FairShare.preempted
        self.pauses = 0
        self.resumes = 0
        self.refused = 0  # pauses not made: no room for the KV in a store without a directory
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
            if victim is None or not self.pause(victim):
                return

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

    def pause(self, ar: ActiveRequest) -> bool:
        """Pause a running request (`victim`'s choice); False, and nothing changed, if its KV
        may not be kept (no swap directory and the budget full of paused KV)."""
        seq = ar.seqs[0]
        slot = seq.slot
        # the step boundary: a prefilling request's KV is its prompt's first prefill_pos tokens
        assert ar.phase is not Phase.PREFILL or len(slot.tokens) == ar.prefill_pos, "KV and prefill_pos disagree"
        key = None
        if slot.tokens:  # nothing to save: none copied
            if not self.swap.room_for_paused(self.runner.state_bytes_bound(len(slot.tokens))):
                if not self.refused:  # asked again at every step while the head waits: said once
                    log.warning("not pausing %s: its KV would put paused KV past the swap store's RAM budget "
                                "and the store has no directory to spill it to", ar.request_id)
                self.refused += 1
                return False
            key = paused_owner(self._order + 1)
            self.swap.put(key, list(slot.tokens), self.runner.state_get(slot.seq_id), ar.req.priority)
        self._order += 1
        self.paused.append(Paused(ar, list(slot.tokens), key, slot.ns, self._order, self.clock(), ar.phase))
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
        return True

    def resume(self) -> list[ActiveRequest]:
        """After admission: bring paused requests back into the free slots that the admitted
        requests still waiting (a session turn behind its running one) leave, best class first.
        Returns the requests whose saved KV could not be read back (a corrupt file): they are
        no longer paused, and the engine ends them with an error."""
        lost: list[ActiveRequest] = []
        while self.paused and self.slots.n_free > sum(ar.req.n for ar in self.scheduler.waiting):
            p = min(self.paused, key=lambda p: (-p.ar.req.priority, p.order))
            self.paused.remove(p)
            data = b""
            if p.key is not None:
                got = self.swap.take(p.key)  # from RAM, or read from disk (checked); forgotten there
                if got is None or got[0] != p.tokens:
                    log.error("could not read back the KV of paused request %s", p.ar.request_id)
                    lost.append(p.ar)
                    continue
                data = got[1]
            self._restore(p, data)
        return lost

    def _restore(self, p: Paused, data: bytes) -> None:
        ar, seq = p.ar, p.ar.seqs[0]
        placement = self.slots.acquire(p.tokens, 1, False, None, None, p.ns)
        self.residency.evict(placement)
        slot = placement.slots[0]
        slot.owner, slot.key, slot.ns, slot.priority = None, None, p.ns, ar.req.priority
        slot.offer = ar.req.cache_prompt
        self.runner.kv_remove(slot.seq_id, 0, -1)
        if data:
            self.runner.state_set(slot.seq_id, data)
        slot.tokens[:] = p.tokens
        seq.slot = slot
        ar.phase = p.phase  # a prefill goes on from prefill_pos: exactly where p.tokens end
        if ar.deadline is not None:  # the time cap does not run while paused
            ar.deadline += self.clock() - p.at
        self.scheduler.running.append(ar)
        self.resumes += 1

    # ---- ends ---------------------------------------------------------------------------

    def saved(self, p: Paused) -> bytes:
        """A paused request's saved KV, left where it is (b"": none saved, or unreadable)."""
        got = self.swap.peek(p.key) if p.key is not None else None
        return got[1] if got is not None else b""

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
        """A paused request ended (aborted, or the engine failed): drop its saved KV (RAM and
        file)."""
        for p in self.paused:
            if p.ar is ar:
                self.paused.remove(p)
                if p.key is not None:
                    self.swap.drop(p.key)
                return True
        return False

    def discard(self) -> None:
        """Drop every paused request's saved KV (the engine thread has stopped without ending
        them: nothing will resume them)."""
        for p in self.paused:
            if p.key is not None:
                self.swap.drop(p.key)
        self.paused.clear()
