"""The engine: one thread that owns the runner and steps all requests together.

    step = take new requests and aborts → apply aborts and deadlines → admit (and tell the
           admitted) → draft → schedule one batch → decode once → sample, detokenize, finish
           → deliver

Invariants:
- only the engine thread touches the runner, the scheduler and the slots;
- aborts are applied at the top of every step, before any decode, so a cancelled request
  never gets another token after the step in which the abort arrived;
- an abort that arrives while a decode holding a prompt chunk runs also interrupts that
  decode (`Runner.interrupt`, polled by llama.cpp between graph nodes): the runner rolls every
  sequence of the batch back to where it was, nothing of the step is applied, and the next
  step ends the aborted request and schedules its neighbours' work again;
- every token a sequence emits goes through `_emit` (finish reasons, stop strings, limits),
  one at a time, also when a speculative draft is accepted several tokens at once;
- every path that ends a request goes through `_end`, which frees its slots and samplers;
- a slot's `tokens` are exactly what its KV holds: drafted tokens the sampler rejected are
  removed from the KV in the same step.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

from hearth.engine.detokenizer import Detokenizer, StopMatch
from hearth.engine.kv import Placement, Slot, SlotTable, common_prefix_len
from hearth.engine.repetition import RepetitionTracker
from hearth.engine.runner import BatchEntry, DecodeAborted, Runner
from hearth.engine.sampler import token_logprob
from hearth.engine.scheduler import Admission, Scheduler, Work
from hearth.engine.sequence import ActiveRequest, Phase, Sequence, Sink
from hearth.engine.speculate import Drafter, SpecConfig
from hearth.engine.swap import SwapStore
from hearth.engine.thinking import ThinkTracker
from hearth.engine.types import (
    ContextOverflow,
    EngineRequest,
    FinishReason,
    RequestOutput,
    SeqDelta,
    StopKind,
)

log = logging.getLogger("hearth.engine")

MIN_COPY = 16  # prompt tokens a prefix copy from another slot or swapped state must save


@dataclass(slots=True)
class EngineStats:
    steps: int = 0
    prompt_tokens: int = 0  # prefilled (not counting reused prefix)
    cached_tokens: int = 0
    generated_tokens: int = 0
    finished: int = 0
    cancelled: int = 0
    swap_outs: int = 0  # session KV moved out of a slot (to RAM)
    swap_ins: int = 0  # session KV restored into a slot
    drafted_tokens: int = 0  # speculative draft tokens verified
    accepted_tokens: int = 0  # of those, the ones the sampler agreed with (emitted without a step of their own)
    interrupted_decodes: int = 0  # decodes stopped midway by an abort (their work re-run)


class _Outputs:
    """Deltas gathered during one step, one RequestOutput per request."""

    def __init__(self) -> None:
        self.by_request: dict[str, tuple[ActiveRequest, RequestOutput]] = {}

    def delta(self, ar: ActiveRequest, index: int) -> SeqDelta:
        _, out = self.by_request.setdefault(
            ar.request_id,
            (ar, RequestOutput(ar.request_id, [], len(ar.prompt), ar.cached_tokens)))
        for d in out.deltas:
            if d.index == index:
                return d
        d = SeqDelta(index)
        out.deltas.append(d)
        return d

    def mark_finished(self, ar: ActiveRequest, error: str | None = None) -> None:
        self.delta(ar, 0)  # make sure the request has an output
        _, out = self.by_request[ar.request_id]
        out.finished = True
        out.error = error


class Engine:
    def __init__(self, runner: Runner, *, seq_ctx: int, token_budget: int | None = None,
                 swap: SwapStore | None = None, spec: SpecConfig | None = None,
                 name: str = "hearth-engine") -> None:
        self.runner = runner
        self.spec = spec  # None: no speculative decoding
        self.seq_ctx = seq_ctx
        self.slots = SlotTable(runner.n_seq_max)
        # Session KV that left its slot. Without a directory it lives in RAM only.
        self.swap = swap if swap is not None else SwapStore(None, 1 << 62, {})
        self.scheduler = Scheduler(self.slots, token_budget or runner.n_batch)
        self.stats = EngineStats()
        self._cv = threading.Condition()
        self._inbox: list[ActiveRequest] = []
        self._aborts: dict[str, FinishReason] = {}
        self._calls: list[tuple[Callable[[], Any], Future[Any]]] = []
        self._known: set[str] = set()  # request ids submitted and not yet ended
        self._in_decode: frozenset[str] = frozenset()  # requests of the interruptible decode running now
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    # ---- public, thread-safe API ------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def abort_all(self) -> None:
        """Cancel every request in flight (at the next step); the engine keeps running."""
        with self._cv:
            for rid in self._known:
                self._aborts.setdefault(rid, FinishReason.CANCELLED)
            if self._in_decode:
                self.runner.interrupt()
            self._cv.notify()

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel everything in flight, write sessions' KV to disk (when the swap store has a
        directory: they survive a graceful restart), and stop the thread."""
        self.abort_all()
        if self._thread.is_alive():
            with self._cv:  # _deliver notifies when the last request has ended
                self._cv.wait_for(lambda: not self._known, timeout)
        if self.swap.dir is not None and self._thread.is_alive():
            try:
                n = self.call(self.spill_all).result(timeout)
                log.info("wrote the KV of %d resident session(s) to disk", n)
            except Exception:
                log.exception("could not write session KV to disk")
        with self._cv:
            self._stopping = True
            calls, self._calls = self._calls, []
            self._cv.notify()
        for _, fut in calls:
            fut.cancel()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def running(self) -> int:
        return len(self.scheduler.running)

    @property
    def waiting(self) -> int:
        return len(self.scheduler.waiting) + len(self._inbox)

    @property
    def in_flight(self) -> int:
        return len(self._known)

    def validate(self, req: EngineRequest) -> None:
        """Raise ValueError (ContextOverflow for size) if the request cannot run."""
        if not req.prompt_tokens:
            raise ValueError("the prompt is empty")
        if not 1 <= req.n <= self.runner.n_seq_max:
            raise ValueError(f"n must be between 1 and {self.runner.n_seq_max} (the server's --parallel)")
        # Sizes before the id scans, so the linear scans (on the caller's thread) stay bounded.
        n_prompt = len(req.prompt_tokens)
        limit = self._max_len(req)
        if n_prompt >= limit:
            raise ContextOverflow(n_prompt, limit)
        mt = req.params.max_tokens
        if mt is not None and n_prompt + mt > limit:
            raise ContextOverflow(n_prompt, limit, mt)
        bad = [t for t in req.prompt_tokens if not 0 <= t < self.runner.n_vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} is out of range [0, {self.runner.n_vocab})")
        bad = [t for t in (*req.params.logit_bias, *req.params.stop_token_ids) if not 0 <= t < self.runner.n_vocab]
        if bad:
            raise ValueError(f"logit_bias / stop token id {bad[0]} is out of range [0, {self.runner.n_vocab})")

    def _max_len(self, req: EngineRequest) -> int:
        return min(self.seq_ctx, req.max_len) if req.max_len else self.seq_ctx

    def submit(self, req: EngineRequest, sink: Sink) -> None:
        """Queue a request; `sink` is called from the engine thread with each RequestOutput."""
        self.validate(req)
        ar = ActiveRequest(req, sink, max_len=self._max_len(req))
        with self._cv:
            if self._stopping:
                raise RuntimeError("the engine is stopping")
            if req.request_id in self._known:
                raise ValueError(f"request id {req.request_id!r} is already in flight")
            self._known.add(req.request_id)
            self._inbox.append(ar)
            self._cv.notify()

    def abort(self, request_id: str, reason: FinishReason = FinishReason.CANCELLED) -> None:
        """Stop a request at the start of the next step, and the decode running now if it holds
        a prompt chunk and this request (see the module invariants). Unknown or finished ids
        are ignored."""
        with self._cv:
            if request_id in self._known:
                self._aborts.setdefault(request_id, reason)
                if request_id in self._in_decode:
                    self.runner.interrupt()
                self._cv.notify()

    async def generate(self, req: EngineRequest,
                       after_submit: Callable[[], None] | None = None) -> AsyncIterator[RequestOutput]:
        """Submit and yield outputs until the request finishes. Leaving the iterator early
        (aclose, cancellation, an exception in the consumer) aborts the request.
        `after_submit` runs once the engine knows the request (abort() works from then on)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[RequestOutput] = asyncio.Queue()

        def sink(out: RequestOutput) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, out)

        self.submit(req, sink)
        if after_submit is not None:
            after_submit()
        finished = False
        try:
            while not finished:
                out = await queue.get()
                finished = out.finished
                yield out
        finally:
            if not finished:
                self.abort(req.request_id)

    # ---- session KV (run on the engine thread, between steps) ----------------------------

    def call(self, fn: Callable[[], Any]) -> Future[Any]:
        """Run `fn` on the engine thread before the next step; its result or exception
        lands in the returned future. Only the engine thread touches the runner."""
        fut: Future[Any] = Future()
        with self._cv:
            if self._stopping:
                raise RuntimeError("the engine is stopping")
            self._calls.append((fn, fut))
            self._cv.notify()
        return fut

    def kv_where(self, owner: str) -> tuple[str, int]:
        """(residency, tokens) of a session's KV: resident, host, disk or none. A racy read
        from any thread, good enough for reporting."""
        slot = self.slots.owned_by(owner)
        if slot is not None:
            return "resident", len(slot.tokens)
        return (self.swap.where(owner) or "none"), self.swap.n_tokens(owner)

    def export_kv(self, owner: str) -> tuple[list[int], bytes] | None:
        """Engine thread: a copy of a session's tokens and KV bytes, wherever they are."""
        slot = self.slots.owned_by(owner)
        if slot is not None:
            if slot.busy:
                raise RuntimeError(f"session {owner!r} is running")
            if not slot.tokens:
                return None
            return list(slot.tokens), self.runner.state_get(slot.seq_id)
        return self.swap.peek(owner)

    def drop_kv(self, owner: str) -> None:
        """Engine thread: forget a session's KV (its slot becomes an ordinary free slot)."""
        slot = self.slots.owned_by(owner)
        if slot is not None:
            if slot.busy:
                raise RuntimeError(f"session {owner!r} is running")
            self.runner.kv_remove(slot.seq_id, 0, -1)
            slot.tokens.clear()
            slot.owner = None
        self.swap.drop(owner)

    def trim_kv(self, owner: str, tokens: list[int]) -> int:
        """Engine thread: cut a session's KV back to its common prefix with `tokens` (after a
        rollback or resize the transcript is shorter); returns the tokens kept. Swapped KV keeps
        its bytes with a shorter token list: placement removes what lies past the tokens."""
        slot = self.slots.owned_by(owner)
        if slot is not None:
            if slot.busy:
                raise RuntimeError(f"session {owner!r} is running")
            n = common_prefix_len(slot.tokens, tokens)
            self.runner.kv_remove(slot.seq_id, n, -1)
            del slot.tokens[n:]
            return n
        got = self.swap.peek(owner)
        if got is None:
            return 0
        n = common_prefix_len(got[0], tokens)
        if n < len(got[0]):
            self.swap.put(owner, got[0][:n], got[1])
        return n

    def import_kv(self, owner: str, tokens: list[int], data: bytes) -> None:
        """Engine thread: make `tokens`/`data` the session's KV (swapped in on its next turn)."""
        self.drop_kv(owner)
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

    def _swap_out(self, slot: Slot, owner: str) -> None:
        if slot.tokens:
            self.swap.put(owner, list(slot.tokens), self.runner.state_get(slot.seq_id))
            self.stats.swap_outs += 1
        self.runner.kv_remove(slot.seq_id, 0, -1)
        slot.tokens.clear()
        slot.owner = None

    # ---- engine thread ------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cv:
                while not (self._stopping or self._inbox or self._aborts or self._calls
                           or self.scheduler.has_work()):
                    self._cv.wait()
                if self._stopping:
                    break
                new, self._inbox = self._inbox, []
                aborts, self._aborts = self._aborts, {}
                calls, self._calls = self._calls, []
            out = _Outputs()
            try:
                self._step(new, aborts, calls, out)
            except Exception:  # the loop must survive anything one step does
                log.exception("engine step failed; failing the running requests")
                self._fail_all("internal engine error", out)
            finally:
                self._deliver(out)
                for _, fut in calls:  # never leave a caller waiting
                    if not fut.done():
                        fut.set_exception(RuntimeError("the engine step failed before this call ran"))

    def _step(self, new: list[ActiveRequest], aborts: dict[str, FinishReason],
              calls: list[tuple[Callable[[], Any], Future[Any]]], out: _Outputs) -> None:
        for ar in new:
            self.scheduler.add(ar)
        for rid, reason in aborts.items():
            found = self.scheduler.find(rid)
            if found is not None:
                self._end(found, reason, out)
        self._expire(out)
        # Calls run after aborts, so a session whose turn was just aborted is idle for them.
        for fn, fut in calls:
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as e:
                    fut.set_exception(e)
        admitted = self.scheduler.admit()
        for adm in admitted:
            self._setup(adm, out)
        if admitted:
            # A placed request hears of it before its first prefill chunk runs, so its stream
            # opens (and can be cancelled by id) while a long prefill is still ahead.
            self._deliver(out)
            out.by_request.clear()
        if self.spec is not None:
            self._draft()
        work = self.scheduler.schedule()
        if work:
            self._run_batch(work, out)

    def _expire(self, out: _Outputs) -> None:
        now = time.monotonic()
        for ar in [*self.scheduler.running, *self.scheduler.waiting]:
            if ar.req.deadline is not None and now >= ar.req.deadline:
                # The time cap is a cancellation (by the server), reported as such on every protocol.
                self._end(ar, FinishReason.CANCELLED, out, stop_reason="timeout")

    def _setup(self, adm: Admission, out: _Outputs) -> None:
        ar, placement = adm.ar, adm.placement
        first = placement.slots[0]
        try:
            reuse = self._place(ar, placement)
        except Exception as e:
            log.exception("could not place %s", ar.request_id)
            for slot in placement.slots:
                self.runner.kv_remove(slot.seq_id, 0, -1)
                slot.tokens.clear()
                if slot.owner != ar.req.owner:
                    slot.owner = None
            ar.seqs.extend(Sequence(i, s, _NullSampler(), Detokenizer()) for i, s in enumerate(placement.slots))
            self._end(ar, FinishReason.ERROR, out, error=f"could not prepare the KV cache: {e}")
            return
        self.runner.kv_remove(first.seq_id, reuse, -1)
        del first.tokens[reuse:]
        ar.prefill_pos = ar.cached_tokens = reuse
        self.stats.cached_tokens += reuse
        params = ar.req.params
        try:
            for i, slot in enumerate(placement.slots):
                p = params
                if i and params.seed is not None:  # candidates must differ, reproducibly
                    p = replace(params, seed=params.seed + i)
                # A grammar owns every token: a forced end-of-thinking marker would break it.
                think = ThinkTracker(ar.req.think) if ar.req.think is not None and p.grammar is None else None
                rep = ar.req.repetition
                repeat = RepetitionTracker(rep) if rep is not None and rep.enabled else None
                ar.seqs.append(Sequence(i, slot, self.runner.new_sampler(p), Detokenizer(list(params.stop)),
                                        think=think, repeat=repeat))
        except Exception as e:
            ar.seqs.extend(Sequence(i, s, _NullSampler(), Detokenizer())
                           for i, s in enumerate(placement.slots) if i >= len(ar.seqs))
            self._end(ar, FinishReason.ERROR, out, error=f"could not set up sampling: {e}")
            return
        out.delta(ar, 0)  # an (empty) output: placed, with its cached token count

    def _place(self, ar: ActiveRequest, placement: Placement) -> int:
        """Make the first slot hold the longest usable prefix of the prompt; return its length.

        Evicted sessions are swapped out first. A session's own KV is used in place
        (resident) or swapped back in; otherwise the longest prefix among the slot itself,
        other idle slots (copied), sessions' swapped KV in RAM and stashed stateless prompts
        (restored) is used. A copy must save at least MIN_COPY tokens of prefill to be worth
        moving a whole KV stream. What the first slot held is stashed before it is dropped."""
        owner, prompt = ar.req.owner, ar.prompt
        for slot, old in placement.evict:
            self._swap_out(slot, old)
        first = placement.slots[0]
        first.owner = owner
        limit = len(prompt) - 1
        if placement.resident:
            return placement.reuse
        here = min(common_prefix_len(first.tokens, prompt), limit)
        if len(first.tokens) - here >= MIN_COPY:  # keep what this slot cached for a later prompt
            self.swap.stash_prefix(first.tokens, self.runner.state_get(first.seq_id))
        if owner is not None and (got := self.swap.take(owner)) is not None:
            tokens, data = got
            try:
                self.runner.state_set(first.seq_id, data)
                first.tokens[:] = tokens
                self.stats.swap_ins += 1
                return min(common_prefix_len(tokens, prompt), limit)
            except ValueError as e:  # incompatible state: re-prefill from the transcript
                log.warning("could not restore the KV of session %s: %s", owner, e)
                first.tokens.clear()
        if not ar.req.cache_prompt:
            self.runner.kv_remove(first.seq_id, 0, -1)
            first.tokens.clear()
            return 0
        best = here
        source: Slot | str | int | None = None
        for slot in self.slots.slots:  # idle slots, their own or sessions'
            if not slot.busy and slot is not first:
                n = min(common_prefix_len(slot.tokens, prompt), limit)
                if n > best:
                    best, source = n, slot
        for other, tokens in self.swap.prefix_candidates():
            n = min(common_prefix_len(tokens, prompt), limit)
            if n > best:
                best, source = n, other
        if best - here < MIN_COPY:
            source = None
        if isinstance(source, Slot):  # llama.cpp copies whole streams between sequences
            self.runner.kv_remove(first.seq_id, 0, -1)
            self.runner.kv_copy(source.seq_id, first.seq_id, -1, -1)
            first.tokens[:] = source.tokens
        elif source is not None and not isinstance(source, Slot):
            # a session's swapped KV stays its own (peek); a stashed prompt moves into the slot
            got = self.swap.peek(source) if isinstance(source, str) else self.swap.take_prefix(source)
            if got is not None:
                self.runner.state_set(first.seq_id, got[1])
                first.tokens[:] = got[0]
        return min(common_prefix_len(first.tokens, prompt), limit)

    def _draft(self) -> None:
        """Give each decoding sequence this step's speculative draft, within the token budget
        (one decode token per sequence comes first) and what the sequence may still grow."""
        decoding = [(ar, seq) for ar in self.scheduler.running if ar.phase is Phase.DECODE
                    for seq in ar.live_seqs()]
        room = self.scheduler.token_budget - len(decoding)
        for ar, seq in decoding:
            seq.draft = []
            if seq.drafter is None or room <= 0:
                continue
            mt = ar.req.params.max_tokens
            # the pending token and a draft of k are positions len(tokens) .. len(tokens) + k
            limit = min(room, ar.max_len - len(seq.slot.tokens) - 1,
                        (mt - seq.n_generated - 1) if mt is not None else room)
            if limit > 0:
                seq.draft = seq.drafter.propose(limit, len(decoding))
                room -= len(seq.draft)

    def _decode(self, work: list[Work]) -> list[int]:
        """One llama_decode. A batch holding a prompt chunk is long enough to be worth
        stopping midway: while it runs, `abort` of any request in it interrupts it."""
        entries = [w.entry for w in work]
        if not any(w.seq is None for w in work):
            return self.runner.decode(entries)
        with self._cv:
            self._in_decode = frozenset(w.ar.request_id for w in work)
            if not self._in_decode.isdisjoint(self._aborts):  # arrived since this step began
                self.runner.interrupt()
        try:
            return self.runner.decode(entries)
        finally:
            with self._cv:
                self._in_decode = frozenset()
                self.runner.clear_interrupt()

    def _run_batch(self, work: list[Work], out: _Outputs) -> None:
        try:
            logit_idx = self._decode(work)
        except DecodeAborted:
            # Nothing of this step happened (the runner rolled the KV back): the aborts are
            # applied at the top of the next step, and everyone else's work is scheduled again.
            self.stats.interrupted_decodes += 1
            for w in work:
                if w.seq is not None:
                    w.seq.draft = []
            return
        except Exception as e:
            log.error("decode failed: %s", e)
            for ar in {id(w.ar): w.ar for w in work}.values():
                for seq in ar.seqs:  # the KV state of these sequences is unknown now
                    self.runner.kv_remove(seq.slot.seq_id, 0, -1)
                    seq.slot.tokens.clear()
                self._end(ar, FinishReason.ERROR, out, error=f"decode failed: {e}")
            return
        self.stats.steps += 1
        idx = iter(logit_idx)
        for w in work:
            if w.ar.phase is Phase.DONE:
                continue
            if w.seq is None:
                first = w.ar.seqs[0].slot
                first.tokens.extend(w.entry.tokens)
                w.ar.prefill_pos += len(w.entry.tokens)
                self.stats.prompt_tokens += len(w.entry.tokens)
                if w.entry.n_logits:
                    self._start_decoding(w.ar, next(idx), out)
            else:
                self._accept(w.ar, w.seq, w.entry, next(idx), out)

    def _start_decoding(self, ar: ActiveRequest, logits_index: int, out: _Outputs) -> None:
        first = ar.seqs[0].slot
        for seq in ar.seqs[1:]:  # n > 1: the candidates share the prompt's KV
            self.runner.kv_remove(seq.slot.seq_id, 0, -1)
            self.runner.kv_copy(first.seq_id, seq.slot.seq_id, -1, -1)
            seq.slot.tokens[:] = first.tokens
        ar.phase = Phase.DECODE
        speculate = self.spec is not None and ar.req.params.speculative is not False
        for seq in ar.seqs:
            token = self._sample(seq, logits_index)
            if self._emit(ar, seq, token, logits_index, out):
                seq.pending = token
                if speculate:
                    assert self.spec is not None
                    seq.drafter = Drafter.start(self.spec, seq.slot.tokens)
                    seq.drafter.push(token)

    def _accept(self, ar: ActiveRequest, seq: Sequence, entry: BatchEntry, first_row: int, out: _Outputs) -> None:
        """After a decode: the pending token is in the KV; sample the row after it and, while
        the sampled token equals the next drafted one (already in the KV too), the row after
        that. The first disagreement (or a bonus token after a full accept) becomes the new
        pending token; drafted tokens past it leave the KV."""
        slot, drafted = seq.slot, entry.tokens[1:]
        assert seq.pending is not None
        slot.tokens.append(seq.pending)
        seq.pending, seq.draft = None, []
        accepted = 0
        for j in range(len(entry.tokens)):
            token = self._sample(seq, first_row + j)
            if not self._emit(ar, seq, token, first_row + j, out):
                break
            if seq.drafter is not None:
                seq.drafter.push(token)
            if j < len(drafted) and token == drafted[j]:
                slot.tokens.append(token)
                accepted += 1
                continue
            seq.pending = token
            break
        if drafted:
            self.stats.drafted_tokens += len(drafted)
            self.stats.accepted_tokens += accepted
            if seq.drafter is not None:
                seq.drafter.observe(len(drafted), accepted)
            if len(slot.tokens) < entry.pos0 + len(entry.tokens):
                self.runner.kv_remove(slot.seq_id, len(slot.tokens), -1)

    def _sample(self, seq: Sequence, logits_index: int) -> int:
        forced = seq.think.forced() if seq.think is not None else None
        # A forced token bypasses the sampler (grammars and thinking budgets do not mix).
        return forced if forced is not None else seq.sampler.sample(logits_index)

    def _emit(self, ar: ActiveRequest, seq: Sequence, token: int, logits_index: int, out: _Outputs) -> bool:
        """Emit one sampled token of one candidate and decide whether the candidate goes on.
        The one place that decides per token (EOS, stop tokens and strings, limits)."""
        params = ar.req.params
        if seq.think is not None:
            seq.think.observe(self.runner.token_text(token))
        seq.n_generated += 1
        self.stats.generated_tokens += 1
        delta = out.delta(ar, seq.index)
        delta.token_ids.append(token)
        if params.logprobs:
            if delta.logprobs is None:
                delta.logprobs = []
            delta.logprobs.append(token_logprob(self.runner, logits_index, token, params.top_logprobs))

        finish: FinishReason | None = None
        # A grammar allows only end-of-generation once complete, so EOS always ends it there.
        eos_stops = not params.ignore_eos or params.grammar is not None
        if (eos_stops and self.runner.is_eog(token)) or token in params.stop_token_ids:
            finish, delta.stop_reason = FinishReason.STOP, token
            delta.text += seq.detok.flush()
        else:
            pushed = seq.detok.push(self.runner.token_bytes(token))
            if isinstance(pushed, StopMatch):
                finish, delta.stop_reason = FinishReason.STOP, pushed.stop
                delta.text += pushed.text
            else:
                delta.text += pushed
                at_max = params.max_tokens is not None and seq.n_generated >= params.max_tokens
                if seq.repeat is not None and seq.repeat.observe(token):
                    finish, delta.stop_reason = FinishReason.STOP, StopKind.REPETITION
                    delta.text += seq.detok.flush()
                elif at_max or len(ar.prompt) + seq.n_generated >= ar.max_len:
                    finish = FinishReason.LENGTH
                    delta.text += seq.detok.flush()
        if finish is None:
            return True
        seq.finish = finish
        delta.finish_reason = finish
        if not ar.live_seqs():
            self._end(ar, finish, out)
        return False

    def _end(self, ar: ActiveRequest, reason: FinishReason, out: _Outputs, error: str | None = None,
             stop_reason: str | None = None) -> None:
        """The one exit: finish every live candidate with `reason`, free slots and samplers."""
        if ar.phase is Phase.DONE:
            return
        indices = [s.index for s in ar.seqs] or list(range(ar.req.n))
        live = {s.index for s in ar.live_seqs()} if ar.seqs else set(indices)
        for seq in ar.seqs:
            if seq.finish is None:
                seq.finish = reason
                out.delta(ar, seq.index).text += seq.detok.flush()
            seq.pending = None
            seq.sampler.free()
        for i in indices:
            if i in live:
                d = out.delta(ar, i)
                d.finish_reason = reason
                d.stop_reason = stop_reason
        self.scheduler.remove(ar)
        out.mark_finished(ar, error)
        self.stats.finished += 1
        if reason is FinishReason.CANCELLED:
            self.stats.cancelled += 1

    def _deliver(self, out: _Outputs) -> None:
        for ar, result in out.by_request.values():
            if result.finished:
                with self._cv:
                    self._known.discard(ar.request_id)
                    if not self._known:
                        self._cv.notify_all()  # stop() may be waiting for the engine to drain
            try:
                ar.sink(result)
            except Exception:  # the consumer is gone (e.g. its event loop closed)
                log.debug("sink for %s failed; aborting it", ar.request_id, exc_info=True)
                if not result.finished:
                    self.abort(ar.request_id)

    def _fail_all(self, error: str, out: _Outputs) -> None:
        for ar in [*self.scheduler.running, *self.scheduler.waiting]:
            for seq in ar.seqs:
                try:
                    self.runner.kv_remove(seq.slot.seq_id, 0, -1)
                except Exception:
                    log.exception("could not clear sequence %d", seq.slot.seq_id)
                seq.slot.tokens.clear()
            self._end(ar, FinishReason.ERROR, out, error=error)


class _NullSampler:
    def sample(self, logits_index: int) -> int:
        raise RuntimeError("no sampler")

    def free(self) -> None:
        pass
