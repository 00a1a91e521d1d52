"""Which models are in memory: loaded when a request names them, kept while they are used,
unloaded when idle (Ollama's policy, and llama-server's router's).

- A request for a model that is not loaded starts its load; every request for it meanwhile
  waits for that one load (`acquire`). A failed load fails its waiters with an error naming the
  model; the next request tries again (the file may have been fixed).
- A model stays loaded for its keep-alive after its last request ends: the last request's
  `keep_alive` (seconds; 0 unloads at once, negative never), else the server's default.
- At most `max_loaded` models are in memory, loading and unloading ones included. To make
  room the least recently used idle model is unloaded; a request that finds none idle waits
  until one is.
- With a RAM budget (`--models-ram-mb`), the models in memory must also fit it, each counted
  at what its load took, measured (the process's RSS after the load minus before: weights, KV
  cache and compute buffers); a model not loaded yet counts at what its last load took, or
  its file's size before its first load (a lower bound, corrected as soon as it is loaded: a
  model that turns out larger makes the least recently used idle ones go). A model larger
  than the whole budget is refused (503 `model_too_large`) once its size is known.
- A model with a request between `acquire` and `release` is never unloaded, nor one pinned
  (`--model`: loaded at start and kept).

Everything here runs on the event loop (one thread, so no locks); `load` and `unload` block
and run in worker threads, one load at a time (they compete for the same disk and cores, and
one at a time lets `measure` attribute the memory a load took to that model). Time comes from
`clock` and expiry runs in `expire()`: a background task calls it when the next keep-alive
ends (`run_expiry`); unit tests call it themselves with a fake clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from hearth.errors import Conflict, NotFound, Unavailable
from hearth.models import ModelSpec

log = logging.getLogger("hearth.loader")

M = TypeVar("M")
State = Literal["unloaded", "loading", "loaded", "unloading"]
FOREVER = math.inf

DEFAULT_KEEP_ALIVE = 300.0  # seconds: Ollama's default


@dataclass(frozen=True, slots=True)
class LoadPolicy:
    max_loaded: int = 4  # llama-server's --models-max default
    keep_alive: float = DEFAULT_KEEP_ALIVE  # seconds after the last request; inf: never unload
    ram_budget: int = 0  # bytes the loaded models may take together (measured); 0: no budget

    def __post_init__(self) -> None:
        if self.max_loaded < 1:
            raise ValueError("--models-max must be at least 1")
        if self.ram_budget < 0:
            raise ValueError("--models-ram-mb must be >= 0")
        if self.keep_alive < 0:
            raise ValueError("the keep-alive must be >= 0 seconds (inf: never)")


def keep_alive_seconds(value: float) -> float:
    """Ollama's meaning of a keep_alive: negative is forever, 0 is now, else seconds."""
    return FOREVER if value < 0 else value


@dataclass(eq=False, slots=True)
class Entry(Generic[M]):
    """One servable model and where it stands. `users`: requests between acquire and release."""

    spec: ModelSpec
    pinned: bool = False
    state: State = "unloaded"
    model: M | None = None
    users: int = 0
    last_used: float = 0.0
    keep_alive: float | None = None  # the last request's; None: the server's default
    busy: asyncio.Task[None] | None = None  # the load or unload under way
    error: str | None = None  # why its last load failed
    loads: int = 0
    load_failures: int = 0
    load_seconds: float = 0.0  # all loads together
    loaded_bytes: int = 0  # memory its last load took (see ModelLoader.measure)
    loaded_at: float = 0.0

    def expected_bytes(self) -> int:
        """What it takes in memory: its last load's measure, else its file's size (a lower bound)."""
        if self.loaded_bytes:
            return self.loaded_bytes
        try:
            return self.spec.path.stat().st_size
        except OSError:
            return 0

    def expires_at(self, default: float) -> float:
        """When an idle loaded model is due to go (inf: never)."""
        if self.pinned:
            return FOREVER
        return self.last_used + (default if self.keep_alive is None else self.keep_alive)


@dataclass(slots=True)
class _Change:
    """Set (and replaced) on every change of state, for requests waiting for room."""

    event: asyncio.Event = field(default_factory=asyncio.Event)


class ModelLoader(Generic[M]):
    def __init__(self, specs: list[ModelSpec], load: Callable[[ModelSpec], M], unload: Callable[[M], None], *,
                 policy: LoadPolicy | None = None, pinned: set[str] | None = None,
                 clock: Callable[[], float] = time.monotonic, measure: Callable[[], int] | None = None) -> None:
        self.policy = policy or LoadPolicy()
        self._load_fn, self._unload_fn = load, unload
        self.clock = clock
        self._measure = measure  # the process's memory in bytes (RSS), read around each load
        self._entries: dict[str, Entry[M]] = {s.id: Entry(s, pinned=s.id in (pinned or set())) for s in specs}
        n_pinned = sum(e.pinned for e in self._entries.values())
        if n_pinned > self.policy.max_loaded:
            raise ValueError(f"--models-max {self.policy.max_loaded} is less than the {n_pinned} models "
                             "named with --model (each is kept loaded)")
        self._change = _Change()
        self._loading = asyncio.Lock()
        self.waiting_for_room = 0  # requests waiting for a model to become idle (none is)

    # ---- reading --------------------------------------------------------------------------

    def entry(self, model_id: str) -> Entry[M]:
        e = self._entries.get(model_id)
        if e is None:
            raise NotFound(f"The model '{model_id}' does not exist", param="model", code="model_not_found")
        return e

    def entries(self) -> list[Entry[M]]:
        return list(self._entries.values())

    def loaded(self) -> dict[str, M]:
        return {mid: e.model for mid, e in self._entries.items() if e.state == "loaded" and e.model is not None}

    def in_memory(self) -> int:
        return sum(e.state != "unloaded" for e in self._entries.values())

    def expires_at(self, e: Entry[M]) -> float | None:
        """When an idle loaded model goes (clock time), None if never or if it is in use."""
        if e.state != "loaded" or e.users:
            return None
        at = e.expires_at(self.policy.keep_alive)
        return None if at == FOREVER else at

    # ---- using a model ------------------------------------------------------------------------

    async def acquire(self, model_id: str) -> M:
        """The model, loaded (waiting for its load, and for room to load it, as long as needed:
        the caller bounds the wait). Count one user until `release`. Unavailable (503, naming
        the model) if its load fails or it can never get room."""
        e = self.entry(model_id)
        while True:
            if e.state == "loaded":
                assert e.model is not None
                e.users += 1
                e.last_used = self.clock()
                return e.model
            if e.busy is not None:  # a load or an unload under way: its outcome, then look again
                await asyncio.shield(e.busy)
                continue
            await self._make_room(e)
            if e.state == "unloaded" and e.busy is None:  # nobody started it while we waited for room
                self._begin_load(e)

    def release(self, model_id: str, keep_alive: float | None = None) -> None:
        """One user is done; `keep_alive` (seconds, Ollama's meaning) is the request's own, if it gave one."""
        e = self.entry(model_id)
        assert e.users > 0, f"released {model_id} more often than it was acquired"
        e.users -= 1
        e.last_used = self.clock()
        if keep_alive is not None:
            e.keep_alive = keep_alive_seconds(keep_alive)
        self._changed()
        if e.users == 0 and not e.pinned and e.expires_at(self.policy.keep_alive) <= e.last_used:
            self._unload_soon(e)

    # ---- explicit control ---------------------------------------------------------------------

    async def load(self, model_id: str, keep_alive: float | None = None) -> M:
        """Load the model now (POST /models/load) and keep it for its keep-alive from now."""
        model = await self.acquire(model_id)
        self.release(model_id, keep_alive)
        return model

    async def unload(self, model_id: str) -> bool:
        """Unload the model now (POST /models/unload); False if it was not loaded. Conflict
        (409) while requests use it or when it is pinned."""
        e = self.entry(model_id)
        if e.pinned:
            raise Conflict(f"model {model_id!r} was named with --model and stays loaded", param="model",
                           code="model_pinned")
        while e.busy is not None:
            await asyncio.shield(e.busy)
        if e.state != "loaded":
            return False
        if e.users:
            raise Conflict(f"model {model_id!r} has {e.users} request(s) running; retry when they end, or send "
                           "keep_alive 0 with the last one", param="model", code="model_busy")
        await asyncio.shield(self._begin_unload(e))
        return True

    def add(self, spec: ModelSpec) -> None:
        """A model installed while the server runs (POST /api/pull): servable from now on."""
        if spec.id not in self._entries:
            self._entries[spec.id] = Entry(spec)
            self._changed()

    async def remove(self, model_id: str) -> None:
        """Forget a model whose file is about to go (DELETE /api/delete): unloaded first;
        Conflict while requests use it or when it is pinned."""
        await self.unload(model_id)
        e = self.entry(model_id)
        if e.state != "unloaded" or e.busy is not None or e.users:
            raise Conflict(f"model {model_id!r} is in use; retry when its requests end", param="model",
                           code="model_busy")
        del self._entries[model_id]
        self._changed()

    async def expire(self) -> list[str]:
        """Unload every idle model whose keep-alive has run out; their ids."""
        now = self.clock()
        due = [e for e in self._entries.values() if e.state == "loaded" and not e.users and e.busy is None
               and e.expires_at(self.policy.keep_alive) <= now]
        for task in [self._begin_unload(e) for e in due]:
            await asyncio.shield(task)
        return [e.spec.id for e in due]

    async def run_expiry(self, idle_check: float = 60.0) -> None:
        """Forever: sleep until the next keep-alive runs out (or something changes), then `expire`."""
        while True:
            change = self._change.event
            times = [t for e in self._entries.values() if (t := self.expires_at(e)) is not None]
            wait = min([idle_check, *(t - self.clock() for t in times)])
            if wait > 0:
                # not asyncio.wait_for: cancelled (at shutdown) in the instant the event is set,
                # it can leave this task cancelling forever (seen on 3.11)
                changed = asyncio.ensure_future(change.wait())
                try:
                    await asyncio.wait({changed}, timeout=wait)
                finally:
                    changed.cancel()
            await self.expire()

    async def close(self) -> None:
        """Unload everything (shutdown): waits for loads under way, ignores users and pins."""
        for e in self._entries.values():
            while e.busy is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(e.busy)
            if e.state == "loaded":
                await asyncio.shield(self._begin_unload(e))

    # ---- internals ------------------------------------------------------------------------------

    def _changed(self) -> None:
        self._change.event.set()
        self._change = _Change()

    # A load or unload changes the state at once, in the same step as the decision, so that
    # every request deciding after it counts the model as in memory (or going).

    def _begin_load(self, e: Entry[M]) -> asyncio.Task[None]:
        e.state = "loading"
        e.busy = self._start(self._load(e))
        self._changed()
        return e.busy

    def _begin_unload(self, e: Entry[M]) -> asyncio.Task[None]:
        e.state = "unloading"
        e.busy = self._start(self._unload(e, e.model))
        self._changed()
        return e.busy

    @staticmethod
    def _start(work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(work)
        # its failure reaches its waiters; one with none left must not be logged as unretrieved
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return task

    def _unload_soon(self, e: Entry[M]) -> None:
        if e.busy is None and e.state == "loaded":
            self._begin_unload(e)

    def held_bytes(self) -> int:
        """What the models in memory take (loading ones at what they are expected to)."""
        return sum(e.expected_bytes() for e in self._entries.values() if e.state != "unloaded")

    def _fits(self, want: Entry[M]) -> bool:
        budget = self.policy.ram_budget
        return budget == 0 or self.held_bytes() + want.expected_bytes() <= budget

    def _idle(self, but: Entry[M] | None = None) -> list[Entry[M]]:
        """Loaded models that may be unloaded now, least recently used first."""
        return sorted((e for e in self._entries.values() if e is not but and e.state == "loaded" and not e.users
                       and not e.pinned and e.busy is None), key=lambda e: e.last_used)

    async def _make_room(self, want: Entry[M]) -> None:
        """Until one more model fits (--models-max, the RAM budget): unload the least recently
        used idle one, or wait for one to become idle. Unavailable if it never can."""
        budget = self.policy.ram_budget
        if budget and want.expected_bytes() > budget:
            raise Unavailable(f"cannot load model {want.spec.id!r}: it takes about {want.expected_bytes() >> 20} MiB, "
                              f"more than --models-ram-mb {budget >> 20}", code="model_too_large")
        while self.in_memory() >= self.policy.max_loaded or not self._fits(want):
            if want.state != "unloaded" or want.busy is not None:
                return  # another request started it meanwhile: it has its place
            idle = self._idle()
            if idle:
                log.info("unloading %s (least recently used) to make room for %s", idle[0].spec.id, want.spec.id)
                await asyncio.shield(self._begin_unload(idle[0]))
                continue
            if all(e.pinned for e in self._entries.values() if e.state != "unloaded"):
                what = (f"all {self.policy.max_loaded} model places hold" if self.in_memory() >= self.policy.max_loaded
                        else f"--models-ram-mb {budget >> 20} is taken by")
                raise Unavailable(f"cannot load model {want.spec.id!r}: {what} models named with --model "
                                  "(raise --models-max or --models-ram-mb)", code="models_max")
            change = self._change.event
            self.waiting_for_room += 1
            try:
                await change.wait()  # a request ended, or a load or unload finished
            finally:
                self.waiting_for_room -= 1

    def _trim_to_budget(self, loaded: Entry[M]) -> None:
        """After a load measured larger than expected: unload least recently used idle models
        (never `loaded`, which its waiters are about to use) until the budget holds again."""
        budget = self.policy.ram_budget
        held = self.held_bytes()
        for victim in self._idle(but=loaded):
            if not budget or held <= budget:
                return
            held -= victim.expected_bytes()  # still held while it unloads: counted as gone
            log.info("unloading %s (least recently used): %s took %d MiB, over --models-ram-mb", victim.spec.id,
                     loaded.spec.id, loaded.loaded_bytes >> 20)
            self._begin_unload(victim)

    async def _load(self, e: Entry[M]) -> None:
        try:
            async with self._loading:
                before = self._measure() if self._measure else 0
                t0 = time.monotonic()
                model = await asyncio.to_thread(self._load_fn, e.spec)
                seconds = time.monotonic() - t0
                after = self._measure() if self._measure else 0
        except BaseException as exc:
            e.state, e.busy = "unloaded", None
            e.load_failures += 1
            e.error = f"{type(exc).__name__}: {exc}"
            self._changed()
            log.error("model %s failed to load from %s: %s", e.spec.id, e.spec.path, e.error)
            if isinstance(exc, Exception):
                raise Unavailable(f"model {e.spec.id!r} failed to load: {e.error}",
                                  code="model_load_failed") from exc
            raise
        e.model, e.state, e.busy, e.error = model, "loaded", None, None
        e.loads += 1
        e.load_seconds += seconds
        e.loaded_bytes = max(0, after - before)
        e.loaded_at = e.last_used = self.clock()
        self._changed()
        log.info("loaded %s from %s in %.1fs (%d MiB)", e.spec.id, e.spec.path, seconds, e.loaded_bytes >> 20)
        self._trim_to_budget(e)

    async def _unload(self, e: Entry[M], model: M | None) -> None:
        try:
            if model is not None:
                await asyncio.to_thread(self._unload_fn, model)
        except Exception:
            log.exception("unloading %s failed; dropping it anyway", e.spec.id)
        finally:
            e.model, e.state, e.busy = None, "unloaded", None
            e.keep_alive = None  # the next load starts from the server's default
            self._changed()
        log.info("unloaded %s", e.spec.id)
