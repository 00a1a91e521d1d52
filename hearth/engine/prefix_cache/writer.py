"""The prompt cache's one writer thread: it turns offered prompts into blocks in RAM and on disk.

`PrefixCache.offer` (engine thread) hands a finished prompt's tokens and KV bytes over (`put`);
the writer cuts the blocks that are not cached yet (`KVCodec.kv_split`), keeps them in RAM and
writes them to disk (files.py: atomic, checksummed). The engine thread only copies the KV out
(`Runner.state_get`). A backlog past `max_backlog` bytes drops the offer (counted), never blocks.
A full disk (ENOSPC, EDQUOT) stops disk writes; serving goes on.

Offers in hand (queued, or the one being stored) count as cached (`in_hand`), so a request that
follows another before the writer caught up neither copies nor reports the same tokens again.
"""

from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hearth.engine.kv import common_prefix_len
from hearth.engine.prefix_cache import files
from hearth.engine.prefix_cache.files import block_key, block_path
from hearth.engine.prefix_cache.index import Block, BlockIndex
from hearth.engine.prefix_cache.tiers import Tiers

log = logging.getLogger("hearth.prefix_cache")


@dataclass(slots=True)
class Offer:
    tokens: list[int]
    data: bytes
    keep: int  # tokens [0, keep) are kept (evicted last)
    ns: str = ""
    priority: int = 1  # the class of the request whose KV it is


# `KVCodec.kv_split`: a sequence's KV bytes cut into per-block payloads, one per token range.
Split = Callable[[bytes, list[tuple[int, int]]], list[bytes]]


class Writer:
    def __init__(self, index: BlockIndex, tiers: Tiers, split: Split, max_backlog: int) -> None:
        self.index, self.tiers, self.split = index, tiers, split
        self.max_backlog = max_backlog
        self.closed = False  # guarded by the index's lock, like the rest
        self._queue: list[Offer] = []
        self._backlog = 0  # bytes of the offers queued or being stored
        self._busy: Offer | None = None  # the offer the writer is handling
        self._thread = threading.Thread(target=self._loop, name="hearth-prompt-cache", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def in_hand(self, tokens: Sequence[int], ns: str) -> int:
        """Lock held: the longest common prefix of `tokens` with an offer queued or being stored."""
        have = 0
        for o in (*self._queue, *([self._busy] if self._busy is not None else [])):
            if o.ns == ns:
                have = max(have, common_prefix_len(o.tokens, tokens))
        return have

    def put(self, offer: Offer) -> bool:
        """Queue `offer` for the writer; False (counted) if the backlog has no room for it."""
        with self.index.lock:
            if self._backlog + len(offer.data) > self.max_backlog:
                self.index.stats.dropped_offers += 1
                return False
            self._queue.append(offer)
            self._backlog += len(offer.data)
            self.index.lock.notify_all()
        return True

    def flush(self, timeout: float) -> bool:
        """Wait until every offer so far is handled (its blocks in RAM and written, or
        dropped); False on timeout."""
        with self.index.lock:
            return self.index.lock.wait_for(lambda: not self._queue and self._busy is None, timeout)

    def close(self, timeout: float) -> None:
        """Finish the writes in hand and stop the thread."""
        self.flush(timeout)
        with self.index.lock:
            self.closed = True
            self.index.lock.notify_all()
        self._thread.join(timeout)

    def _loop(self) -> None:
        lock = self.index.lock
        while True:
            with lock:
                lock.wait_for(lambda: self._queue or self.closed)
                if not self._queue:
                    return
                offer = self._queue.pop(0)
                self._busy = offer
            try:
                self._store(offer)
            except Exception:
                log.exception("could not cache a prompt's KV")
            finally:
                with lock:
                    self._backlog -= len(offer.data)
                    self._busy = None
                    lock.notify_all()

    def _store(self, offer: Offer) -> None:
        """Cut the blocks of `offer` not cached yet, keep them in RAM, write them."""
        ix = self.index
        B, tokens = ix.block_tokens, offer.tokens
        new: list[Block] = []
        with ix.lock:
            h = ix.root(offer.ns)
            for start in range(0, len(tokens), B):
                chunk = tokens[start:start + B]
                key = block_key(h, chunk)
                b = ix.blocks.get(key)
                if b is None or not (b.data is not None or b.on_disk or b.writing):
                    if b is not None:
                        ix.remove(b)
                    new.append(Block(key, h, start, list(chunk), 0, kept=start < offer.keep,
                                     priority=offer.priority))
                else:
                    b.priority = max(b.priority, offer.priority)
                h = key
        if not new:
            return
        payloads = self.split(offer.data, [(b.start, b.start + len(b.tokens)) for b in new])
        with ix.lock:
            if self.closed:
                return
            for b, p in zip(new, payloads, strict=True):
                if b.start != 0 and b.parent not in ix.blocks:
                    break  # its parent was evicted meanwhile: the rest is unreachable
                b.data, b.n_bytes, b.writing = p, len(p), ix.dir is not None and not ix.stats.disk_full
                ix.insert(b)
                ix.ram += len(p)
            self.tiers.evict_ram()  # may drop the RAM copy of a block being written: the payload is here
            todo = [(b, p) for b, p in zip(new, payloads, strict=False) if b.writing and b.key in ix.blocks]
        for b, p in todo:
            self._write(b, p)

    def _write(self, b: Block, data: bytes) -> None:
        ix = self.index
        assert ix.dir is not None
        with ix.lock:
            if ix.stats.disk_full or ix.blocks.get(b.key) is not b:
                b.writing = False
                if b.data is None and not b.on_disk and ix.blocks.get(b.key) is b:
                    ix.remove(b)
                return
        try:
            header = files.write_block(ix.dir, b.key, b.parent, b.start, b.tokens, data, ix.fingerprint, b.kept)
        except OSError as e:
            with ix.lock:
                b.writing = False
                if e.errno in (errno.ENOSPC, errno.EDQUOT):
                    if not ix.stats.disk_full:
                        log.error("prompt cache: the disk is full (%s); cache writes stop, serving goes on", e)
                    ix.stats.disk_full = True
                else:
                    log.error("prompt cache: could not write a block: %s", e)
                ix.stats.write_errors += 1
                if b.data is None and ix.blocks.get(b.key) is b:
                    ix.remove(b)
            return
        with ix.lock:
            b.writing = False
            if ix.blocks.get(b.key) is not b:  # cleared or evicted meanwhile
                block_path(ix.dir, b.key).unlink(missing_ok=True)
                return
            b.file_bytes, b.header = header.file_bytes, header  # its checksum, for reading it back
            ix.disk += header.file_bytes
            ix.stats.written_blocks += 1
            self.tiers.evict_disk()
            self.tiers.evict_ram()
