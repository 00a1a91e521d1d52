"""What a Hearth node's prompt cache really holds, as its digest says (docs/api.md, "GET
/v1/prompt-cache/digest"), and how many of a request's prompt tokens it would serve from it.

A request's blocks (`RequestBlocks`, from one node's `POST /v1/prompt-cache/blocks`) are the
hash chain over its prompt tokens, full blocks only; a node serves the longest leading run of
them that it holds in any tier (`ModelState.served`), and then, where the run ends, the part
of the next block that one of its partial blocks holds: a conversation's last turn ended inside
a block, and the next turn reuses it to the token. Tail keys (the first 16, 32, ... tokens of a
block, both sides: the request's for each of its blocks, the node's for its partial blocks)
count that part to within 16 tokens. The chain is seeded by `root` (the model's weights and KV
layout): nodes whose roots differ share no hashes and each needs its own blocks.

Tier weights (what a cached token is worth against prefilling it): a slot's KV is used in
place (1.0); RAM blocks are joined into a slot first (0.9); disk blocks are read from disk and
checked before that (0.6). Guesses that order the tiers, not measurements: a cached token
from any tier is far cheaper than a prefilled one, so the count of tokens decides and the tier
breaks near-ties.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from hearth.fleet_protocol import READABLE_DIGEST_VERSIONS, BlocksAnswer, DigestAnswer, Tiers

TIERS = ("slot", "ram", "disk")  # best first
TIER_WEIGHT = {"slot": 1.0, "ram": 0.9, "disk": 0.6}
TAIL_STEP = 16  # tokens per tail key (hearth/engine/prefix_cache/files.py)


@dataclass(frozen=True, slots=True)
class RequestBlocks:
    """A request's prompt as one node keys it (the node's `POST /v1/prompt-cache/blocks`)."""

    root: str
    block_tokens: int
    n_tokens: int  # the exact prompt tokens
    blocks: tuple[str, ...]
    tails: tuple[tuple[str, ...], ...] = ()  # per block (the last partial one's too): its tail keys

    @classmethod
    def parse(cls, doc: Any) -> RequestBlocks | None:
        """None for an answer that is not one (a node of another version, a proxy's page)."""
        try:  # read as the shape it should have; every value checked (str, int) as it is read
            d = cast(BlocksAnswer, doc)
            blocks = tuple(str(b) for b in d["blocks"])
            tails = tuple(tuple(str(k) for k in t) for t in d.get("tails") or ())
            out = cls(str(d["root"]), int(d["block_tokens"]), int(d["n_tokens"]), blocks, tails)
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        return out if out.root and out.block_tokens > 0 and out.n_tokens >= 0 else None


@dataclass(frozen=True, slots=True)
class ModelState:
    """One model's cache on one node: block hashes by tier, conversation keys in slots."""

    root: str
    block_tokens: int
    tiers: Mapping[str, frozenset[str]]
    keys: frozenset[str] = frozenset()
    tails: Mapping[str, frozenset[str]] = field(default_factory=dict)  # tier -> partial blocks' tail keys

    def _tier(self, key: str, held: Mapping[str, frozenset[str]]) -> str | None:
        return next((t for t in TIERS if key in held.get(t, ())), None)

    def served(self, req: RequestBlocks) -> tuple[int, float]:
        """(tokens, tier-weighted tokens) this cache would serve of `req`: its leading blocks
        held here in any tier, each counted at the best tier that holds it, then the longest
        held tail of the block where that run ends. At most all but the prompt's last token
        (the node always computes that one)."""
        if req.root != self.root or req.block_tokens != self.block_tokens:
            return 0, 0.0
        tokens, weighted, cap = 0, 0.0, max(0, req.n_tokens - 1)
        matched = 0
        for h in req.blocks:
            tier = self._tier(h, self.tiers)
            if tier is None:
                break
            n = min(self.block_tokens, cap - tokens)
            tokens += n
            weighted += n * TIER_WEIGHT[tier]
            matched += 1
            if tokens >= cap:
                return tokens, weighted
        if matched < len(req.tails):  # the tail keys of the block where the run ended, longest first
            for k in range(len(req.tails[matched]), 0, -1):
                tier = self._tier(req.tails[matched][k - 1], self.tails)
                if tier is not None:
                    n = min(k * TAIL_STEP, cap - tokens)
                    return tokens + n, weighted + n * TIER_WEIGHT[tier]
        return tokens, weighted

    def counts(self) -> dict[str, int]:
        return {t: len(self.tiers.get(t, ())) for t in TIERS}


@dataclass(slots=True)
class Digest:
    """A node's last digest: per model id (the node's), and when it was read."""

    models: dict[str, ModelState]
    fetched: float  # the gateway's monotonic clock
    stale: bool = False  # the polls since have failed
    failures: int = field(default=0)  # polls failed in a row

    def model(self, model_id: str) -> ModelState | None:
        """The model as fleet.toml names it on this node; a node serving one model is matched
        whatever name fleet.toml gives it (an alias the node also answers to)."""
        found = self.models.get(model_id)
        if found is None and len(self.models) == 1:
            found = next(iter(self.models.values()))
        return found if found is not None and found.root else None


def parse_digest(doc: Any) -> dict[str, ModelState] | None:
    """The models of a digest answer; None if it is not one this gateway reads (another
    version, a malformed body): the node is then routed as one that publishes nothing."""
    if not isinstance(doc, dict) or doc.get("version") not in READABLE_DIGEST_VERSIONS:
        return None
    if not isinstance(doc.get("models"), dict):
        return None
    out: dict[str, ModelState] = {}
    try:  # read as the shape it should have; every value checked (str, int) as it is read
        for mid, m in cast(DigestAnswer, doc)["models"].items():
            blocks, keys, tails = m["blocks"], m.get("keys") or Tiers(), m.get("tails") or Tiers()
            tiers = {t: _tier(blocks, t) for t in TIERS}
            tail_tiers = {t: _tier(tails, t) for t in TIERS}
            out[str(mid)] = ModelState(str(m["root"]), int(m["block_tokens"]), tiers,
                                       frozenset(str(k) for k in keys.get("slot") or ()), tail_tiers)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return out


def _tier(tiers: Tiers, tier: str) -> frozenset[str]:
    return frozenset(str(h) for h in cast(Mapping[str, Any], tiers).get(tier) or ())
