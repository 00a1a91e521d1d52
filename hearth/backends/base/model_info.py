"""What a backend says about a model: its card, its limits, its load and lifetime counters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hearth.engine.fair_share import TenantTally


@dataclass(slots=True)
class ModelCard:
    id: str
    created: int
    owned_by: str = "hearth"
    meta: dict[str, Any] = field(default_factory=dict)
    # Where the model stands on a server that loads models on demand (llama-server's router
    # shape): {"value": "loaded" | "loading" | "unloaded" | "unloading", ...}; None: always loaded.
    status: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ModelLimits:
    """What a model accepts: `seq_ctx` tokens per sequence (prompt + output, the most a
    session may hold) and `parallel` sequences decoded at once (candidates of one request
    included)."""

    seq_ctx: int
    parallel: int


@dataclass(slots=True)
class ModelStats:
    """One model's load and lifetime counters, read at scrape time (metrics, `hearth server
    status`). Gauges first, then counters that only grow."""

    running: int = 0  # sequences decoding or prefilling
    waiting: int = 0  # requests queued for a slot
    kv_tokens: int = 0  # tokens held in the KV cache, all slots
    slots_busy: int = 0  # KV sequence slots in use
    swapped_ram_bytes: int = 0  # swapped-out session KV held in host RAM
    paused_kv_ram_bytes: int = 0  # paused requests' KV in host RAM (same budget as the sessions')
    paused_kv_disk_bytes: int = 0  # paused requests' KV spilled to disk past that budget
    prompt_tokens: int = 0  # prefilled (reused prefixes not counted)
    cached_tokens: int = 0  # prompt tokens reused from the KV cache
    generated_tokens: int = 0
    steps: int = 0  # engine steps (one decode call each)
    finished: int = 0  # requests finished, any reason
    cancelled: int = 0  # requests cancelled in the engine
    swap_outs: int = 0  # session KV moved out of a slot
    swap_ins: int = 0  # session KV moved back into a slot
    drafted_tokens: int = 0  # speculative draft tokens verified
    accepted_tokens: int = 0  # of those, the ones accepted (emitted without a step of their own)
    interrupted_decodes: int = 0  # decodes stopped midway by an abort (their work re-run)
    kv_reprefills: int = 0  # session KV that could not be restored or failed a decode: prefilled again
    grammar_cache_hits: int = 0  # constrained requests whose grammar this model had compiled already
    grammar_cache_misses: int = 0  # grammars compiled against this model's vocabulary
    paused: int = 0  # requests paused for a higher class (hearth/engine/preempt.py)
    preemptions: int = 0  # pauses so far
    # Fair shares (hearth/engine/fair_share.py): each tenant's counters, and the requests
    # queued and paused now per class name (flex, default, priority).
    tenants: dict[str, TenantTally] = field(default_factory=dict)
    queued_by_class: dict[str, int] = field(default_factory=dict)
    paused_by_class: dict[str, int] = field(default_factory=dict)
