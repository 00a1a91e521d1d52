"""The local backend's prompt-cache capability: each model's `PrefixCache`, shown and cleared,
its digest (the slot tier included) and a prompt's blocks keyed as it keys them. Stats and the
digest cover the models loaded now; a call naming one model loads it."""

from __future__ import annotations

import asyncio
from typing import Any

from hearth.backends.base import CacheEntry, PrefixCacheStats, PromptBlocks
from hearth.backends.local.model import LocalModel
from hearth.backends.local.model_set import ModelSet


class LocalPromptCache:
    def __init__(self, models: ModelSet) -> None:
        self._set = models

    def _models(self) -> dict[str, LocalModel]:
        return self._set.loaded()

    def cache_stats(self) -> dict[str, PrefixCacheStats]:
        return {mid: m.engine.cache.stats() for mid, m in self._models().items() if m.engine.cache is not None}

    async def cache_entries(self, model: str | None) -> list[CacheEntry]:
        async with self._set.using(model) as m:
            cache = m.engine.cache
            return await asyncio.to_thread(cache.entries) if cache is not None else []

    async def clear_cache(self, model: str | None) -> int:
        if model is not None:
            async with self._set.using(model) as m:
                return await asyncio.to_thread(m.engine.cache.clear) if m.engine.cache is not None else 0
        caches = [m.engine.cache for m in self._models().values() if m.engine.cache is not None]
        return sum([await asyncio.to_thread(c.clear) for c in caches])

    async def cache_digest(self, ns: str = "") -> dict[str, Any]:
        # A worker thread: the slot tier hashes every idle slot's full blocks.
        return await asyncio.to_thread(self._digest, ns)

    def _digest(self, ns: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for mid, m in list(self._models().items()):
            cache = m.engine.cache
            d = cache.digest(ns) if cache is not None else {"block_tokens": 0, "ram": [], "disk": []}
            slot, slot_tails, keys = m.engine.residency.slots_digest(ns)
            # The root lets a router hash a prompt's blocks itself (docs/api.md); "" with no cache.
            root = str(d.get("root", ""))
            out[mid] = {"block_tokens": d["block_tokens"], "root": root,
                        "blocks": {"slot": slot, "ram": d["ram"], "disk": d["disk"]},
                        "tails": {"slot": slot_tails, "ram": d.get("tails_ram", []), "disk": d.get("tails_disk", [])},
                        "keys": {"slot": keys}, "sessions": m.engine.residency.sessions_where()}
        return out

    async def cache_blocks(self, model: str | None, tokens: list[int], ns: str = "") -> PromptBlocks:
        async with self._set.using(model) as m:
            cache = m.engine.cache
            if cache is None:
                return PromptBlocks(m.spec.id, "", 0, len(tokens), [], [])
            c = cache

            def hashes() -> tuple[list[str], list[list[str]]]:
                return [k.hex() for k in c.chain(tokens, ns)], [[k.hex() for k in t] for t in c.tails(tokens, ns)]

            keys, tails = await asyncio.to_thread(hashes)
            return PromptBlocks(m.spec.id, cache.root(ns).hex(), cache.block_tokens, len(tokens), keys, tails)
