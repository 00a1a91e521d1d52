"""The durable prompt cache: the KV of prompt prefixes in blocks, in host RAM and on disk.

Why blocks: llama.cpp hands a sequence's KV out whole (`llama_state_seq_get_data`), but its
layout is regular (per layer, one row per token), so the runner cuts it into per-block
payloads and joins them back (`KVCodec`). A prefix shared by many conversations (a 10k-token
system prompt and tool list) is stored once, and disk use grows with distinct tokens.

`PrefixCache` is the face the engine and the backend see; one module per part behind it:
- index.py: the blocks by hash-chain key, the tree they form, namespaces, the one lock;
- tiers.py: RAM and disk, their budgets and eviction, `prefetch` (disk → RAM), the start scan;
- writer.py: the writer thread that turns offered prompts into blocks in RAM and on disk;
- digest.py: block keys, digests, entries and counters, what a router and an admin read;
- files.py: one block on disk (format, checks); stats.py: the reported shapes.

A request finds the longest cached prefix (`match`, RAM only, on the engine thread) after
`prefetch` (on a worker thread, before the request reaches the engine) has read the disk blocks
of that prefix into RAM: the engine thread never reads a file. `offer` (engine thread) copies a
finished prompt's KV out (`Runner.state_get`) only when at least `min_new` tokens are new, and
hands it to the writer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from hearth.engine.prefix_cache import digest
from hearth.engine.prefix_cache.index import Block, BlockIndex
from hearth.engine.prefix_cache.stats import CacheEntry, PrefixCacheStats
from hearth.engine.prefix_cache.tiers import Tiers
from hearth.engine.prefix_cache.writer import Offer, Writer

BLOCK_TOKENS = 256


class KVCodec(Protocol):
    """The runner's cut and join of `state_get` bytes (see `Runner`)."""

    def kv_split(self, data: bytes, ranges: list[tuple[int, int]]) -> list[bytes]: ...

    def kv_join(self, parts: Sequence[tuple[bytes | bytearray, int, int]]) -> bytes: ...

    def kv_block_bytes(self, n_tokens: int) -> int: ...


@dataclass(slots=True)
class Match:
    """The longest cached prefix of a prompt in RAM, with its blocks' payloads taken under the
    lock (an eviction after `match` cannot pull them away): `parts` for `KVCodec.kv_join`."""

    n_tokens: int
    blocks: list[Block]
    parts: Sequence[tuple[bytes | bytearray, int, int]]  # (payload, tokens in it, tokens of it used)
    tier: str  # "disk" if any block was read from disk for it, else "ram"


class PrefixCache:
    def __init__(self, codec: KVCodec, fingerprint: dict[str, Any], *, directory: Path | None,
                 ram_budget: int, disk_budget: int, block_tokens: int = BLOCK_TOKENS, min_new: int = 16,
                 max_backlog: int | None = None) -> None:
        self.codec = codec
        self.fingerprint = fingerprint
        self.dir = directory if disk_budget > 0 else None
        self.block_tokens = block_tokens
        self.min_new = min_new
        stats = PrefixCacheStats(block_tokens)
        stats.tiers["ram"].budget, stats.tiers["disk"].budget = ram_budget, (disk_budget if self.dir else 0)
        self._index = BlockIndex(fingerprint, block_tokens, self.dir, stats)
        self._lock = self._index.lock  # one lock over the index, the tiers' bytes and the writer's queue
        self._root = self.root("")
        self._tiers = Tiers(self._index, ram_budget, disk_budget)
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._tiers.scan(codec.kv_block_bytes)
        backlog = max_backlog if max_backlog is not None else max(ram_budget, 256 << 20)
        self._writer = Writer(self._index, self._tiers, codec.kv_split, backlog)
        self._writer.start()

    # ---- lookups ---------------------------------------------------------------------------

    def root(self, ns: str = "") -> bytes:
        """The chain's root for namespace `ns` (any thread: a pure hash, memoized)."""
        return self._index.root(ns)

    def match(self, tokens: Sequence[int], ns: str = "") -> Match | None:
        """The longest prefix of `tokens` whose blocks are in RAM (None: not even one token)."""
        with self._lock:
            chain = self._index.walk(tokens, in_ram=True, ns=ns)
            if not chain:
                return None
            tier = "disk" if any(b.from_disk for b, _ in chain) else "ram"
            parts = [(b.data, len(b.tokens), n) for b, n in chain if b.data is not None]
            return Match(sum(n for _, n in chain), [b for b, _ in chain], parts, tier)

    def use(self, m: Match) -> None:
        """`m` served a prompt: touch its blocks and count the hit by tier."""
        now = time.time()
        with self._lock:
            for b in m.blocks:
                b.last_used, b.from_disk = now, False
            t = self._index.stats.tiers[m.tier]
            t.hits += 1
            t.tokens += m.n_tokens

    def record(self, tier: str | None, tokens: int) -> None:
        """A placement served `tokens` from `tier` ("slot" or "ram": a KV slot or session KV in
        RAM), or reused nothing (None)."""
        with self._lock:
            stats = self._index.stats
            if tier is None or tokens <= 0:
                stats.misses += 1
            else:
                stats.tiers[tier].hits += 1
                stats.tiers[tier].tokens += tokens

    def cached(self, tokens: Sequence[int], ns: str = "") -> int:
        """How many leading tokens of `tokens` are cached in any tier, or offered and not yet
        stored by the writer."""
        with self._lock:
            return self._have(tokens, ns)

    def _have(self, tokens: Sequence[int], ns: str) -> int:
        """Lock held: see `cached`."""
        have = sum(n for _, n in self._index.walk(tokens, in_ram=False, ns=ns))
        return max(have, self._writer.in_hand(tokens, ns))

    def prefetch(self, tokens: Sequence[int], ns: str = "") -> int:
        """Any thread but the engine's: read the disk blocks of the longest cached prefix of
        `tokens` into RAM; returns the tokens now in RAM (Tiers.prefetch)."""
        return self._tiers.prefetch(tokens, ns)

    def prefetch_recent(self, max_prompts: int, max_bytes: int, deadline: float | None = None) -> tuple[int, int]:
        """At start, any thread but the engine's: read the blocks of the `max_prompts` most
        recently used prompts into RAM, at most `max_bytes`, until `deadline` (monotonic), so
        the first requests after a restart find them there (Tiers.prefetch_recent); returns
        (prompts now wholly in RAM, bytes read)."""
        return self._tiers.prefetch_recent(max_prompts, min(max_bytes, self._tiers.ram_budget), deadline)

    def recent_prompts(self, n: int, ns: str = "") -> list[list[int]]:
        """The tokens of the `n` most recently used prompts of namespace `ns` whose blocks are
        all in RAM, newest first (what the start fills idle KV slots with)."""
        root = self.root(ns)
        out: list[list[int]] = []
        with self._lock:
            for chain in self._tiers.recent(len(self._index.blocks), 1 << 62):
                if len(out) >= n:
                    break
                if chain[0].parent == root and all(b.data is not None for b in chain):
                    out.append([t for b in chain for t in b.tokens])
        return out

    # ---- writes ----------------------------------------------------------------------------

    def offer(self, tokens: Sequence[int], get_data: Callable[[], bytes], *, keep: int = 0,
              counted: int = 0, ns: str = "", priority: int = 1) -> int:
        """Engine thread: cache the KV of `tokens` (what a finished request's slot holds).
        `get_data()` (the slot's `state_get`) is called only when at least `min_new` tokens are
        not cached yet. Tokens [0, keep) are kept (evicted last). Returns how many of tokens
        [0, counted) this offer writes (were not cached before): what a client's breakpoints
        wrote. `priority`: the admission class of the request whose KV it is (its blocks are
        evicted before those of a higher class; a block several offers share keeps the highest)."""
        keep, counted = min(keep, len(tokens)), min(counted, len(tokens))
        with self._lock:
            if self._writer.closed:
                return 0
            have = self._have(tokens, ns)
            if keep:
                self._index.mark_kept(tokens[:keep], ns)
            if len(tokens) - have < self.min_new:
                return 0
        if not self._writer.put(Offer(list(tokens), get_data(), keep, ns, priority)):
            return 0
        return max(0, counted - have)

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every offer so far is handled (its blocks in RAM and written, or
        dropped); False on timeout."""
        return self._writer.flush(timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Finish the writes in hand and stop the writer."""
        self._writer.close(timeout)

    def clear(self) -> int:
        """Drop every block from RAM and disk; returns how many there were. Disk writes resume
        if a full disk had stopped them."""
        self.flush()
        with self._lock:
            n = self._index.clear()
            self._index.stats.disk_full = False
            return n

    # ---- what it shows (digest.py) --------------------------------------------------------------

    def stats(self) -> PrefixCacheStats:
        return digest.stats(self._index)

    def entries(self) -> list[CacheEntry]:
        return digest.entries(self._index)

    @property
    def digest_root(self) -> str:
        """The default namespace's root, hex (the first block's parent)."""
        return self._root.hex()

    def chain(self, tokens: Sequence[int], ns: str = "") -> list[bytes]:
        """The keys the full blocks of `tokens` have (or would have) here in namespace `ns`, in
        order: what a router matches against a digest. Pure (no lock): hashing, no lookup."""
        return digest.chain(self._index, tokens, ns)

    def tails(self, tokens: Sequence[int], ns: str = "") -> list[list[bytes]]:
        """The tail keys of each block of `tokens` in namespace `ns`. Pure, like `chain`."""
        return digest.tails(self._index, tokens, ns)

    def slot_digest(self, tokens: Sequence[int], ns: str = "") -> tuple[list[bytes], list[bytes]]:
        """(full block keys, tail keys of the last partial block) of a slot's tokens in `ns`."""
        return digest.slot_digest(self._index, tokens, ns)

    def digest(self, ns: str = "") -> dict[str, Any]:
        """What this cache holds in namespace `ns`, by tier, as block hashes (digest.digest)."""
        return digest.digest(self._index, ns)
