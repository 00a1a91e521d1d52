"""What the prompt cache reports: per-tier counters, the whole cache's, and one entry."""

from __future__ import annotations

from dataclasses import dataclass, field

TIERS = ("slot", "ram", "disk")  # where a reused prefix can come from, fastest first


@dataclass(slots=True)
class TierStats:
    hits: int = 0  # placements whose reused prefix came from this tier
    tokens: int = 0  # prompt tokens served from this tier
    blocks: int = 0  # blocks held now (ram, disk; slots hold sequences, not blocks)
    bytes: int = 0  # bytes held now
    budget: int = 0  # bytes allowed (0: the tier is off)
    evictions: int = 0  # blocks dropped from this tier for its budget


@dataclass(slots=True)
class PrefixCacheStats:
    block_tokens: int  # tokens per full block
    tiers: dict[str, TierStats] = field(default_factory=lambda: {t: TierStats() for t in TIERS})
    misses: int = 0  # placements that reused nothing
    written_blocks: int = 0  # blocks written to disk
    write_errors: int = 0  # writes that failed (the block stays in RAM only)
    dropped_offers: int = 0  # prompts not cached: the writer's backlog was full
    disk_full: bool = False  # a write hit a full disk or the budget: disk writes stopped, serving goes on
    loaded_bytes: int = 0  # bytes read from disk into RAM
    load_seconds: float = 0.0  # time spent reading them
    rejected_files: int = 0  # truncated, corrupt, foreign or hostile files ignored


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """One block: `n_tokens` tokens at positions `start`.. of every prompt whose chain of
    block hashes passes through `hash`."""

    hash: str  # 32 hex digits
    parent: str  # the previous block's hash (the chain's root for the first block)
    start: int
    n_tokens: int
    ram: bool
    disk: bool
    kept: bool  # asked for (a cache_control breakpoint or a conversation key): evicted last
    last_used: float  # time.time()
