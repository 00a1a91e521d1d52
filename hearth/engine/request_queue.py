"""What crosses into the engine thread and what comes back out: llama.cpp's server-queue beside
its slot loop.

In: new requests (`put`), aborts (`abort`, `abort_all`) and calls to run between steps
(`call`), from any thread; the engine thread `take`s them all at the top of a step, new
requests in arrival order. Out: `deliver` hands each request's step output to its sink, and
forgets a request once its last output is delivered (`in_flight`); `outputs` turns a sink into
an async iterator on the caller's event loop, as llama.cpp's server_response does for a task.

Cancellation of waiting work: an abort is only recorded here; the step that takes it ends the
request wherever it is (waiting for a slot, running, or paused), before any decode. An abort of
a request whose prompt chunk is being decoded now also interrupts that decode: the engine names
the requests of an interruptible decode (`decode_begins`, `decode_ends`) and the runner's
interrupt flag is set and cleared under the same lock as the abort is recorded, so an abort
either interrupts the decode or is seen by the next step, never lost between them. A new
request of a higher class than the decode running interrupts it too (`put`; the decode's class
is its prompt chunks' highest, or its work's in a decode-only step: `Engine._decode`): a `flex`
batch's step (prompt chunks or decodes) running when an interactive request arrives is rolled
back and runs again after that request's prompt (scheduler.py, "Classes within a step"), so the
interactive request does not wait for it, nor for a flex chunk beside another one's decode.
So does a newcomer (scheduler.py, "Tenants within a class"): a request of a tenant with nothing
in flight, of the decode's class or above, while some tenant runs several requests; its
prompt then runs alone in the next step instead of after a neighbour's step. Each arrival
interrupts at most the one decode running when it is put; decode-only steps are interrupted
only by such arrivals, never by an abort.

Which waiting request gets a slot next is not decided here: the scheduler admits FCFS
(scheduler.py), and the node's admission queue decides the order requests reach `put` in
(fair shares, backends/local/admission.py).

Per step, `take` swaps out the three containers it filled (as the loop did when it held them)
and hands them over in one `Taken` it reuses: the queue adds no allocation to a step.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from typing import Any

from hearth.engine.handoff import Mailbox, for_loop
from hearth.engine.output import StepOutputs
from hearth.engine.sequence import ActiveRequest, Sink
from hearth.engine.types import FinishReason, RequestOutput

log = logging.getLogger("hearth.engine")

Call = tuple[Callable[[], Any], Future[Any]]


class Taken:
    """What one step took: new requests in arrival order, aborts by request id (the first
    reason wins), calls in arrival order. Reused: valid until the next `take`."""

    __slots__ = ("aborts", "calls", "new")

    def __init__(self) -> None:
        self.new: list[ActiveRequest] = []
        self.aborts: dict[str, FinishReason] = {}
        self.calls: list[Call] = []


class RequestQueue:
    def __init__(self, interrupt: Callable[[], None], clear_interrupt: Callable[[], None]) -> None:
        self._interrupt, self._clear_interrupt = interrupt, clear_interrupt  # the runner's
        self._cv = threading.Condition()
        self._inbox: list[ActiveRequest] = []
        self._aborts: dict[str, FinishReason] = {}
        self._calls: list[Call] = []
        self._known: set[str] = set()  # request ids submitted and not yet ended
        self._in_decode: frozenset[str] = frozenset()  # requests of the interruptible decode running now
        self._decode_class: int | None = None  # its class (Engine._decode): a higher arrival interrupts it
        # tenants with work in flight, while one runs several: an arrival of another tenant (of
        # at least `_decode_class`) interrupts the decode too; None: no such interrupt
        self._decode_tenants: frozenset[str] | None = None
        self._stopping = False
        self._taken = Taken()

    # ---- any thread -------------------------------------------------------------------------

    @property
    def new(self) -> int:
        """Requests put and not yet taken by the engine thread."""
        return len(self._inbox)

    @property
    def in_flight(self) -> int:
        """Requests put and not yet ended."""
        return len(self._known)

    def put(self, ar: ActiveRequest) -> None:
        """RuntimeError once the engine is stopping; ValueError if its id is in flight."""
        with self._cv:
            if self._stopping:
                raise RuntimeError("the engine is stopping")
            if ar.request_id in self._known:
                raise ValueError(f"request id {ar.request_id!r} is already in flight")
            self._known.add(ar.request_id)
            self._inbox.append(ar)
            if self._interrupts(ar):
                self._interrupt()
                self._decode_class = None  # interrupted once: the next arrival waits for the next step
            self._cv.notify()

    def _interrupts(self, ar: ActiveRequest) -> bool:
        """Whether `ar`'s arrival interrupts the decode running now (under the lock)."""
        top = self._decode_class
        if top is None:
            return False
        if ar.req.priority > top:
            return True
        tenants = self._decode_tenants
        return tenants is not None and ar.req.priority == top and ar.req.tenant not in tenants

    def abort(self, request_id: str, reason: FinishReason = FinishReason.CANCELLED) -> None:
        """Record an abort for the next step (the first reason wins), and interrupt the decode
        running now if it holds this request. Unknown or finished ids are ignored."""
        with self._cv:
            if request_id in self._known:
                self._aborts.setdefault(request_id, reason)
                if request_id in self._in_decode:
                    self._interrupt()
                self._cv.notify()

    def abort_all(self) -> None:
        """Abort every request in flight."""
        with self._cv:
            for rid in self._known:
                self._aborts.setdefault(rid, FinishReason.CANCELLED)
            if self._in_decode:
                self._interrupt()
            self._cv.notify()

    def call(self, fn: Callable[[], Any]) -> Future[Any]:
        """Queue `fn` for the engine thread, to run before the next step; its result or
        exception lands in the returned future. RuntimeError once the engine is stopping."""
        fut: Future[Any] = Future()
        with self._cv:
            if self._stopping:
                raise RuntimeError("the engine is stopping")
            self._calls.append((fn, fut))
            self._cv.notify()
        return fut

    def wait_drained(self, timeout: float) -> bool:
        """Wait until every request put has ended; False on timeout."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._known, timeout)

    def close(self) -> None:
        """Refuse new requests and calls, cancel the calls not yet taken, and wake the engine
        thread so that `take` answers None."""
        with self._cv:
            self._stopping = True
            calls, self._calls = self._calls, []
            self._cv.notify()
        for _, fut in calls:
            fut.cancel()

    # ---- the engine thread ------------------------------------------------------------------

    def take(self, busy: Callable[[], bool]) -> Taken | None:
        """Wait until there is something to do (something queued here, or `busy()`: requests
        in the scheduler or paused), then take the new requests, aborts and calls; None once
        the queue is closed."""
        with self._cv:
            while not (self._stopping or self._inbox or self._aborts or self._calls or busy()):
                self._cv.wait()
            if self._stopping:
                return None
            t = self._taken
            t.new, self._inbox = self._inbox, []
            t.aborts, self._aborts = self._aborts, {}
            t.calls, self._calls = self._calls, []
        return t

    def decode_begins(self, request_ids: frozenset[str], top_class: int | None = None,
                      tenants: frozenset[str] | None = None) -> None:
        """An interruptible decode starts: an abort of one of `request_ids` from now on
        interrupts it, and so does one that arrived since the step took its aborts. With
        `top_class` (its class: the highest of its prompt chunks, or of its work if it holds
        none, `Engine._decode`), so does a new request of a higher class, and,
        with `tenants` (those with work in flight, while one runs several), a new request of
        `top_class` from any other tenant."""
        with self._cv:
            self._in_decode = request_ids
            self._decode_class = top_class
            self._decode_tenants = tenants
            if not request_ids.isdisjoint(self._aborts):
                self._interrupt()

    def decode_ends(self) -> None:
        with self._cv:
            self._in_decode = frozenset()
            self._decode_class = None
            self._decode_tenants = None
            self._clear_interrupt()

    def deliver(self, out: StepOutputs) -> None:
        """Hand each request its output of this step; a finished one is no longer in flight.
        A sink that raises (its consumer is gone) gets its request aborted."""
        for ar, result in out.by_request.values():
            if result.finished:
                with self._cv:
                    self._known.discard(ar.request_id)
                    if not self._known:
                        self._cv.notify_all()  # wait_drained may be waiting
            try:
                ar.sink(result)
            except Exception:  # the consumer is gone (e.g. its event loop closed)
                log.debug("sink for %s failed; aborting it", ar.request_id, exc_info=True)
                if not result.finished:
                    self.abort(ar.request_id)


def run_calls(calls: list[Call]) -> None:
    """Engine thread, between steps: run each call not cancelled, its result into its future."""
    for fn, fut in calls:
        if fut.set_running_or_notify_cancel():
            try:
                fut.set_result(fn())
            except BaseException as e:
                fut.set_exception(e)


def fail_calls(calls: list[Call]) -> None:
    """After a step: no caller is left waiting on a call the step did not run."""
    for _, fut in calls:
        if not fut.done():
            fut.set_exception(RuntimeError("the engine step failed before this call ran"))


async def outputs(submit: Callable[[Sink], None], abort: Callable[[], None],
                  after_submit: Callable[[], None] | None = None,
                  observe: Callable[[RequestOutput], None] | None = None) -> AsyncIterator[RequestOutput]:
    """`submit` a request with a sink that crosses to this event loop, and yield its outputs
    until it finishes; leaving early (aclose, cancellation, an exception in the consumer) calls
    `abort`. `after_submit` runs once the request is submitted."""
    loop = asyncio.get_running_loop()
    queue: Mailbox[RequestOutput] = Mailbox(loop, observe)
    handoff = for_loop(loop)  # one loop wakeup per step for all its streams (handoff.py)

    def sink(out: RequestOutput) -> None:
        handoff.put(queue, out)

    submit(sink)
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
            abort()
