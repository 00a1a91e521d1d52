"""The prompt-cache capability: what a durable prompt cache shows a router and an admin.
Its counters and entries are the engine's own shapes (hearth.engine.prefix_cache.stats)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from hearth.engine.prefix_cache.stats import CacheEntry, PrefixCacheStats


@dataclass(frozen=True, slots=True)
class PromptBlocks:
    """A prompt's full blocks as this node's prompt cache keys them: what a router matches
    against digests (docs/api.md, "POST /v1/prompt-cache/blocks"). `root` is "" and `blocks`
    empty where the model has no prompt cache."""

    model: str
    root: str  # the hash chain's root, hex
    block_tokens: int
    n_tokens: int  # the whole prompt's tokens, the last partial block's included
    blocks: list[str]  # hex, in prompt order: full blocks only
    tails: list[list[str]]  # hex, per block (the last partial one's included): its tail keys


class PromptCache(Protocol):
    """What a backend with a durable prompt cache shows and lets an admin do
    (hearth.engine.prefix_cache: stateless prompts' KV in blocks, in RAM and on disk)."""

    def cache_stats(self) -> dict[str, PrefixCacheStats]:
        """Per model id. Cheap and non-blocking: called at every /metrics scrape."""
        ...

    async def cache_entries(self, model: str | None) -> list[CacheEntry]:
        """The blocks one model's cache holds (None: the default model)."""
        ...

    async def clear_cache(self, model: str | None) -> int:
        """Drop every block of one model's cache (None: every model's); how many were dropped."""
        ...

    async def cache_digest(self, ns: str = "") -> dict[str, Any]:
        """Per model id: what the node holds in prompt-cache namespace `ns`, for a router to
        read cheaply: {block_tokens, root (the namespace's hash chain root, hex), blocks:
        {slot|ram|disk: [hash...]}, keys: {slot: [conversation key...]}, sessions:
        {resident|host|disk: [id...]}}. How the hashes chain: docs/api.md. Hashing work runs off
        the event loop and the engine thread."""
        ...

    async def cache_blocks(self, model: str | None, tokens: list[int], ns: str = "") -> PromptBlocks:
        """The full blocks of a prompt's `tokens` (as `tokenize_prompt` or `tokenize` gave them)
        keyed as this node's cache keys them in namespace `ns`; off the event loop and the
        engine thread."""
        ...
