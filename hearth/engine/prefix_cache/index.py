"""The prompt cache's index: every block it knows, by key, and the tree their hash chains form.

A block is `block_tokens` consecutive tokens keyed by a hash chain (files.py), as vLLM, SGLang
and llm-d key theirs: a prefix shared by many conversations is stored once. The last block of a
prompt may be partial; a prompt that continues past it later stores its own full block there
(at most one partial block per prompt end).
A lookup (`walk`) follows full blocks by key and may end inside a block: a block whose first
tokens equal the prompt's serves those tokens (KV at a position depends only on the tokens up to
it), so a second conversation finds cached every token up to the first one that differs.

Namespaces: every lookup and write names one (`ns`, "" by default): it salts the chain's root
(files.root_key), so prompts in different namespaces share no block, and a namespace's blocks
are exactly those reachable from its root. The server gives each tenant its own (docs/api.md,
"Prompt cache and tenants").

Thread-safety: `lock` (a Condition: the writer waits on it too) guards everything here, the
counters in `stats` included; the methods say "lock held" where the caller holds it. File
reads and writes happen outside it, except the unlinks of `remove`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hearth.engine.kv import common_prefix_len
from hearth.engine.prefix_cache import files
from hearth.engine.prefix_cache.files import BlockHeader, block_key, block_path
from hearth.engine.prefix_cache.stats import PrefixCacheStats

MAX_ROOTS = 4096  # namespaces' roots remembered (recomputed when forgotten)


@dataclass(slots=True, eq=False)
class Block:
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


class BlockIndex:
    """The blocks by key, each parent's children, the bytes each tier holds, and the counters."""

    def __init__(self, fingerprint: dict[str, Any], block_tokens: int, directory: Path | None,
                 stats: PrefixCacheStats) -> None:
        self.fingerprint = fingerprint
        self.block_tokens = block_tokens
        self.dir = directory  # None: no disk tier
        self.stats = stats
        self.lock = threading.Condition()
        self.blocks: dict[bytes, Block] = {}
        self.children: dict[bytes, set[bytes]] = {}
        self.ram = self.disk = 0  # bytes held per tier
        self._roots: dict[str, bytes] = {}

    def root(self, ns: str = "") -> bytes:
        """The chain's root for namespace `ns` (any thread: a pure hash, memoized)."""
        got = self._roots.get(ns)
        if got is None:
            if len(self._roots) >= MAX_ROOTS:  # per-request salts are the client's: bound the memo
                self._roots.clear()
            got = self._roots[ns] = files.root_key(self.fingerprint, ns)
        return got

    def walk(self, tokens: Sequence[int], in_ram: bool, ns: str = "") -> list[tuple[Block, int]]:
        """Lock held: the blocks of the longest cached prefix of `tokens` in namespace `ns` (in
        RAM only, or in any tier), each with how many of its tokens match."""
        B, h, pos = self.block_tokens, self.root(ns), 0
        out: list[tuple[Block, int]] = []

        def usable(b: Block) -> bool:
            return b.data is not None if in_ram else (b.data is not None or b.on_disk or b.writing)

        while pos < len(tokens):
            chunk = tokens[pos:pos + B]
            if len(chunk) == B:
                b = self.blocks.get(block_key(h, chunk))
                if b is not None and usable(b):
                    out.append((b, B))
                    h, pos = b.key, pos + B
                    continue
            best, n = None, 0
            for k in self.children.get(h, ()):
                c = self.blocks[k]
                m = common_prefix_len(c.tokens, chunk)
                if m > n and usable(c):
                    best, n = c, m
            if best is not None:
                out.append((best, n))
            break
        return out

    def mark_kept(self, tokens: Sequence[int], ns: str) -> None:
        """Lock held: the cached blocks of `tokens` are evicted last from now on."""
        for b, _ in self.walk(tokens, in_ram=False, ns=ns):
            b.kept = True

    def insert(self, b: Block) -> None:
        """Lock held."""
        self.blocks[b.key] = b
        self.children.setdefault(b.parent, set()).add(b.key)

    def remove(self, b: Block) -> None:
        """Lock held: forget `b` and its descendants in every tier (their files deleted): they
        are unreachable without it."""
        todo = [b]
        while todo:
            x = todo.pop()
            if self.blocks.get(x.key) is not x:
                continue
            del self.blocks[x.key]
            sib = self.children.get(x.parent)
            if sib is not None:
                sib.discard(x.key)
                if not sib:
                    del self.children[x.parent]
            todo.extend(self.blocks[k] for k in self.children.get(x.key, ()) if k in self.blocks)
            if x.data is not None:
                self.ram -= x.n_bytes
                x.data = None
            if x.on_disk:
                self.disk -= x.file_bytes
                x.file_bytes = 0
                assert self.dir is not None
                block_path(self.dir, x.key).unlink(missing_ok=True)

    def clear(self) -> int:
        """Lock held: drop every block; how many there were."""
        n = len(self.blocks)
        for b in list(self.blocks.values()):
            self.remove(b)
        return n
