"""Compiled grammars, kept per model: a request whose grammar text was compiled before (an agent
resending the same tools or response_format every turn) reuses it instead of parsing it again.

One cache belongs to one runner, so it is keyed by the grammar text alone and dies with the
runner: an entry compiled against one model's vocabulary can never serve another model (each
model's runner has its own cache; the `model` label of its hit and miss counters says whose).

Thread-safe: requests are checked (`compile`d) off the engine thread while the engine thread
takes instances (`instance`) for its samplers. An entry is an opaque compiled object with a
pristine state; `instance` hands out a private copy (`clone`), so requests never share parse
state. Evicted entries are released (`free`) under the lock, so a clone never races a free.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class GrammarCacheStats:
    hits: int = 0  # requests whose grammar was found compiled (`compile` calls that did not parse)
    misses: int = 0  # grammars compiled (parsed) because they were not there
    entries: int = 0
    compile_seconds: float = 0.0  # time spent compiling the misses


class GrammarCache(Generic[T]):
    """Up to `capacity` compiled grammars and `max_bytes` of their text, least recently used
    dropped first. `compile_fn` raises ValueError on a grammar it refuses (never cached)."""

    def __init__(self, compile_fn: Callable[[str], T], clone_fn: Callable[[T], T],
                 free_fn: Callable[[T], None], *, capacity: int = 64, max_bytes: int = 8 << 20) -> None:
        self._compile = compile_fn
        self._clone = clone_fn
        self._free = free_fn
        self.capacity = capacity
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, T] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._hits = 0
        self._misses = 0
        self._compile_seconds = 0.0

    def compile(self, text: str) -> None:
        """Make sure `text` is compiled (a hit if it already was); ValueError if it cannot be."""
        with self._lock:
            self._get(text, count_hit=True)

    def instance(self, text: str) -> T:
        """A private, pristine copy of the compiled `text` (the caller frees it). The request was
        `compile`d (and counted) already, so only a compile here (an entry evicted meanwhile)
        counts, as a miss."""
        with self._lock:
            return self._clone(self._get(text, count_hit=False))

    def stats(self) -> GrammarCacheStats:
        with self._lock:
            return GrammarCacheStats(self._hits, self._misses, len(self._entries), self._compile_seconds)

    def clear(self) -> None:
        with self._lock:
            for entry in self._entries.values():
                self._free(entry)
            self._entries.clear()
            self._bytes = 0

    def _get(self, text: str, *, count_hit: bool) -> T:
        entry = self._entries.get(text)
        if entry is not None:
            self._entries.move_to_end(text)
            self._hits += count_hit
            return entry
        t0 = time.perf_counter()
        entry = self._compile(text)  # under the lock: two requests never compile the same text twice
        self._compile_seconds += time.perf_counter() - t0
        self._misses += 1
        self._entries[text] = entry
        self._bytes += len(text)
        while len(self._entries) > 1 and (len(self._entries) > self.capacity or self._bytes > self.max_bytes):
            old_text, old = self._entries.popitem(last=False)
            self._bytes -= len(old_text)
            self._free(old)
        return entry
