"""The durable prompt cache: KV of prompt prefixes in blocks, in host RAM and on disk.

See cache.py for the design (blocks, hash chain, tiers, the writer) and files.py for the file
format."""

from hearth.engine.prefix_cache.cache import KVCodec, Match, PrefixCache
from hearth.engine.prefix_cache.stats import TIERS, CacheEntry, PrefixCacheStats, TierStats

__all__ = ["TIERS", "CacheEntry", "KVCodec", "Match", "PrefixCache", "PrefixCacheStats", "TierStats"]
