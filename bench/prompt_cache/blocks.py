"""Hearth's prompt-cache block files, read by the bench for what they say about prompts: the
tokens each block holds and where a new prompt branched off the ones cached before it.

Only the header and the tokens are read (the format: hearth/engine/prefix_cache/files.py), not
the KV payload, and nothing is checked beyond what the bench needs: the server checks its own.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from hearth.engine.prefix_cache.files import MAGIC, SUFFIX


@dataclass(frozen=True, slots=True)
class Block:
    key: str
    parent: str
    start: int
    tokens: tuple[int, ...]
    kv_bytes: int


def read_block(path: Path) -> Block:
    with path.open("rb") as f:
        head = f.read(8)
        if head[:4] != MAGIC:
            raise ValueError(f"{path.name}: not a prompt-cache block")
        (hlen,) = struct.unpack("<I", head[4:])
        h = json.loads(f.read(hlen))
        n = int(h["n_tokens"])
        tokens = struct.unpack(f"<{n}i", f.read(4 * n))
    return Block(path.name.removesuffix(SUFFIX), h["parent"], int(h["start"]), tokens, int(h["kv_bytes"]))


def _common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def branch_point(before: Iterable[Path], after: Iterable[Path]) -> int | None:
    """The index of the first token of the newest prompt that no earlier prompt shares: the
    blocks written since `before` start where the new prompt left the cached ones (a block's
    key chains every token before it), and inside that block the new prompt still shares the
    tokens its first new block has in common with the cached block at the same place. None if
    no block was written."""
    old_paths = set(before)
    new = [read_block(p) for p in after if p not in old_paths]
    if not new:
        return None
    first = min(new, key=lambda b: b.start)
    siblings = [b for b in map(read_block, old_paths) if b.parent == first.parent and b.start == first.start]
    return first.start + max((_common(first.tokens, b.tokens) for b in siblings), default=0)


def stored(paths: Iterable[Path]) -> dict[str, int]:
    """Tokens and KV bytes the blocks hold (each shared block once)."""
    blocks = [read_block(p) for p in paths]
    return {"blocks": len(blocks), "tokens": sum(len(b.tokens) for b in blocks),
            "kv_bytes": sum(b.kv_bytes for b in blocks)}
