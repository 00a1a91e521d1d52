"""Which node serves a request: one cost model over what each node holds of the request's prompt
(affinity keys: affinity.py; the prefixes a node was sent: prefixes.py).

Affinity key, first found: `session_id` (body), `previous_response_id`, an `X-Session-Id`
header, the conversation key a node reads (`prompt_cache_key`, Claude Code's session id,
Codex's `session-id` header: hearth.http.cache_keys). A session or a response chain lives
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

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeVar

from hearth.gateway.routing.affinity import Affinity

Source = Literal["digest", "estimate"]
Branch = Literal["sticky_hit", "sticky_miss", "prefix_hit", "load_override", "failover", "least_cost"]


class Loaded(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def max_in_flight(self) -> int: ...


N = TypeVar("N", bound=Loaded)


def least_loaded(nodes: Sequence[N]) -> N:
    """The node with the most free share of its in-flight cap, then the fewest in flight, then the
    name (deterministic). The one least-loaded choice: non-generation calls (session create,
    snapshot load, a blocks call, a move's destination) and the digest poller all use it. The share,
    not the raw count: a node with a cap of 64 and 2 in flight is freer than one with a cap of 2
    and 1."""
    return min(nodes, key=lambda n: (n.in_flight / max(1, n.max_in_flight), n.in_flight, n.name))


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
