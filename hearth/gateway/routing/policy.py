"""Which node serves a request: affinity keys, what each node holds of the request's prompt,
and one cost model.

Affinity key, first found: `session_id` (body), `previous_response_id`, an `X-Session-Id`
header, the conversation key a node reads (`prompt_cache_key`, Claude Code's session id,
Codex's `session-id` header: hearth.api.http.cache_keys). A session or a response chain lives
on one node (its transcript and KV are there): that key is *binding* while the node is
healthy (a busy node makes the request wait). The others are *soft*: they pin the
conversation to its node while that node is healthy and not saturated; a saturated one loses
to the cost model (a conversation key is a cache hint, not state: prefilling it elsewhere
beats waiting), and the conversation then stays where it went.

Cost of node n = (prompt tokens − the tokens n would serve from cache, tier-weighted) ×
(n's in-flight + 1). Lowest cost wins; equal costs break at random. Nodes that would have to
load the model first (their digest does not list it: a Hearth node loads models on request)
are considered only when no free node has it loaded. What n would serve comes
from one of two sources (`Candidate.source`):

- `digest`, for Hearth nodes whose digest the gateway holds (cache_state.py, digests.py): the
  request's exact prompt tokens and block hashes, asked of one node per hash-chain root, and
  the longest leading run of them n holds in a slot, RAM or on disk, weighted by tier (slot 1,
  RAM 0.9, disk 0.6). Exact in tokens, to a block: the cached tail inside the last partial
  block is not counted.
- `estimate`, for nodes that publish nothing (foreign engines, older nodes, a digest dropped
  after failed reads), when the blocks call fails, and for prompts under one block: the
  conversation's characters / 4, less the longest prefix n has been *sent* (a chained hash
  over every message, not the system prompt alone, which would send every conversation with
  one system prompt to one node; `PrefixTable`).

What the node then reports as cached is recorded beside the prediction
(`Decision.predicted_cached`), so routing quality is measured.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from hearth.api.http.cache_keys import body_key, conversation_key

CHARS_PER_TOKEN = 4
PREFIXES_PER_NODE = 65536

KeyKind = Literal["session", "response", "header", "cache_key", "none"]
Source = Literal["digest", "estimate"]
Branch = Literal["sticky_hit", "sticky_miss", "prefix_hit", "load_override", "failover", "least_cost"]


@dataclass(frozen=True, slots=True)
class Affinity:
    kind: KeyKind
    value: str | None = None

    @property
    def binding(self) -> bool:
        """A session or response chain lives on its node: only failure moves it."""
        return self.kind in ("session", "response")

    @property
    def key(self) -> str | None:
        return f"{self.kind}:{self.value}" if self.value is not None else None


def affinity_of(body: Mapping[str, Any], headers: Mapping[str, str]) -> Affinity:
    """The first key found; a conversation key is read as a node reads it (hearth.api.http.
    cache_keys: prompt_cache_key, Claude Code's session id, Codex's headers), so the gateway
    routes a conversation to the node that keeps its KV warm for it."""
    for kind, value in (("session", body.get("session_id")), ("response", body.get("previous_response_id")),
                        ("header", headers.get("x-session-id"))):
        if isinstance(value, str) and value:
            return Affinity(kind, value)  # type: ignore[arg-type]
    pck, meta = body.get("prompt_cache_key"), body.get("metadata")
    key = conversation_key(body_key(pck if isinstance(pck, str) else None,
                                    meta if isinstance(meta, Mapping) else None), headers)
    return Affinity("cache_key", key) if key else Affinity("none")


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


@dataclass(slots=True)
class Candidate:
    """A node as the cost model sees it."""

    name: str
    in_flight: int
    max_in_flight: int
    cached: int  # tokens of this request it already holds (predicted)
    weighted: float | None = None  # `cached` weighted by tier (None: `cached`)
    source: Source = "estimate"
    # Whether the node has the model loaded now (its digest lists only loaded models); None:
    # unknown (no digest). A node that would have to load it first goes last.
    loaded: bool | None = None

    @property
    def saturated(self) -> bool:
        return self.in_flight >= self.max_in_flight

    @property
    def worth(self) -> float:
        return float(self.cached) if self.weighted is None else self.weighted


@dataclass(frozen=True, slots=True)
class Decision:
    node: str
    branch: Branch
    predicted_cached: int
    prompt_tokens: int  # exact with a digest prediction, else estimated
    source: Source = "estimate"


@dataclass(slots=True)
class Chooser:
    rng: random.Random = field(default_factory=random.Random)
    # "cost" (the model above) or "round_robin" (no affinity, no cache: the baseline bench/gateway.py
    # compares against)
    policy: str = "cost"
    _turn: int = 0

    def choose(self, candidates: Sequence[Candidate], prompt_tokens: int, affinity: Affinity,
               sticky: str | None) -> Decision | None:
        """The node for a request, or None if every eligible node is saturated (wait).

        `candidates` are the healthy nodes that serve the model; `sticky` the node the
        affinity key maps to (None: no key, or not assigned yet). A sticky node that is not a
        candidate is down or draining: the request fails over."""
        binding = affinity.binding
        if self.policy == "round_robin":
            free = sorted((c for c in candidates if not c.saturated), key=lambda c: c.name)
            if not free:
                return None
            self._turn += 1
            pick = free[self._turn % len(free)]
            return Decision(pick.name, "least_cost", pick.cached, prompt_tokens, pick.source)
        by_name = {c.name: c for c in candidates}
        if sticky is not None and sticky in by_name:
            c = by_name[sticky]
            if not c.saturated:
                return Decision(c.name, "sticky_hit", max(c.cached, 0), prompt_tokens, c.source)
            if binding:
                return None  # the session's node is busy: wait for it, do not split the session
        free = [c for c in candidates if not c.saturated]
        if not free:
            return None
        # A load takes seconds (a prefill of thousands of tokens): any free node that has the
        # model loaded, or may have, beats one known to need a load.
        free = [c for c in free if c.loaded is not False] or free
        costs = [(max(1.0, prompt_tokens - c.worth) * (c.in_flight + 1), c) for c in free]
        best = min(cost for cost, _ in costs)
        pick = self.rng.choice([c for cost, c in costs if cost == best])
        if sticky is not None and sticky in by_name:
            branch: Branch = "load_override"
        elif sticky is not None:
            branch = "failover"
        elif pick.cached > 0:
            branch = "prefix_hit"
        elif affinity.key is not None:
            branch = "sticky_miss"
        else:
            branch = "least_cost"
        return Decision(pick.name, branch, pick.cached, prompt_tokens, pick.source)
