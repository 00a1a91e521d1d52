"""The scheduler on its own: admission and batch building, no runner, no thread.

Requests are built with small factories (as vLLM's scheduler tests do), decoding is simulated
by giving a request's candidates a pending token, and a prefill's progress by advancing
`prefill_pos` the way the engine does after a decode. Each test checks one promise of
scheduler.py's docstrings.
"""

from __future__ import annotations

from typing import cast

import pytest

from hearth.engine.kv import SlotTable
from hearth.engine.scheduler import Scheduler, Work
from hearth.engine.sequence import ActiveRequest, Phase, Sequence
from hearth.engine.speculate import Drafter
from hearth.engine.types import EngineRequest, FinishReason, SamplingParams


def create_scheduler(n_slots: int = 4, token_budget: int = 16) -> Scheduler:
    return Scheduler(SlotTable(n_slots), token_budget)


def create_request(rid: str, prompt_len: int = 4, *, n: int = 1, owner: str | None = None,
                   max_tokens: int | None = None, max_len: int = 1024) -> ActiveRequest:
    # Distinct first tokens, so no prompt shares a prefix with another request's slot.
    prompt = [1000 + sum(map(ord, rid)), *range(1, prompt_len)]
    req = EngineRequest(rid, prompt, SamplingParams(max_tokens=max_tokens), n=n, owner=owner)
    return ActiveRequest(req, lambda out: None, max_len=max_len)


def create_requests(n_requests: int, prompt_len: int = 4, **kw: object) -> list[ActiveRequest]:
    return [create_request(f"r{i}", prompt_len, **kw) for i in range(n_requests)]  # type: ignore[arg-type]


def admit_all(sched: Scheduler, ars: list[ActiveRequest]) -> list[ActiveRequest]:
    """Queue `ars`, admit what fits, and give each admitted candidate its sequence (the
    engine's `_setup`, minus the KV and the sampler)."""
    for ar in ars:
        sched.add(ar)
    admitted = []
    for adm in sched.admit():
        adm.ar.seqs.extend(Sequence.placeholder(i, s) for i, s in enumerate(adm.placement.slots))
        admitted.append(adm.ar)
    return admitted


def start_decoding(ar: ActiveRequest, pending: int = 7) -> None:
    """The prompt is in the KV and each candidate has sampled `pending` (the engine's
    `_start_decoding`)."""
    first = ar.seqs[0].slot
    first.tokens[:] = ar.prompt
    ar.prefill_pos = len(ar.prompt)
    for seq in ar.seqs:
        seq.slot.tokens[:] = first.tokens
        seq.pending = pending
    ar.phase = Phase.DECODE


def ran(work: list[Work]) -> None:
    """Apply a decode's prefill chunks the way the engine does (the prompt advances)."""
    for w in work:
        if w.seq is None:
            w.ar.seqs[0].slot.tokens.extend(w.entry.tokens)
            w.ar.prefill_pos += len(w.entry.tokens)


class ListDrafter:
    """A drafter whose guesses are long and always right (p = 1)."""

    p = 1.0

    def __init__(self) -> None:
        self.lookups = 0

    def lookup(self) -> list[int]:
        self.lookups += 1
        return [50 + i for i in range(16)]


def free_rows(b: int) -> float:
    """A decode step's time when extra rows cost nothing: every draft pays."""
    return 1.0


def test_the_budget_must_cover_one_decode_token_per_slot() -> None:
    with pytest.raises(ValueError, match="token budget"):
        create_scheduler(n_slots=4, token_budget=3)
    create_scheduler(n_slots=4, token_budget=4)


def test_admission_is_first_come_first_served_while_slots_last() -> None:
    sched = create_scheduler(n_slots=3)
    ars = create_requests(5)
    admitted = admit_all(sched, ars)
    assert admitted == ars[:3]
    assert [ar.phase for ar in ars] == [Phase.PREFILL] * 3 + [Phase.WAITING] * 2
    assert list(sched.waiting) == ars[3:] and sched.running == ars[:3]
    assert sched.slots.n_free == 0 and sched.admit() == []
    sched.remove(ars[1])  # a slot comes free: the oldest waiting request takes it
    assert [adm.ar for adm in sched.admit()] == [ars[3]]


def test_a_request_needs_a_slot_for_every_candidate_and_blocks_those_behind_it() -> None:
    sched = create_scheduler(n_slots=4)
    first = create_request("a")
    wide, small = create_request("b", n=4), create_request("c")
    admit_all(sched, [first, wide, small])
    # FCFS: the 4-candidate request waits for 4 free slots, and the small one behind it waits too.
    assert sched.running == [first] and list(sched.waiting) == [wide, small]
    sched.remove(first)
    (adm,) = sched.admit()
    assert adm.ar is wide and len({s.seq_id for s in adm.placement.slots}) == 4
    assert sched.slots.n_free == 0 and list(sched.waiting) == [small]


def test_admission_marks_slots_busy_and_starts_the_prefill_at_the_reused_prefix() -> None:
    sched = create_scheduler(n_slots=2)
    a = create_request("a", prompt_len=10)
    sched.add(a)
    (adm,) = sched.admit()
    assert adm.ar is a and a.phase is Phase.PREFILL and sched.running == [a]
    assert len(adm.placement.slots) == 1 and adm.placement.slots[0].busy
    assert a.prefill_pos == a.cached_tokens == adm.placement.reuse == 0
    # A later request whose prompt extends a free slot's tokens is placed there, past them.
    a.seqs.append(Sequence.placeholder(0, adm.placement.slots[0]))
    start_decoding(a)
    sched.remove(a)
    again = ActiveRequest(EngineRequest("b", [*a.prompt, 99], SamplingParams()), lambda out: None, max_len=1024)
    sched.add(again)
    (adm2,) = sched.admit()
    assert adm2.placement.slots[0] is adm.placement.slots[0]
    assert again.prefill_pos == again.cached_tokens == adm2.placement.reuse == len(a.prompt)


def test_one_request_per_session_at_a_time() -> None:
    sched = create_scheduler(n_slots=4)
    turn1, turn2 = create_request("t1", owner="s"), create_request("t2", owner="s")
    other = create_request("o")
    admit_all(sched, [turn1])
    turn1.seqs[0].slot.owner = "s"  # the residency makes the slot the session's (Residency.place)
    admit_all(sched, [turn2, other])
    # The session's next turn waits for its running one, and FCFS keeps the next request behind it.
    assert sched.running == [turn1] and list(sched.waiting) == [turn2, other]
    sched.remove(turn1)
    assert [adm.ar for adm in sched.admit()] == [turn2, other]
    assert turn2.seqs == [] and sched.slots.owned_by("s") is not None
    assert sched.slots.owned_by("s").busy  # type: ignore[union-attr]  # the session's own slot again


def test_decodes_come_first_then_prompt_chunks_oldest_first() -> None:
    sched = create_scheduler(n_slots=4, token_budget=8)
    dec = create_request("d", n=2)
    admit_all(sched, [dec])
    start_decoding(dec, pending=7)
    old, new = create_request("p1", prompt_len=5), create_request("p2", prompt_len=5)
    admit_all(sched, [old, new])
    work = sched.schedule()
    # One token per decoding candidate, at the position after what its slot holds...
    assert [(w.ar, w.seq) for w in work[:2]] == [(dec, dec.seqs[0]), (dec, dec.seqs[1])]
    assert [(w.entry.tokens, w.entry.pos0, w.entry.n_logits) for w in work[:2]] == [([7], 4, 1)] * 2
    # ...then the rest of the budget (8 - 2) to prompts, oldest first: all of p1, a chunk of p2.
    assert [(w.ar, w.seq, len(w.entry.tokens)) for w in work[2:]] == [(old, None, 5), (new, None, 1)]
    assert sum(len(w.entry.tokens) for w in work) == 8


def test_a_long_prompt_is_prefilled_in_chunks_and_asks_for_logits_at_its_last() -> None:
    sched = create_scheduler(n_slots=2, token_budget=4)
    (a,) = admit_all(sched, [create_request("a", prompt_len=10)])
    chunks = []
    while a.prefill_pos < len(a.prompt):
        (w,) = sched.schedule()
        assert w.seq is None and w.entry.seq_id == a.seqs[0].slot.seq_id
        chunks.append((w.entry.tokens, w.entry.pos0, w.entry.n_logits))
        ran([w])
    assert chunks == [(a.prompt[0:4], 0, 0), (a.prompt[4:8], 4, 0), (a.prompt[8:10], 8, 1)]
    assert a.seqs[0].slot.tokens == a.prompt


def test_decodes_are_never_starved_by_a_prefill_and_keep_flowing_between_its_chunks() -> None:
    sched = create_scheduler(n_slots=2, token_budget=4)
    dec, long = create_requests(2, prompt_len=11)
    admit_all(sched, [dec, long])
    start_decoding(dec)
    for step in range(4):  # 10 prompt tokens at 3 a step, while `dec` decodes every step
        work = sched.schedule()
        assert work[0].seq is dec.seqs[0] and len(work[0].entry.tokens) == 1
        assert [len(w.entry.tokens) for w in work[1:]] == [min(3, 11 - 3 * step)]
        ran(work)
    assert long.prefill_pos == len(long.prompt)


def test_a_prompt_waits_when_decodes_take_the_whole_budget() -> None:
    sched = create_scheduler(n_slots=3, token_budget=3)
    decs = create_requests(2)
    admit_all(sched, decs)
    for ar in decs:
        start_decoding(ar)
        ar.seqs[0].draft = [1]  # a draft makes a decode entry longer
    (p,) = admit_all(sched, [create_request("p")])
    work = sched.schedule()
    assert [w.ar for w in work] == decs and [w.entry.tokens for w in work] == [[7, 1], [7, 1]]
    assert p.prefill_pos == 0 and all(w.ar is not p for w in work)


def test_finished_candidates_and_non_running_requests_get_no_work() -> None:
    sched = create_scheduler(n_slots=3)
    (ar,) = admit_all(sched, [create_request("a", n=3)])
    start_decoding(ar)
    ar.seqs[1].finish = FinishReason.STOP
    assert [w.seq for w in sched.schedule()] == [ar.seqs[0], ar.seqs[2]]
    sched.remove(ar)
    assert ar.phase is Phase.DONE and sched.schedule() == [] and not sched.has_work()


def test_remove_frees_the_slots_and_keeps_their_tokens_as_prefix_cache() -> None:
    sched = create_scheduler(n_slots=2)
    running, waiting = create_request("a", n=2), create_request("b")
    admit_all(sched, [running, waiting])
    start_decoding(running)
    slots = [seq.slot for seq in running.seqs]
    assert sched.find("a") is running and sched.find("b") is waiting and sched.find("x") is None
    sched.remove(running)
    assert not any(s.busy for s in slots) and all(s.tokens == running.prompt for s in slots)
    sched.remove(waiting)  # a waiting request leaves the queue without touching slots
    assert waiting.phase is Phase.DONE and not sched.waiting and sched.find("b") is None


def test_drafts_fill_what_the_budget_leaves_after_one_token_per_decoding_sequence() -> None:
    sched = create_scheduler(n_slots=3, token_budget=8)
    ars = create_requests(3)
    admit_all(sched, ars)
    drafters = []
    for ar in ars:
        start_decoding(ar)
        drafters.append(ListDrafter())
        ar.seqs[0].drafter = cast(Drafter, drafters[-1])
    ars[1].seqs[0].drafter = None  # speculation off for this one: no draft, room left to others
    sched.draft(free_rows)
    # 8 - 3 decode tokens = 5 of room; equally sure, the first sequence takes all of it. Both
    # drafters looked up their guess (scored whether drafted or not).
    assert [len(ar.seqs[0].draft) for ar in ars] == [5, 0, 0]
    assert drafters[0].lookups == 1 and drafters[2].lookups == 1
    assert sum(len(w.entry.tokens) for w in sched.schedule()) == 8


def test_a_draft_never_passes_max_tokens_or_the_sequence_length() -> None:
    sched = create_scheduler(n_slots=2, token_budget=32)
    capped = create_request("a", prompt_len=4, max_tokens=3)
    short = create_request("b", prompt_len=4, max_len=8)
    admit_all(sched, [capped, short])
    for ar in (capped, short):
        start_decoding(ar)
        ar.seqs[0].drafter = cast(Drafter, ListDrafter())
    capped.seqs[0].n_generated = 1  # the pending token was the first; 2 more may follow, 1 of them drafted
    sched.draft(free_rows)
    assert len(capped.seqs[0].draft) == 1
    assert len(short.seqs[0].draft) == 8 - 4 - 1  # the pending token's position and the draft fit in max_len


def test_a_new_step_forgets_the_last_steps_draft() -> None:
    sched = create_scheduler(n_slots=1, token_budget=1)
    (ar,) = admit_all(sched, [create_request("a")])
    start_decoding(ar)
    ar.seqs[0].draft = [3, 4]
    ar.seqs[0].drafter = cast(Drafter, ListDrafter())
    sched.draft(free_rows)  # no room past the decode token itself
    assert ar.seqs[0].draft == []
