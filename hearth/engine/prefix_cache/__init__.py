"""The durable prompt cache: KV of prompt prefixes in blocks, in host RAM and on disk.

`PrefixCache` (cache.py) composes the parts: the block index (index.py), the RAM and disk tiers
(tiers.py), the writer thread (writer.py) and what it shows (digest.py); files.py is the file
format."""

from hearth.engine.prefix_cache.cache import KVCodec, Match, PrefixCache
from hearth.engine.prefix_cache.stats import TIERS, CacheEntry, PrefixCacheStats, TierStats

__all__ = ["TIERS", "CacheEntry", "KVCodec", "Match", "PrefixCache", "PrefixCacheStats", "TierStats"]
