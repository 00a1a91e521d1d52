"""What a node has been sent of a conversation, when it publishes no digest: the conversation as
hashable items, the chained hash of every prefix, and the table of prefixes each node has seen
(policy.py says how the cost model uses them)."""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

CHARS_PER_TOKEN = 4
PREFIXES_PER_NODE = 65536


def conversation(body: Mapping[str, Any]) -> list[Any]:
    """The request's conversation as a list of protocol-neutral-enough items, in order: each
    protocol's system/instructions first, then its messages / input items. Only hashed, so the
    items need not be translated, only stable."""
    items: list[Any] = []
    for k in ("system", "instructions"):
        if body.get(k):
            items.append({"system": body[k]})
    if isinstance(body.get("messages"), list):
        items += body["messages"]
    inp = body.get("input")
    if isinstance(inp, str):
        items.append({"role": "user", "content": inp})
    elif isinstance(inp, list):
        items += inp
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        items.append({"prompt": prompt})
    return items


def prefix_hashes(model: str, items: Sequence[Any]) -> list[tuple[str, int]]:
    """(chained hash, estimated tokens) of every prefix items[:i+1], seeded by the model."""
    h = hashlib.blake2b(model.encode(), digest_size=16).digest()
    tokens = 0
    out = []
    for item in items:
        blob = json.dumps(item, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()
        h = hashlib.blake2b(h + blob, digest_size=16).digest()
        tokens += max(1, len(blob) // CHARS_PER_TOKEN)
        out.append((h.hex(), tokens))
    return out


class PrefixTable:
    """The conversation prefixes one node has seen, least recently used dropped first (the node
    evicts too: this is a prediction, checked against what the node reports).

    A prefix that was a whole request the node answered keeps the prompt tokens the node
    reported for it: the next turn of that conversation (the same items, then the answer and a
    new message) is predicted with the node's own count instead of characters / 4, which is
    off by the text's real ratio (10 % and more on agent prompts)."""

    def __init__(self, capacity: int = PREFIXES_PER_NODE) -> None:
        self._seen: OrderedDict[str, int | None] = OrderedDict()  # hash -> reported tokens, if known
        self.capacity = capacity

    def add(self, hashes: Sequence[tuple[str, int]], prompt_tokens: int | None = None) -> None:
        """`prompt_tokens`: what the node reported for the whole of `hashes` (the request)."""
        for h, _ in hashes:
            self._seen[h] = self._seen.get(h)
            self._seen.move_to_end(h)
        if hashes and prompt_tokens is not None:
            self._seen[hashes[-1][0]] = prompt_tokens
        while len(self._seen) > self.capacity:
            self._seen.popitem(last=False)

    def cached(self, hashes: Sequence[tuple[str, int]]) -> int:
        """Tokens of the longest prefix seen: the node's count where it reported one, else the
        estimate."""
        for h, tokens in reversed(hashes):
            if h in self._seen:
                reported = self._seen[h]
                return reported if reported is not None else tokens
        return 0

    def clear(self) -> None:
        self._seen.clear()

    def __len__(self) -> int:
        return len(self._seen)
