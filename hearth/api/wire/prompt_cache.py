"""Answers of the prompt-cache routes: the admin's stats, entries and clear, and what a router
reads (the digest, a request's blocks). Models for the OpenAPI document and the tests
(`hearth.api.wire` says why; `hearth.fleet_protocol` has the typed shapes the gateway reads)."""

from __future__ import annotations

from typing import Literal

from hearth.api.wire.base import HearthModel


class PromptCacheTier(HearthModel):
    hits: int  # placements whose reused prefix came from this tier
    tokens: int  # prompt tokens served from it
    blocks: int  # held now (ram, disk; 0 for slot: slots hold sequences)
    bytes: int
    budget: int  # bytes allowed (0: the tier is off)
    evictions: int


class PromptCacheModelStats(HearthModel):
    block_tokens: int
    tiers: dict[Literal["slot", "ram", "disk"], PromptCacheTier]
    misses: int
    written_blocks: int
    write_errors: int
    dropped_offers: int
    disk_full: bool
    loaded_bytes: int
    load_seconds: float
    rejected_files: int


class PromptCacheStats(HearthModel):
    object: Literal["prompt_cache.stats"]
    models: dict[str, PromptCacheModelStats]


class PromptCacheEntry(HearthModel):
    hash: str  # 32 hex digits
    parent: str  # the previous block's hash, or the chain's root
    start: int
    n_tokens: int
    ram: bool
    disk: bool
    kept: bool
    last_used: float


class PromptCacheEntries(HearthModel):
    object: Literal["list"]
    model: str
    data: list[PromptCacheEntry]
    total: int
    has_more: bool


class PromptCacheCleared(HearthModel):
    object: Literal["prompt_cache.cleared"]
    model: str | None
    dropped: int


class DigestBlocks(HearthModel):
    slot: list[str]  # full blocks idle KV slots hold (what a request arriving now reuses in place)
    ram: list[str]
    disk: list[str]


class DigestTails(HearthModel):  # tail keys (files.tail_keys) of the partial blocks each tier holds
    slot: list[str]
    ram: list[str]
    disk: list[str]


class DigestKeys(HearthModel):
    slot: list[str]  # conversation keys of the stateless requests that last filled an idle slot


class DigestSessions(HearthModel):
    resident: list[str]
    host: list[str]
    disk: list[str]


class ModelDigest(HearthModel):
    block_tokens: int
    root: str
    blocks: DigestBlocks
    tails: DigestTails
    keys: DigestKeys
    sessions: DigestSessions


class PromptCacheDigest(HearthModel):
    object: Literal["prompt_cache.digest"]
    version: int
    models: dict[str, ModelDigest]


class PromptCacheBlocks(HearthModel):
    object: Literal["prompt_cache.blocks"]
    model: str
    root: str  # the hash chain's root ("" when the model has no prompt cache)
    block_tokens: int
    n_tokens: int  # the whole prompt
    blocks: list[str]  # full blocks only, in prompt order
    tails: list[list[str]]  # per block, the last partial one's included: its tail keys
