"""Where the prompt cache's blocks live and how they move: host RAM and disk, each with a budget.

Tiers: slot (the engine's KV sequences; `Residency` owns them) → host RAM → disk. Every block
is in RAM, on disk, or both. `prefetch` (on a worker thread, before a request reaches the
engine) reads the disk blocks of a prompt's cached prefix into RAM: the engine thread never
reads a file.

Budgets: past one, the least recently used block goes first, blocks a client asked to keep
(`kept`: up to a cache_control breakpoint, or a conversation with a key) last. A block with a
copy in the other tier only loses this tier's copy; evicting a block from its last tier drops
its descendants too (they are unreachable without it). A prefix's blocks are touched together,
so a parent is never older than its child.

At start the directory is scanned (`scan`): headers and tokens only, no KV bytes; files that
fail a check (files.py) are counted, logged and deleted, and so are blocks whose parent is
missing. A first block (start 0) is a chain's start whatever its root: the scan keeps every
namespace's blocks across restarts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Sequence

from hearth.engine.prefix_cache import files
from hearth.engine.prefix_cache.files import BadBlockFile, BlockHeader, block_path
from hearth.engine.prefix_cache.index import Block, BlockIndex

log = logging.getLogger("hearth.prefix_cache")


def _order(b: Block) -> tuple[bool, int, float, int]:
    return b.kept, b.priority, b.last_used, -b.start  # evicted first: not kept, lowest class, oldest, deepest


class Tiers:
    def __init__(self, index: BlockIndex, ram_budget: int, disk_budget: int) -> None:
        self.index = index
        self.ram_budget, self.disk_budget = ram_budget, disk_budget

    def evict_ram(self) -> None:
        """Lock held: drop RAM copies, least valuable first, until RAM is within its budget."""
        ix = self.index
        if ix.ram <= self.ram_budget:
            return
        for b in sorted((b for b in ix.blocks.values() if b.data is not None), key=_order):
            if ix.ram <= self.ram_budget:
                break
            if ix.blocks.get(b.key) is not b or b.data is None:
                continue  # gone with an ancestor
            if b.on_disk or b.writing:
                ix.ram -= b.n_bytes
                b.data = None
            else:
                ix.remove(b)
            ix.stats.tiers["ram"].evictions += 1

    def evict_disk(self) -> None:
        """Lock held: delete block files, least valuable first, until disk is within its budget."""
        ix = self.index
        if ix.disk <= self.disk_budget:
            return
        assert ix.dir is not None
        for b in sorted((b for b in ix.blocks.values() if b.on_disk), key=_order):
            if ix.disk <= self.disk_budget:
                break
            if ix.blocks.get(b.key) is not b or not b.on_disk:
                continue  # gone with an ancestor
            if b.data is not None:
                block_path(ix.dir, b.key).unlink(missing_ok=True)
                ix.disk -= b.file_bytes
                b.file_bytes, b.header = 0, None
            else:
                ix.remove(b)
            ix.stats.tiers["disk"].evictions += 1

    def prefetch(self, tokens: Sequence[int], ns: str = "") -> int:
        """Any thread but the engine's: read from disk the blocks of the longest cached prefix
        of `tokens` that are not in RAM (checking each); returns the tokens now in RAM. A block
        that fails its check is dropped with its descendants, and the prefix ends before it.
        The chain's last block file is touched (its mtime is when it last served a prompt: what
        `recent` ranks by after a restart)."""
        ix = self.index
        with ix.lock:
            chain = ix.walk(tokens, in_ram=False, ns=ns)
        got = self._read(chain)
        if chain and got and ix.dir is not None and chain[-1][0].on_disk:
            with contextlib.suppress(OSError):
                os.utime(block_path(ix.dir, chain[-1][0].key))
        return got

    def _read(self, chain: Sequence[tuple[Block, int]]) -> int:
        """Read `chain`'s blocks that are not in RAM, in order, checking each; the tokens now in
        RAM (of each block, the count given with it), up to the first block that could not be."""
        ix = self.index
        got = 0
        for b, n in chain:
            with ix.lock:
                if b.key not in ix.blocks:
                    break
                if b.data is not None:
                    b.last_used = time.time()
                    got += n
                    continue
                header = b.header
            if header is None or ix.dir is None:  # being written: its payload is with the writer
                break
            t0 = time.monotonic()
            try:
                data = files.read_payload(block_path(ix.dir, b.key), header)
            except BadBlockFile as e:
                log.warning("ignoring prompt-cache block %s: %s", b.key.hex(), e)
                with ix.lock:
                    ix.stats.rejected_files += 1
                    ix.remove(b)
                break
            with ix.lock:
                ix.stats.loaded_bytes += len(data)
                ix.stats.load_seconds += time.monotonic() - t0
                if b.key not in ix.blocks:
                    break
                if b.data is None:
                    b.data, b.from_disk = data, True
                    ix.ram += len(data)
                b.last_used = time.time()
                got += n
        with ix.lock:
            self.evict_ram()
        return got

    def recent(self, max_prompts: int, max_bytes: int) -> list[list[Block]]:
        """Lock held: the chains (root first) of the `max_prompts` most recently used prompt
        ends, newest first, whose blocks not in RAM take at most `max_bytes` together (a chain
        that does not fit is skipped, an older one that fits may still be taken). A prompt end
        is any block, ranked by `last_used` (after a restart, the file's mtime: written, or
        last served by `prefetch`); a block in a chain already ranked (taken or skipped) is
        not an end of its own."""
        ix = self.index
        chosen: list[list[Block]] = []
        taken: set[bytes] = set()
        left = max_bytes
        # Ties (a prompt's blocks written in one second): the deepest first, a prefix is no end.
        for end in sorted(ix.blocks.values(), key=lambda b: (b.last_used, b.start), reverse=True):
            if len(chosen) >= max_prompts:
                break
            if end.key in taken:
                continue
            chain: list[Block] = []
            b: Block | None = end
            while b is not None:
                chain.append(b)
                b = ix.blocks.get(b.parent) if b.start > 0 else None
            chain.reverse()
            if chain[0].start != 0:  # a broken chain (cannot happen after the scan): not a prompt
                continue
            cost = sum(b.n_bytes for b in chain if b.data is None and b.key not in taken)
            taken.update(b.key for b in chain)  # a prompt is read whole or not at all: its prefix is no end either
            if cost > left:
                continue
            left -= cost
            chosen.append(chain)
        return chosen

    def prefetch_recent(self, max_prompts: int, max_bytes: int, deadline: float | None = None) -> tuple[int, int]:
        """Any thread but the engine's (at start): read into RAM the blocks of the most recently
        used prompts (`recent`), each checked as a request's prefetch checks it (a bad block is
        dropped with its descendants and never loaded). Stops at `deadline` (time.monotonic()).
        Returns (prompts whose chain is now wholly in RAM, bytes read)."""
        ix = self.index
        with ix.lock:
            chains = self.recent(max_prompts, max_bytes)
            before = ix.stats.loaded_bytes
            # Reading touches a block (last_used): put back what ranked them, so eviction and the
            # next `recent` still see when each prompt was last used, not the order read here.
            used = {b.key: b.last_used for chain in chains for b in chain}
        whole = 0
        for chain in chains:
            if deadline is not None and time.monotonic() >= deadline:
                break
            if self._read([(b, len(b.tokens)) for b in chain]) == sum(len(b.tokens) for b in chain):
                whole += 1
        with ix.lock:
            for chain in chains:
                for b in chain:
                    b.last_used = used[b.key]
            return whole, ix.stats.loaded_bytes - before

    def scan(self, kv_block_bytes: Callable[[int], int]) -> None:
        """At start, before any other thread uses the index: what is on disk, from headers and
        tokens only (no KV bytes read)."""
        ix = self.index
        assert ix.dir is not None
        for stale in ix.dir.glob(".*.tmp"):
            stale.unlink(missing_ok=True)
        headers: list[tuple[BlockHeader, float]] = []
        for path in ix.dir.glob(f"*{files.SUFFIX}"):
            try:
                h = files.read_header(path, ix.fingerprint, ix.block_tokens, kv_block_bytes)
                headers.append((h, path.stat().st_mtime))
            except (BadBlockFile, OSError) as e:
                log.warning("ignoring prompt-cache file %s: %s", path.name, e)
                ix.stats.rejected_files += 1
                path.unlink(missing_ok=True)
        # A block is usable if its chain reaches a first block (start 0) through full blocks.
        for h, mtime in sorted(headers, key=lambda x: x[0].start):
            parent = ix.blocks.get(h.parent)
            ok = (h.start == 0 or (parent is not None and len(parent.tokens) == ix.block_tokens
                                   and parent.start + ix.block_tokens == h.start))
            if not ok:
                log.warning("ignoring prompt-cache block %s: its parent is missing", h.key.hex())
                block_path(ix.dir, h.key).unlink(missing_ok=True)
                continue
            b = Block(h.key, h.parent, h.start, h.tokens, h.kv_bytes, file_bytes=h.file_bytes, header=h,
                      kept=h.kept, last_used=mtime)
            ix.insert(b)
            ix.disk += h.file_bytes
        if ix.blocks:
            log.info("prompt cache: %d block(s), %d token(s), %.1f MB on disk", len(ix.blocks),
                     sum(len(b.tokens) for b in ix.blocks.values()), ix.disk / 1e6)
        self.evict_disk()
