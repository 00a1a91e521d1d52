"""The durable prompt cache: the KV of prompt prefixes in blocks, in host RAM and on disk.

Why blocks: llama.cpp hands a sequence's KV out whole (`llama_state_seq_get_data`), but its
layout is regular (per layer, one row per token), so the runner cuts it into per-block
payloads and joins them back (`KVCodec`). A block is `block_tokens` consecutive tokens keyed
by a hash chain (files.py), as vLLM, SGLang and llm-d key theirs: a prefix shared by many
conversations (a 10k-token system prompt and tool list) is stored once, and disk use grows
with distinct tokens. The last block of a prompt may be partial; a prompt that continues
past it later stores its own full block there (at most one partial block per prompt end).

Tiers: slot (the engine's KV sequences; `Residency` owns them) → host RAM → disk. Every
block is in RAM, on disk, or both. A request finds the longest cached prefix
(`match`, RAM only, on the engine thread) after `prefetch` (on a worker thread, before the
request reaches the engine) has read the disk blocks of that prefix into RAM: the engine
thread never reads a file. A match may end inside a block: a block whose first tokens equal
the prompt's serves those tokens (KV at a position depends only on the tokens up to it), so
a second conversation finds cached every token up to the first one that differs.

Writes: `offer` (engine thread) hands a finished prompt's tokens and KV bytes to one writer
thread, which cuts the blocks that are not cached yet, keeps them in RAM and writes them to
disk (files.py: atomic, checksummed). The engine thread only copies the KV out
(`Runner.state_get`), and only when at least `min_new` tokens are new. A backlog past
`max_backlog` bytes drops the offer (counted), never blocks.

Budgets: RAM and disk each have a byte budget; past it the least recently used block goes
first, blocks a client asked to keep (`kept`: up to a cache_control breakpoint, or a
conversation with a key) last. Evicting a block from its last tier drops its descendants
too (they are unreachable without it); a prefix's blocks are touched together, so a parent
is never older than its child. A full disk (ENOSPC, EDQUOT) stops disk writes; serving goes on.

At start the directory is scanned: headers and tokens only, no KV bytes; files that fail a
check (files.py) are counted, logged and deleted, and so are blocks whose parent is missing.

Namespaces: every lookup and write names one (`ns`, "" by default): it salts the chain's root
(files.root_key), so prompts in different namespaces share no block, and a namespace's blocks
are exactly those reachable from its root. The server gives each tenant its own (docs/api.md,
"Prompt cache and tenants"); a digest lists only its namespace's blocks. A first block (start 0)
is a chain's start whatever its root: the scan keeps every namespace's blocks across restarts.

Thread-safety: one lock over the index; file reads and writes happen outside it.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from hearth.engine.kv import common_prefix_len
from hearth.engine.prefix_cache import files
from hearth.engine.prefix_cache.files import BadBlockFile, BlockHeader, block_key, block_path, tail_keys
from hearth.engine.prefix_cache.stats import CacheEntry, PrefixCacheStats

log = logging.getLogger("hearth.prefix_cache")

BLOCK_TOKENS = 256
MAX_ROOTS = 4096  # namespaces' roots remembered (recomputed when forgotten)


class KVCodec(Protocol):
    """The runner's cut and join of `state_get` bytes (see `Runner`)."""

    def kv_split(self, data: bytes, ranges: list[tuple[int, int]]) -> list[bytes]: ...

    def kv_join(self, parts: Sequence[tuple[bytes | bytearray, int, int]]) -> bytes: ...

    def kv_block_bytes(self, n_tokens: int) -> int: ...


@dataclass(slots=True, eq=False)
class _Block:
    key: bytes
    parent: bytes
    start: int
    tokens: list[int]
    n_bytes: int  # payload size
    data: bytes | bytearray | None = None  # the payload, when in RAM (a bytearray: read from disk)
    file_bytes: int = 0  # > 0: on disk
    header: BlockHeader | None = None  # once on disk: what reading the payload back checks
    writing: bool = False  # the writer holds its payload and is writing it
    kept: bool = False
    # the highest admission class (fair_share.Priority) of the requests whose KV it is: a
    # `flex` batch line's blocks are evicted before an interactive conversation's
    priority: int = 1
    last_used: float = field(default_factory=time.time)
    from_disk: bool = False  # read from disk since it last served a prompt (reports the tier)
    tail: list[bytes] | None = None  # its tail keys (a partial block's), hashed once for digests

    @property
    def on_disk(self) -> bool:
        return self.file_bytes > 0


@dataclass(slots=True)
class Match:
    """The longest cached prefix of a prompt in RAM, with its blocks' payloads taken under the
    lock (an eviction after `match` cannot pull them away): `parts` for `KVCodec.kv_join`."""

    n_tokens: int
    blocks: list[_Block]
    parts: Sequence[tuple[bytes | bytearray, int, int]]  # (payload, tokens in it, tokens of it used)
    tier: str  # "disk" if any block was read from disk for it, else "ram"


@dataclass(slots=True)
class _Offer:
    tokens: list[int]
    data: bytes
    keep: int  # tokens [0, keep) are kept (evicted last)
    ns: str = ""
    priority: int = 1  # the class of the request whose KV it is


class PrefixCache:
    def __init__(self, codec: KVCodec, fingerprint: dict[str, Any], *, directory: Path | None,
                 ram_budget: int, disk_budget: int, block_tokens: int = BLOCK_TOKENS, min_new: int = 16,
                 max_backlog: int | None = None) -> None:
        self.codec = codec
        self.fingerprint = fingerprint
        self.dir = directory if disk_budget > 0 else None
        self.block_tokens = block_tokens
        self.min_new = min_new
        self.ram_budget, self.disk_budget = ram_budget, disk_budget
        self.max_backlog = max_backlog if max_backlog is not None else max(ram_budget, 256 << 20)
        self._roots: dict[str, bytes] = {}
        self._root = self.root("")
        self._lock = threading.Condition()
        self._blocks: dict[bytes, _Block] = {}
        self._children: dict[bytes, set[bytes]] = {}
        self._ram = self._disk = 0  # bytes held per tier
        self._queue: list[_Offer] = []
        self._backlog = 0
        self._busy: _Offer | None = None  # the offer the writer is handling
        self._closed = False
        self._stats = PrefixCacheStats(block_tokens)
        self._stats.tiers["ram"].budget, self._stats.tiers["disk"].budget = ram_budget, (disk_budget if self.dir else 0)
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._scan()
        self._writer = threading.Thread(target=self._write_loop, name="hearth-prompt-cache", daemon=True)
        self._writer.start()

    # ---- lookups ---------------------------------------------------------------------------

    def root(self, ns: str = "") -> bytes:
        """The chain's root for namespace `ns` (any thread: a pure hash, memoized)."""
        got = self._roots.get(ns)
        if got is None:
            if len(self._roots) >= MAX_ROOTS:  # per-request salts are the client's: bound the memo
                self._roots.clear()
            got = self._roots[ns] = files.root_key(self.fingerprint, ns)
        return got

    def _walk(self, tokens: Sequence[int], in_ram: bool, ns: str = "") -> list[tuple[_Block, int]]:
        """Lock held: the blocks of the longest cached prefix of `tokens` in namespace `ns` (in
        RAM only, or in any tier), each with how many of its tokens match."""
        B, h, pos = self.block_tokens, self.root(ns), 0
        out: list[tuple[_Block, int]] = []

        def usable(b: _Block) -> bool:
            return b.data is not None if in_ram else (b.data is not None or b.on_disk or b.writing)

        while pos < len(tokens):
            chunk = tokens[pos:pos + B]
            if len(chunk) == B:
                b = self._blocks.get(block_key(h, chunk))
                if b is not None and usable(b):
                    out.append((b, B))
                    h, pos = b.key, pos + B
                    continue
            best, n = None, 0
            for k in self._children.get(h, ()):
                c = self._blocks[k]
                m = common_prefix_len(c.tokens, chunk)
                if m > n and usable(c):
                    best, n = c, m
            if best is not None:
                out.append((best, n))
            break
        return out

    def match(self, tokens: Sequence[int], ns: str = "") -> Match | None:
        """The longest prefix of `tokens` whose blocks are in RAM (None: not even one token)."""
        with self._lock:
            chain = self._walk(tokens, in_ram=True, ns=ns)
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
            t = self._stats.tiers[m.tier]
            t.hits += 1
            t.tokens += m.n_tokens

    def record(self, tier: str | None, tokens: int) -> None:
        """A placement served `tokens` from `tier` ("slot" or "ram": a KV slot or session KV in
        RAM), or reused nothing (None)."""
        with self._lock:
            if tier is None or tokens <= 0:
                self._stats.misses += 1
            else:
                self._stats.tiers[tier].hits += 1
                self._stats.tiers[tier].tokens += tokens

    def cached(self, tokens: Sequence[int], ns: str = "") -> int:
        """How many leading tokens of `tokens` are cached in any tier, or offered and not yet
        stored by the writer."""
        with self._lock:
            return self._have(tokens, ns)

    def _have(self, tokens: Sequence[int], ns: str) -> int:
        """Lock held: see `cached`. Counting the offers in hand keeps a request that follows
        another before the writer caught up from copying and reporting the same tokens again."""
        have = sum(n for _, n in self._walk(tokens, in_ram=False, ns=ns))
        for o in (*self._queue, *([self._busy] if self._busy is not None else [])):
            if o.ns == ns:
                have = max(have, common_prefix_len(o.tokens, tokens))
        return have

    def prefetch(self, tokens: Sequence[int], ns: str = "") -> int:
        """Any thread but the engine's: read from disk the blocks of the longest cached prefix
        of `tokens` that are not in RAM (checking each); returns the tokens now in RAM. A block
        that fails its check is dropped with its descendants, and the prefix ends before it."""
        with self._lock:
            chain = self._walk(tokens, in_ram=False, ns=ns)
        got = 0
        for b, n in chain:
            with self._lock:
                if b.key not in self._blocks:
                    break
                if b.data is not None:
                    b.last_used = time.time()
                    got += n
                    continue
                header = b.header
            if header is None or self.dir is None:  # being written: its payload is with the writer
                break
            t0 = time.monotonic()
            try:
                data = files.read_payload(block_path(self.dir, b.key), header)
            except BadBlockFile as e:
                log.warning("ignoring prompt-cache block %s: %s", b.key.hex(), e)
                with self._lock:
                    self._stats.rejected_files += 1
                    self._remove(b)
                break
            with self._lock:
                self._stats.loaded_bytes += len(data)
                self._stats.load_seconds += time.monotonic() - t0
                if b.key not in self._blocks:
                    break
                if b.data is None:
                    b.data, b.from_disk = data, True
                    self._ram += len(data)
                b.last_used = time.time()
                got += n
        with self._lock:
            self._evict_ram()
        return got

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
            if self._closed:
                return 0
            have = self._have(tokens, ns)
            if keep:
                self._mark_kept(tokens[:keep], ns)
            if len(tokens) - have < self.min_new:
                return 0
        data = get_data()
        with self._lock:
            if self._backlog + len(data) > self.max_backlog:
                self._stats.dropped_offers += 1
                return 0
            self._queue.append(_Offer(list(tokens), data, keep, ns, priority))
            self._backlog += len(data)
            self._lock.notify_all()
        return max(0, counted - have)

    def _mark_kept(self, tokens: Sequence[int], ns: str) -> None:
        for b, _ in self._walk(tokens, in_ram=False, ns=ns):
            b.kept = True

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every offer so far is handled (its blocks in RAM and written, or
        dropped); False on timeout."""
        with self._lock:
            return self._lock.wait_for(lambda: not self._queue and self._busy is None, timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Finish the writes in hand and stop the writer."""
        self.flush(timeout)
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._writer.join(timeout)

    def _write_loop(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._queue or self._closed)
                if not self._queue:
                    return
                offer = self._queue.pop(0)
                self._busy = offer
            try:
                self._store(offer)
            except Exception:
                log.exception("could not cache a prompt's KV")
            finally:
                with self._lock:
                    self._backlog -= len(offer.data)
                    self._busy = None
                    self._lock.notify_all()

    def _store(self, offer: _Offer) -> None:
        """Writer thread: cut the blocks of `offer` not cached yet, keep them in RAM, write them."""
        B, tokens = self.block_tokens, offer.tokens
        new: list[_Block] = []
        with self._lock:
            h = self.root(offer.ns)
            for start in range(0, len(tokens), B):
                chunk = tokens[start:start + B]
                key = block_key(h, chunk)
                b = self._blocks.get(key)
                if b is None or not (b.data is not None or b.on_disk or b.writing):
                    if b is not None:
                        self._remove(b)
                    new.append(_Block(key, h, start, list(chunk), 0, kept=start < offer.keep,
                                      priority=offer.priority))
                else:
                    b.priority = max(b.priority, offer.priority)
                h = key
        if not new:
            return
        payloads = self.codec.kv_split(offer.data, [(b.start, b.start + len(b.tokens)) for b in new])
        with self._lock:
            if self._closed:
                return
            for b, p in zip(new, payloads, strict=True):
                if b.start != 0 and b.parent not in self._blocks:
                    break  # its parent was evicted meanwhile: the rest is unreachable
                b.data, b.n_bytes, b.writing = p, len(p), self.dir is not None and not self._stats.disk_full
                self._insert(b)
                self._ram += len(p)
            self._evict_ram()  # may drop the RAM copy of a block being written: the payload is here
            todo = [(b, p) for b, p in zip(new, payloads, strict=False) if b.writing and b.key in self._blocks]
        for b, p in todo:
            self._write(b, p)

    def _write(self, b: _Block, data: bytes) -> None:
        assert self.dir is not None
        with self._lock:
            if self._stats.disk_full or self._blocks.get(b.key) is not b:
                b.writing = False
                if b.data is None and not b.on_disk and self._blocks.get(b.key) is b:
                    self._remove(b)
                return
        try:
            header = files.write_block(self.dir, b.key, b.parent, b.start, b.tokens, data, self.fingerprint, b.kept)
        except OSError as e:
            with self._lock:
                b.writing = False
                if e.errno in (errno.ENOSPC, errno.EDQUOT):
                    if not self._stats.disk_full:
                        log.error("prompt cache: the disk is full (%s); cache writes stop, serving goes on", e)
                    self._stats.disk_full = True
                else:
                    log.error("prompt cache: could not write a block: %s", e)
                self._stats.write_errors += 1
                if b.data is None and self._blocks.get(b.key) is b:
                    self._remove(b)
            return
        with self._lock:
            b.writing = False
            if self._blocks.get(b.key) is not b:  # cleared or evicted meanwhile
                block_path(self.dir, b.key).unlink(missing_ok=True)
                return
            b.file_bytes, b.header = header.file_bytes, header  # its checksum, for reading it back
            self._disk += header.file_bytes
            self._stats.written_blocks += 1
            self._evict_disk()
            self._evict_ram()

    # ---- the index (lock held) ---------------------------------------------------------------

    def _insert(self, b: _Block) -> None:
        self._blocks[b.key] = b
        self._children.setdefault(b.parent, set()).add(b.key)

    def _remove(self, b: _Block) -> None:
        """Forget `b` and its descendants in every tier (their files deleted)."""
        todo = [b]
        while todo:
            x = todo.pop()
            if self._blocks.get(x.key) is not x:
                continue
            del self._blocks[x.key]
            sib = self._children.get(x.parent)
            if sib is not None:
                sib.discard(x.key)
                if not sib:
                    del self._children[x.parent]
            todo.extend(self._blocks[k] for k in self._children.get(x.key, ()) if k in self._blocks)
            if x.data is not None:
                self._ram -= x.n_bytes
                x.data = None
            if x.on_disk:
                self._disk -= x.file_bytes
                x.file_bytes = 0
                assert self.dir is not None
                block_path(self.dir, x.key).unlink(missing_ok=True)

    @staticmethod
    def _order(b: _Block) -> tuple[bool, int, float, int]:
        return b.kept, b.priority, b.last_used, -b.start  # evicted first: not kept, lowest class, oldest, deepest

    def _evict_ram(self) -> None:
        if self._ram <= self.ram_budget:
            return
        for b in sorted((b for b in self._blocks.values() if b.data is not None), key=self._order):
            if self._ram <= self.ram_budget:
                break
            if self._blocks.get(b.key) is not b or b.data is None:
                continue  # gone with an ancestor
            if b.on_disk or b.writing:
                self._ram -= b.n_bytes
                b.data = None
            else:
                self._remove(b)
            self._stats.tiers["ram"].evictions += 1

    def _evict_disk(self) -> None:
        if self._disk <= self.disk_budget:
            return
        assert self.dir is not None
        for b in sorted((b for b in self._blocks.values() if b.on_disk), key=self._order):
            if self._disk <= self.disk_budget:
                break
            if self._blocks.get(b.key) is not b or not b.on_disk:
                continue  # gone with an ancestor
            if b.data is not None:
                block_path(self.dir, b.key).unlink(missing_ok=True)
                self._disk -= b.file_bytes
                b.file_bytes, b.header = 0, None
            else:
                self._remove(b)
            self._stats.tiers["disk"].evictions += 1

    def _scan(self) -> None:
        """What is on disk, from headers and tokens only (no KV bytes read)."""
        assert self.dir is not None
        for stale in self.dir.glob(".*.tmp"):
            stale.unlink(missing_ok=True)
        headers: list[tuple[BlockHeader, float]] = []
        for path in self.dir.glob(f"*{files.SUFFIX}"):
            try:
                h = files.read_header(path, self.fingerprint, self.block_tokens, self.codec.kv_block_bytes)
                headers.append((h, path.stat().st_mtime))
            except (BadBlockFile, OSError) as e:
                log.warning("ignoring prompt-cache file %s: %s", path.name, e)
                self._stats.rejected_files += 1
                path.unlink(missing_ok=True)
        # A block is usable if its chain reaches a first block (start 0) through full blocks.
        for h, mtime in sorted(headers, key=lambda x: x[0].start):
            parent = self._blocks.get(h.parent)
            ok = (h.start == 0 or (parent is not None and len(parent.tokens) == self.block_tokens
                                   and parent.start + self.block_tokens == h.start))
            if not ok:
                log.warning("ignoring prompt-cache block %s: its parent is missing", h.key.hex())
                block_path(self.dir, h.key).unlink(missing_ok=True)
                continue
            b = _Block(h.key, h.parent, h.start, h.tokens, h.kv_bytes, file_bytes=h.file_bytes, header=h,
                       kept=h.kept, last_used=mtime)
            self._insert(b)
            self._disk += h.file_bytes
        if self._blocks:
            log.info("prompt cache: %d block(s), %d token(s), %.1f MB on disk", len(self._blocks),
                     sum(len(b.tokens) for b in self._blocks.values()), self._disk / 1e6)
        self._evict_disk()

    # ---- reporting and management ---------------------------------------------------------------

    def stats(self) -> PrefixCacheStats:
        with self._lock:
            s = self._stats
            out = replace(s, tiers={k: replace(v) for k, v in s.tiers.items()})
            ram = [b for b in self._blocks.values() if b.data is not None]
            disk = [b for b in self._blocks.values() if b.on_disk]
            out.tiers["ram"].blocks, out.tiers["ram"].bytes = len(ram), self._ram
            out.tiers["disk"].blocks, out.tiers["disk"].bytes = len(disk), self._disk
            return out

    def entries(self) -> list[CacheEntry]:
        with self._lock:
            return [CacheEntry(b.key.hex(), b.parent.hex(), b.start, len(b.tokens), b.data is not None,
                               b.on_disk, b.kept, b.last_used)
                    for b in sorted(self._blocks.values(), key=lambda b: (b.start, b.key))]

    @property
    def digest_root(self) -> str:
        """The default namespace's root, hex (the first block's parent)."""
        return self._root.hex()

    def chain(self, tokens: Sequence[int], ns: str = "") -> list[bytes]:
        """The keys the full blocks of `tokens` have (or would have) here in namespace `ns`, in
        order: what a router matches against a digest. Pure (no lock): hashing, no lookup."""
        B, h, out = self.block_tokens, self.root(ns), []
        for pos in range(0, len(tokens) - B + 1, B):
            h = block_key(h, tokens[pos:pos + B])
            out.append(h)
        return out

    def tails(self, tokens: Sequence[int], ns: str = "") -> list[list[bytes]]:
        """The tail keys (files.tail_keys) of each block of `tokens` in namespace `ns`, the last
        partial one's included: what a router matches a digest's tails against. Pure, like `chain`."""
        B, h, out = self.block_tokens, self.root(ns), []
        for pos in range(0, len(tokens), B):
            out.append(tail_keys(h, tokens[pos:pos + B], B))
            if pos + B <= len(tokens):
                h = block_key(h, tokens[pos:pos + B])
        return out

    def slot_digest(self, tokens: Sequence[int], ns: str = "") -> tuple[list[bytes], list[bytes]]:
        """(full block keys, tail keys of the last partial block) of a slot's tokens in namespace
        `ns`: what a request continuing them reuses in place."""
        keys = self.chain(tokens, ns)
        full = len(keys) * self.block_tokens
        if full == len(tokens):
            return keys, []
        return keys, tail_keys(keys[-1] if keys else self.root(ns), tokens[full:], self.block_tokens)

    def digest(self, ns: str = "") -> dict[str, Any]:
        """What this cache holds in namespace `ns`, by tier, as block hashes (how they chain:
        files.py), and the tail keys of its partial blocks (prompts' ends: where the next turn's
        match ends). Only the blocks reachable from the namespace's root: another namespace's
        hashes are never shown (knowing its root, one could test guessed prompts against them)."""
        root = self.root(ns)
        with self._lock:  # the tiers read under the lock; the tail hashing outside it
            mine, todo = [], list(self._children.get(root, ()))
            while todo:
                b = self._blocks.get(todo.pop())
                if b is not None:
                    mine.append((b, b.data is not None, b.on_disk))
                    todo.extend(self._children.get(b.key, ()))
        tails: dict[str, set[str]] = {"ram": set(), "disk": set()}
        for b, in_ram, on_disk in mine:
            if len(b.tokens) < self.block_tokens:  # a block's tokens never change once cut: hashed once
                if b.tail is None:
                    b.tail = tail_keys(b.parent, b.tokens, self.block_tokens)
                ks = [k.hex() for k in b.tail]
                for tier, there in (("ram", in_ram), ("disk", on_disk)):
                    if there:
                        tails[tier].update(ks)
        return {"block_tokens": self.block_tokens, "root": root.hex(),
                "ram": sorted(b.key.hex() for b, in_ram, _ in mine if in_ram),
                "disk": sorted(b.key.hex() for b, _, on_disk in mine if on_disk),
                "tails_ram": sorted(tails["ram"]), "tails_disk": sorted(tails["disk"])}

    def clear(self) -> int:
        """Drop every block from RAM and disk; returns how many there were. Disk writes resume
        if a full disk had stopped them."""
        self.flush()
        with self._lock:
            n = len(self._blocks)
            for b in list(self._blocks.values()):
                self._remove(b)
            self._stats.disk_full = False
            return n
