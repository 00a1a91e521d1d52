"""The engine: one thread that owns the runner and steps all requests together.

    step = take new requests and aborts → apply aborts and deadlines → run queued calls →
           admit and place (and tell the placed) → draft → schedule one batch → decode once
           → sample, detokenize, finish → deliver

The loop lives here; what comes in from other threads (requests, aborts, calls) and what
goes back out to each request's sink is the `RequestQueue` (request_queue.py); what each KV
slot holds, and where a session's KV goes when it leaves its slot, is `Residency`
(residency.py); which requests run and which tokens go into a decode is the `Scheduler`; the
per-token decision is `output.emit`.

Threads: `submit`, `abort`, `abort_all`, `generate`, `call`, `validate`, `stop` and the
counters are safe from any thread. Only the engine thread touches the runner, the scheduler,
the slots and the residency (`_step` and all it calls); work from another thread that needs
them (a session's KV exported, imported, trimmed or dropped) goes through `call`, which runs
it between steps.

Invariants:
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

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from typing import Any

from hearth import test_gate
from hearth.engine.kv import Slot, SlotTable
from hearth.engine.output import StepOutputs, emit
from hearth.engine.preempt import Preemptor
from hearth.engine.prefix_cache import PrefixCache
from hearth.engine.request_queue import RequestQueue, Taken, fail_calls, outputs, run_calls
from hearth.engine.residency import Residency
from hearth.engine.runner import BatchEntry, DecodeAborted, Runner
from hearth.engine.scheduler import Admission, Scheduler, Work
from hearth.engine.sequence import ActiveRequest, Phase, Sequence, Sink
from hearth.engine.spec_cost import StepCost
from hearth.engine.speculate import Drafter, SpecConfig
from hearth.engine.swap import SwapStore
from hearth.engine.types import EngineRequest, EngineStats, FinishReason, RequestOutput, StopKind, check_request

log = logging.getLogger("hearth.engine")


class Engine:
    def __init__(self, runner: Runner, *, seq_ctx: int, token_budget: int | None = None,
                 swap: SwapStore | None = None, spec: SpecConfig | None = None,
                 prefix_cache: PrefixCache | None = None, name: str = "hearth-engine") -> None:
        self.runner = runner
        self.spec = spec  # None: no speculative decoding
        # decode time by batch size, for the drafts' cost (measured unless the config says the
        # prior is the model: then nothing is observed)
        self.step_cost = StepCost(ratio=spec.fixed_over_token) if spec is not None else None
        self.seq_ctx = seq_ctx
        self.stats = EngineStats()
        self.slots = SlotTable(runner.n_seq_max)  # who uses a slot: the scheduler; what it holds: the residency
        # Session KV that left its slot. Without a directory it lives in RAM only.
        self.swap = swap if swap is not None else SwapStore(None, 1 << 62, {})
        self.scheduler = Scheduler(self.slots, token_budget or runner.n_batch)
        # Stateless prompts' KV in blocks, in RAM and on disk. `prefetch` (any thread but this
        # one) reads a prompt's blocks from disk before the request is submitted.
        self.cache = prefix_cache
        # Session KV for the backend (`engine.residency.export_kv`, ...): engine thread only
        # (run them through `call`), except `kv_where`, a racy read from any thread.
        self.residency = Residency(runner, self.slots, self.swap, self.stats, prefix_cache)
        # Lower classes pause for higher ones at step boundaries, KV to the swap store (preempt.py).
        # the clock of time caps (a test moves it); a paused request's cap stops meanwhile (preempt.py)
        self.clock: Callable[[], float] = time.monotonic
        self.preempt = Preemptor(runner, self.slots, self.scheduler, self.residency, lambda: self.clock())
        self.queue = RequestQueue(runner.interrupt, runner.clear_interrupt)
        self._busy = lambda: self.scheduler.has_work() or bool(self.preempt.paused)  # work beyond the queue's
        # tests only (hearth/test_gate.py): `prefill-chunk-<k>` holds the engine thread after a
        # step that ran some request's k-th prompt chunk, its prompt not yet done; read once here
        self._gated = bool(os.environ.get(test_gate.ENV))
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    # ---- public, thread-safe API ------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def attach_cache(self, cache: PrefixCache) -> None:
        """Give the engine its prompt cache, before it takes requests (the cache is built once
        the runner has learned its KV layout on this engine's thread)."""
        self.cache = self.residency.cache = cache

    def abort_all(self) -> None:
        """Cancel every request in flight (at the next step); the engine keeps running."""
        self.queue.abort_all()

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel everything in flight (paused requests too: their saved KV is dropped, RAM and
        file), write sessions' KV to disk (when the swap store has a directory: they survive a
        graceful restart), and stop the thread."""
        self.abort_all()
        if self._thread.is_alive():
            self.queue.wait_drained(timeout)
        if self.swap.dir is not None and self._thread.is_alive():
            try:
                n = self.call(self.residency.spill_all).result(timeout)
                log.info("wrote the KV of %d resident session(s) to disk", n)
            except Exception:
                log.exception("could not write session KV to disk")
        if self.cache is not None:
            self.cache.close(timeout)  # what requests offered is written before the process ends
        self.queue.close()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if not self._thread.is_alive():  # paused requests left (none after a drained stop): no orphan files
            self.preempt.discard()

    @property
    def running(self) -> int:
        return len(self.scheduler.running)

    @property
    def waiting(self) -> int:
        return len(self.scheduler.waiting) + self.queue.new

    @property
    def in_flight(self) -> int:
        return self.queue.in_flight

    def validate(self, req: EngineRequest) -> None:
        """Raise ValueError (ContextOverflow for size) if the request cannot run. Linear in the
        prompt: a caller on an event loop runs it in a worker thread, then submits with
        `validated=True`."""
        check_request(req, self._max_len(req), self.runner.n_seq_max, self.runner.n_vocab)

    def _max_len(self, req: EngineRequest) -> int:
        return min(self.seq_ctx, req.max_len) if req.max_len else self.seq_ctx

    def submit(self, req: EngineRequest, sink: Sink, *, validated: bool = False) -> None:
        """Queue a request; `sink` is called from the engine thread with each RequestOutput.
        Raises what `validate` raises, unless `validated` says the caller already ran
        `validate` on the request as it is now (so the checks run once, off its event loop)."""
        if not validated:
            self.validate(req)
        self.queue.put(ActiveRequest(req, sink, max_len=self._max_len(req)))

    def abort(self, request_id: str, reason: FinishReason = FinishReason.CANCELLED) -> None:
        """Stop a request at the start of the next step, and the decode running now if it holds
        a prompt chunk and this request (see the module invariants). Unknown or finished ids
        are ignored."""
        self.queue.abort(request_id, reason)

    def generate(self, req: EngineRequest, after_submit: Callable[[], None] | None = None, *,
                 validated: bool = False,
                 observe: Callable[[RequestOutput], None] | None = None) -> AsyncIterator[RequestOutput]:
        """Submit (on the first iteration) and yield outputs until the request finishes. Leaving
        the iterator early (aclose, cancellation, an exception in the consumer) aborts the
        request. `after_submit` runs once the engine knows the request (abort() works from then
        on); `validated` as in `submit`. `observe` sees every output on the loop as it arrives,
        also those after the consumer left (the step in which an abort arrived, the abort's own):
        what the usage ledger counts a cancelled run from."""
        return outputs(lambda sink: self.submit(req, sink, validated=validated),
                       lambda: self.abort(req.request_id), after_submit, observe)

    def call(self, fn: Callable[[], Any]) -> Future[Any]:
        """Run `fn` on the engine thread before the next step; its result or exception
        lands in the returned future. Only the engine thread touches the runner."""
        return self.queue.call(fn)

    # ---- engine thread ------------------------------------------------------------------

    def _run(self) -> None:
        while (taken := self.queue.take(self._busy)) is not None:
            out = StepOutputs()
            try:
                self._step(taken, out)
            except Exception:  # the loop must survive anything one step does
                log.exception("engine step failed; failing the running requests")
                self._fail_all("internal engine error", out)
            finally:
                self.queue.deliver(out)
                fail_calls(taken.calls)  # never leave a caller waiting

    def _step(self, taken: Taken, out: StepOutputs) -> None:
        for ar in taken.new:
            self.scheduler.add(ar)
        self._apply_aborts(taken.aborts, out)
        self._expire(out)
        run_calls(taken.calls)  # after aborts, so a session whose turn was just aborted is idle for them
        self.preempt.make_room()
        self._admit(out)
        for ar in self.preempt.resume():  # its saved KV could not be read back: nothing exact to resume
            self._end(ar, FinishReason.ERROR, out, error="the KV of this paused request could not be read back")
        if self.spec is not None and self.step_cost is not None:
            self.scheduler.draft(self.step_cost.seconds, self.spec.margin)
        work = self.scheduler.schedule()
        if work:
            self._run_batch(work, out)

    def _apply_aborts(self, aborts: dict[str, FinishReason], out: StepOutputs) -> None:
        for rid, reason in aborts.items():
            found = self.scheduler.find(rid) or self.preempt.find(rid)
            if found is not None:
                self._end(found, reason, out)

    def _expire(self, out: StepOutputs) -> None:
        now = self.clock()
        for ar in self.scheduler.running:  # only decoding requests have a deadline
            if ar.deadline is not None and now >= ar.deadline:
                # The time cap ends the output as max_tokens does ("length" on every protocol),
                # named by its stop reason.
                self._end(ar, FinishReason.LENGTH, out, stop_reason=StopKind.TIMEOUT)

    def _admit(self, out: StepOutputs) -> None:
        admitted = self.scheduler.admit()
        for adm in admitted:
            self._setup(adm, out)
        if admitted:
            # A placed request hears of it before its first prefill chunk runs, so its stream
            # opens (and can be cancelled by id) while a long prefill is still ahead.
            self.queue.deliver(out)
            out.by_request.clear()

    def _setup(self, adm: Admission, out: StepOutputs) -> None:
        """Place an admitted request's KV and give each candidate its sampler."""
        ar, placement = adm.ar, adm.placement
        try:
            reuse, ar.cache_tier = self.residency.place(ar.req, placement)
        except Exception as e:
            log.exception("could not place %s", ar.request_id)
            self.residency.unplace(ar.req, placement)
            self._fail_setup(ar, placement.slots, f"could not prepare the KV cache: {e}", out)
            return
        self.residency.truncate(placement.slots[0], reuse)
        ar.prefill_pos = ar.cached_tokens = reuse
        self.stats.cached_tokens += reuse
        try:
            for i, slot in enumerate(placement.slots):
                ar.seqs.append(Sequence.start(ar.req, i, slot, self.runner.new_sampler))
        except Exception as e:
            self._fail_setup(ar, placement.slots, f"could not set up sampling: {e}", out)
            return
        out.delta(ar, 0)  # an (empty) output: placed, with its cached token count

    def _fail_setup(self, ar: ActiveRequest, slots: list[Slot], error: str, out: StepOutputs) -> None:
        ar.seqs.extend(Sequence.placeholder(i, s) for i, s in enumerate(slots) if i >= len(ar.seqs))
        self._end(ar, FinishReason.ERROR, out, error=error)

    def _decode(self, work: list[Work]) -> list[int]:
        """One llama_decode, stopped midway (request_queue.py) by the arrival of a request of a
        higher class than all of its prompt chunks (of all of its work, if it holds none), or of
        a newcomer's (scheduler.py, "Tenants within a class"), whose prompt then runs first. A
        batch holding a prompt chunk is long enough to be worth stopping for an abort too:
        `abort` of any request in it interrupts it.

        Why the chunks' class and not the decodes': a step's length is its prompt chunks' (a
        128-token flex chunk is many times a decode's time), and the decodes it holds lose one
        step at most: those of the arrival's class and above run again in the very next step,
        beside its prompt. So a `priority` request arriving while another one decodes beside a
        `flex` prompt chunk no longer waits for that chunk."""
        entries = [w.entry for w in work]
        chunks = [w.ar.req.priority for w in work if w.seq is None]
        top = max(chunks) if chunks else max(w.ar.req.priority for w in work)
        self.queue.decode_begins(frozenset(w.ar.request_id for w in work) if chunks else frozenset(), top,
                                 self._tenants_in_flight(top))
        try:
            return self.runner.decode(entries)
        finally:
            self.queue.decode_ends()

    def _tenants_in_flight(self, top: int) -> frozenset[str] | None:
        """The tenants with work in the engine (running, paused or waiting for a slot), if one
        runs several requests of class `top` or below (an arrival of another tenant is then a
        newcomer); else None."""
        running = Counter(ar.req.tenant for ar in self.scheduler.running if ar.req.priority <= top)
        if not any(n >= 2 for n in running.values()):
            return None
        return frozenset((*(ar.req.tenant for ar in self.scheduler.running),
                          *(ar.req.tenant for ar in self.scheduler.waiting),
                          *(p.ar.req.tenant for p in self.preempt.paused)))

    def _run_batch(self, work: list[Work], out: StepOutputs) -> None:
        measure = self.spec is not None and self.spec.measure_cost and all(w.seq is not None for w in work)
        cost = self.step_cost if measure else None  # decode-only steps
        try:
            t0 = cost.clock() if cost is not None else 0.0
            logit_idx = self._decode(work)
            if cost is not None:
                cost.observe(sum(len(w.entry.tokens) for w in work), cost.clock() - t0)
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
                    self.residency.truncate(seq.slot, 0)
                if ar.restart_prefill():  # its restored KV failed: the transcript is prefilled again
                    log.warning("session %s: a decode on its restored KV failed; the KV is dropped and the "
                                "transcript prefilled again", ar.req.owner)
                    self.stats.kv_reprefills += 1
                else:
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
                w.ar.prefill_chunks += 1
                self.stats.prompt_tokens += len(w.entry.tokens)
                if w.entry.n_logits:
                    self._start_decoding(w.ar, next(idx), out)
            else:
                self._accept(w.ar, w.seq, w.entry, next(idx), out)
        if self._gated:  # tests only: the step is whole, the prompt goes on at the next boundary
            for w in work:
                if w.seq is None and w.ar.phase is Phase.PREFILL:
                    test_gate.wait_at_gate(f"prefill-chunk-{w.ar.prefill_chunks}")

    def _start_decoding(self, ar: ActiveRequest, logits_index: int, out: StepOutputs) -> None:
        self.residency.fork(ar.seqs[0].slot, [s.slot for s in ar.seqs[1:]])  # n > 1: they share the prompt's KV
        ar.phase = Phase.DECODE
        if ar.req.max_time is not None and ar.deadline is None:  # a re-prefill keeps the first
            ar.deadline = self.clock() + ar.req.max_time
        speculate = self.spec is not None and ar.req.params.speculative is not False
        for seq in ar.seqs:
            token = self._sample(seq, logits_index)
            if self._emit(ar, seq, token, logits_index, out):
                seq.pending = token
                if speculate:
                    assert self.spec is not None
                    seq.drafter = Drafter.start(self.spec, seq.slot.tokens)
                    seq.drafter.push(token)

    def _accept(self, ar: ActiveRequest, seq: Sequence, entry: BatchEntry, first_row: int, out: StepOutputs) -> None:
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
                self.residency.truncate(slot, len(slot.tokens))

    def _sample(self, seq: Sequence, logits_index: int) -> int:
        forced = seq.think.forced() if seq.think is not None else None
        # A forced token bypasses the sampler (grammars and thinking budgets do not mix).
        return forced if forced is not None else seq.sampler.sample(logits_index)

    def _emit(self, ar: ActiveRequest, seq: Sequence, token: int, logits_index: int, out: StepOutputs) -> bool:
        """Emit one sampled token of one candidate (`output.emit` decides); False if that
        ended the candidate, and the request with its last live candidate."""
        finish = emit(self.runner, ar, seq, token, logits_index, out.delta(ar, seq.index))
        self.stats.generated_tokens += 1
        if finish is None:
            return True
        if not ar.live_seqs():
            self._end(ar, finish, out)
        return False

    def _end(self, ar: ActiveRequest, reason: FinishReason, out: StepOutputs, error: str | None = None,
             stop_reason: str | None = None) -> None:
        """The one exit: finish every live candidate with `reason`, free slots and samplers."""
        if ar.phase is Phase.DONE:
            return
        written = 0
        if reason is not FinishReason.ERROR and ar.req.owner is None and ar.req.cache_prompt and ar.seqs:
            try:  # its KV is intact: keep it for the next request that shares a prefix
                written = self.residency.offer(ar.seqs[0].slot, ar.req)
            except Exception:
                log.exception("could not offer %s to the prompt cache", ar.request_id)
        out.finish(ar, reason, error, stop_reason, cache_written=written)
        for seq in ar.seqs:
            seq.pending = None
            seq.sampler.free()
        self.scheduler.remove(ar)
        self.preempt.forget(ar)
        self.stats.finished += 1
        if reason is FinishReason.CANCELLED:
            self.stats.cancelled += 1

    def _fail_all(self, error: str, out: StepOutputs) -> None:
        for ar in [*self.scheduler.running, *self.scheduler.waiting]:
            for seq in ar.seqs:
                try:
                    self.residency.truncate(seq.slot, 0)
                except Exception:
                    log.exception("could not clear sequence %d", seq.slot.seq_id)
                    seq.slot.tokens.clear()
            self._end(ar, FinishReason.ERROR, out, error=error)
        for ar in self.preempt.drain():  # their KV is in RAM, their slots are others' now
            self._end(ar, FinishReason.ERROR, out, error=error)
