"""What the prompt cache shows: a prompt's block keys and a namespace's digest (for a router),
its blocks and counters (for an admin and /metrics).

Keys (`chain`, `tails`, `slot_digest`) are pure hashing, no lookup: they take no lock. A digest
lists only the blocks reachable from its namespace's root: another namespace's hashes are never
shown (knowing its root, one could test guessed prompts against them). How the hashes chain:
files.py and docs/api.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from hearth.engine.prefix_cache.files import block_key, tail_keys
from hearth.engine.prefix_cache.index import Block, BlockIndex
from hearth.engine.prefix_cache.stats import CacheEntry, PrefixCacheStats


def chain(ix: BlockIndex, tokens: Sequence[int], ns: str = "") -> list[bytes]:
    """The keys the full blocks of `tokens` have (or would have) in namespace `ns`, in order:
    what a router matches against a digest."""
    B, h, out = ix.block_tokens, ix.root(ns), []
    for pos in range(0, len(tokens) - B + 1, B):
        h = block_key(h, tokens[pos:pos + B])
        out.append(h)
    return out


def tails(ix: BlockIndex, tokens: Sequence[int], ns: str = "") -> list[list[bytes]]:
    """The tail keys (files.tail_keys) of each block of `tokens` in namespace `ns`, the last
    partial one's included: what a router matches a digest's tails against."""
    B, h, out = ix.block_tokens, ix.root(ns), []
    for pos in range(0, len(tokens), B):
        out.append(tail_keys(h, tokens[pos:pos + B], B))
        if pos + B <= len(tokens):
            h = block_key(h, tokens[pos:pos + B])
    return out


def slot_digest(ix: BlockIndex, tokens: Sequence[int], ns: str = "") -> tuple[list[bytes], list[bytes]]:
    """(full block keys, tail keys of the last partial block) of a slot's tokens in namespace
    `ns`: what a request continuing them reuses in place."""
    keys = chain(ix, tokens, ns)
    full = len(keys) * ix.block_tokens
    if full == len(tokens):
        return keys, []
    return keys, tail_keys(keys[-1] if keys else ix.root(ns), tokens[full:], ix.block_tokens)


def digest(ix: BlockIndex, ns: str = "") -> dict[str, Any]:
    """What the cache holds in namespace `ns`, by tier, as block hashes, and the tail keys of its
    partial blocks (prompts' ends: where the next turn's match ends)."""
    root = ix.root(ns)
    with ix.lock:  # the tiers read under the lock; the tail hashing outside it
        mine: list[tuple[Block, bool, bool]] = []
        todo = list(ix.children.get(root, ()))
        while todo:
            b = ix.blocks.get(todo.pop())
            if b is not None:
                mine.append((b, b.data is not None, b.on_disk))
                todo.extend(ix.children.get(b.key, ()))
    found: dict[str, set[str]] = {"ram": set(), "disk": set()}
    for b, in_ram, on_disk in mine:
        if len(b.tokens) < ix.block_tokens:  # a block's tokens never change once cut: hashed once
            if b.tail is None:
                b.tail = tail_keys(b.parent, b.tokens, ix.block_tokens)
            ks = [k.hex() for k in b.tail]
            for tier, there in (("ram", in_ram), ("disk", on_disk)):
                if there:
                    found[tier].update(ks)
    return {"block_tokens": ix.block_tokens, "root": root.hex(),
            "ram": sorted(b.key.hex() for b, in_ram, _ in mine if in_ram),
            "disk": sorted(b.key.hex() for b, _, on_disk in mine if on_disk),
            "tails_ram": sorted(found["ram"]), "tails_disk": sorted(found["disk"])}


def stats(ix: BlockIndex) -> PrefixCacheStats:
    """A copy of the counters, with what each tier holds now."""
    with ix.lock:
        s = ix.stats
        out = replace(s, tiers={k: replace(v) for k, v in s.tiers.items()})
        ram = [b for b in ix.blocks.values() if b.data is not None]
        disk = [b for b in ix.blocks.values() if b.on_disk]
        out.tiers["ram"].blocks, out.tiers["ram"].bytes = len(ram), ix.ram
        out.tiers["disk"].blocks, out.tiers["disk"].bytes = len(disk), ix.disk
        return out


def entries(ix: BlockIndex) -> list[CacheEntry]:
    """Every block, in chain order."""
    with ix.lock:
        return [CacheEntry(b.key.hex(), b.parent.hex(), b.start, len(b.tokens), b.data is not None,
                           b.on_disk, b.kept, b.last_used)
                for b in sorted(ix.blocks.values(), key=lambda b: (b.start, b.key))]
