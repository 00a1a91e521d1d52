"""The fleet as the gateway sees it: per node its liveness, breaker, in-flight count, seen
conversation prefixes and last prompt-cache digest; one bounded wait queue for a free node;
the probe loop (and the digest loop, digests.py).

Admission: a request asks `acquire()` for a node. The cost model (`routing.Chooser`) picks one
among the live, closed-breaker, non-draining nodes that serve the model and are below their
`max_in_flight`; if none is free the request waits in the one queue (at most `max_waiting`
requests, each at most `max_wait` seconds: 429 + Retry-After past either), and is woken when a
node frees up. With no live node at all it is a 503 + Retry-After at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hearth.errors import NotFound, TooManyRequests, Unavailable
from hearth.gateway.fleet.cache_state import Digest, ModelState, RequestBlocks
from hearth.gateway.fleet.digests import Digests
from hearth.gateway.fleet.health import Breaker, Liveness
from hearth.gateway.metrics import GatewayMetrics
from hearth.gateway.routing.affinity import Affinity
from hearth.gateway.routing.policy import Candidate, Chooser, Decision
from hearth.gateway.routing.prefixes import PrefixTable
from hearth.gateway.settings import GatewaySettings, Upstream, aliases_of
from hearth.gateway.store.base import GatewayStore
from hearth.gateway.upstream.node_client import NodeClient

log = logging.getLogger("hearth.gateway")

SOFT_KEYS = 65536  # soft affinity keys remembered (LRU); binding keys live in the store


@dataclass(eq=False, slots=True)
class Node:
    up: Upstream
    live: Liveness = field(default_factory=Liveness)
    breaker: Breaker = field(default_factory=Breaker)
    in_flight: int = 0
    draining: bool = False
    cooling_until: float = 0.0  # an upstream 429's Retry-After: no new requests before
    last_bytes: float = 0.0  # when the node last sent bytes of an answer (monotonic clock)
    prefixes: PrefixTable = field(default_factory=PrefixTable)
    digest: Digest | None = None  # what its prompt cache holds (Hearth nodes that publish it)
    # Where the node comes from (membership.py): the fleet file, or a registration at run time;
    # a joined node whose registration lapsed (it stopped renewing) takes no new requests.
    source: str = "file"  # file | joined
    lapsed: bool = False

    @property
    def name(self) -> str:
        return self.up.name

    @property
    def max_in_flight(self) -> int:
        return self.up.max_in_flight

    def routable(self, now: float) -> bool:
        return (self.live.up and not self.draining and not self.lapsed and self.breaker.allows()
                and now >= self.cooling_until)


Release = Callable[[bool | None], None]  # a lease back, once: True ok, False failed, None neither


@dataclass(frozen=True, slots=True)
class Lease:
    """A node held for one request; `release` exactly once (`Pool.release`)."""

    node: Node
    decision: Decision
    candidates: tuple[str, ...] = ()  # the nodes it was chosen among (a turn's trace shows them)


class Pool:
    def __init__(self, settings: GatewaySettings, store: GatewayStore, metrics: GatewayMetrics,
                 client: NodeClient, chooser: Chooser | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.nodes = {u.name: Node(u) for u in settings.upstreams}
        self.store = store
        self.metrics = metrics
        self.client = client
        self.chooser = chooser or Chooser(policy=settings.routing)
        self.clock = clock
        self._soft: OrderedDict[str, str] = OrderedDict()
        self._freed = asyncio.Event()  # replaced on every wake-up: waiters hold the one they wait on
        self._waiting = 0
        self.digests = Digests(settings, client, metrics, lambda: list(self.nodes.values()), clock)

    # ---- models --------------------------------------------------------------------------------

    def resolve(self, model: object) -> str:
        """The alias a request's model names (or the default model); 404 model_not_found."""
        aliases = self.aliases()
        if isinstance(model, str) and model in aliases:
            return model
        if self.settings.default_model is not None:
            return self.settings.default_model
        raise NotFound(f"The model {model!r} does not exist; GET /v1/models lists this gateway's models",
                       param="model", code="model_not_found")

    # ---- affinity ------------------------------------------------------------------------------

    async def sticky(self, affinity: Affinity, alias: str | None = None) -> str | None:
        """The node the key maps to. A conversation key this gateway has not seen (it
        restarted, or another gateway served the conversation) maps to the node whose digest
        says one of its slots holds that conversation."""
        key = affinity.key
        if key is None:
            return None
        if affinity.binding:
            return await self.store.node_of(key)
        found = self._soft.get(key)
        if found is None and affinity.kind == "cache_key" and alias is not None:
            found = next((n.name for n in self.nodes.values() if (st := self._state(n, alias)) is not None
                          and affinity.value in st.keys), None)
        return found

    async def remember(self, affinity: Affinity, node: str) -> None:
        key = affinity.key
        if key is None:
            return
        if affinity.binding:
            await self.store.assign(key, node)
            return
        self._soft[key] = node
        self._soft.move_to_end(key)
        while len(self._soft) > SOFT_KEYS:
            self._soft.popitem(last=False)

    # ---- admission -----------------------------------------------------------------------------

    def _routable(self, alias: str, exclude: set[str]) -> list[Node]:
        now = self.clock()
        return [n for n in self.nodes.values() if alias in n.up.models and n.name not in exclude and n.routable(now)]

    @staticmethod
    def _state(n: Node, alias: str) -> ModelState | None:
        return n.digest.model(n.up.models[alias]) if n.digest is not None and alias in n.up.models else None

    def _candidates(self, alias: str, hashes: Sequence[tuple[str, int]], exclude: set[str],
                    blocks: Mapping[str, RequestBlocks]) -> list[Candidate]:
        """Each routable node with what it would serve of the request: from its digest where
        it has one and the request's blocks of its root are known, else the estimate."""
        out = []
        for n in self._routable(alias, exclude):
            # a Hearth node's digest lists the models it has loaded (and only those)
            loaded = self._state(n, alias) is not None if n.digest is not None and n.up.kind == "hearth" else None
            state = self._state(n, alias) if blocks else None
            req = blocks.get(state.root) if state is not None else None
            if state is not None and req is not None:
                tokens, weighted = state.served(req)
                out.append(Candidate(n.name, n.in_flight, n.up.max_in_flight, tokens, weighted, "digest", loaded))
            else:
                out.append(Candidate(n.name, n.in_flight, n.up.max_in_flight, n.prefixes.cached(hashes),
                                     loaded=loaded))
        return out

    async def request_blocks(self, alias: str, affinity: Affinity, path: str, body: dict[str, Any],
                             exclude: set[str] | None = None) -> dict[str, RequestBlocks]:
        """A stateless request's blocks per hash-chain root (digests.py), or {} where they
        cannot matter: routing by digests is off, the key binds (a session, a response chain),
        fewer than two nodes could serve it, or its conversation key's node is free to take it."""
        if affinity.binding or not self.digests.enabled:
            return {}
        exclude = exclude or set()
        nodes = [n for n in self._routable(alias, exclude) if n.up.kind == "hearth"]
        if len(nodes) < 2:
            return {}
        sticky = await self.sticky(affinity, alias)
        if any(n.name == sticky and n.in_flight < n.up.max_in_flight for n in nodes):
            return {}
        return await self.digests.blocks(nodes, alias, path, body)

    def _try(self, alias: str, affinity: Affinity, sticky: str | None, hashes: Sequence[tuple[str, int]],
             prompt_tokens: int, exclude: set[str], blocks: Mapping[str, RequestBlocks],
             urgent: bool = False) -> Lease | None:
        candidates = self._candidates(alias, hashes, exclude, blocks)
        if urgent:  # past the in-flight caps: the least loaded node takes it now
            for c in candidates:
                c.max_in_flight = max(c.max_in_flight, c.in_flight + 1)
        if not candidates:
            retry = max(1, int(self.settings.probe_interval))
            raise Unavailable(f"no healthy upstream serves {alias!r} right now; retry shortly",
                              code="no_healthy_upstream", retry_after=retry)
        if sticky in exclude:
            sticky = None
        if blocks:  # the exact count (every root's is the same prompt)
            prompt_tokens = next(iter(blocks.values())).n_tokens
        decision = self.chooser.choose(candidates, prompt_tokens, affinity, sticky)
        if decision is None:
            return None
        node = self.nodes[decision.node]
        node.in_flight += 1
        node.breaker.started()
        self.metrics.route(decision.branch)
        self.metrics.route_sources.labels(decision.source).inc()
        return Lease(node, decision, tuple(c.name for c in candidates))

    async def acquire(self, alias: str, affinity: Affinity, hashes: Sequence[tuple[str, int]],
                      prompt_tokens: int, exclude: set[str] | None = None,
                      blocks: Mapping[str, RequestBlocks] | None = None, urgent: bool = False) -> Lease:
        """A node for the request. `blocks`: the request's blocks per root
        (`request_blocks`), for digest-based predictions; without them, the estimate.
        `urgent`: a stream already admitted whose node died mid-answer (its client is waiting
        mid-stream): it does not queue behind new requests but may take a node past its
        `max_in_flight` (the node's own admission queue holds it at most that long)."""
        exclude = exclude or set()
        blocks = blocks or {}
        sticky = await self.sticky(affinity, alias)  # read once: the store is not asked again while it waits
        lease = self._try(alias, affinity, sticky, hashes, prompt_tokens, exclude, blocks, urgent)
        if lease is not None:
            return lease
        if self._waiting >= self.settings.max_waiting:
            self.metrics.rejected("queue_full")
            raise TooManyRequests("every upstream is at its in-flight cap and the wait queue is full; retry later",
                                  retry_after=self._retry_after(), code="queue_full")
        deadline = self.clock() + self.settings.max_wait
        self._waiting += 1
        try:
            while (remaining := deadline - self.clock()) > 0:
                freed = self._freed
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(freed.wait(), min(remaining, self.settings.probe_interval))
                lease = self._try(alias, affinity, sticky, hashes, prompt_tokens, exclude, blocks)
                if lease is not None:
                    return lease
        finally:
            self._waiting -= 1
        self.metrics.rejected("queue_timeout")
        raise TooManyRequests(f"no upstream freed up within {self.settings.max_wait:g} s; retry later",
                              retry_after=self._retry_after(), code="queue_timeout")

    def _retry_after(self) -> int:
        return max(1, min(30, int(self.settings.max_wait / 4)))

    def wake(self) -> None:
        """Requests waiting for a node look again (one became routable)."""
        self._wake()

    def _wake(self) -> None:
        self._freed.set()
        self._freed = asyncio.Event()

    # ---- the fleet changing (membership.py) ------------------------------------------------------

    def add(self, up: Upstream, source: str = "file") -> Node:
        """A node that joins (or a fleet file's new upstream): routed to once a probe finds it up."""
        node = self.nodes[up.name] = Node(up, source=source)
        return node

    def update(self, node: Node, up: Upstream) -> None:
        """The same node with a new address or description (a node that re-joined from elsewhere):
        its liveness is found again by probes."""
        moved = up.url != node.up.url
        node.up = up
        if moved:
            node.live, node.digest = Liveness(), None

    def remove(self, name: str) -> None:
        """Out of the fleet: its bindings fail over as a dead node's do (the store keeps them)."""
        if self.nodes.pop(name, None) is not None:
            self._wake()

    def upstreams(self) -> list[Upstream]:
        """The live fleet: the fleet file's upstreams and the nodes that joined (the settings keep
        the fleet as configured; they are not rewritten)."""
        return [n.up for n in self.nodes.values()]

    def aliases(self) -> dict[str, list[Upstream]]:
        """alias -> the live upstreams that serve it (in config order, joined nodes after)."""
        return aliases_of(self.upstreams())

    def releaser(self, lease: Lease) -> Release:
        """`release` for `lease`, once whatever calls it how often (a stream's end, a failure and
        a cancellation may each try)."""
        released = False

        def release(ok: bool | None) -> None:
            nonlocal released
            if not released:
                released = True
                self.release(lease, ok)

        return release

    def release(self, lease: Lease, ok: bool | None) -> None:
        """Give the node back; `ok` is the outcome for the breaker (None: not the node's fault
        either way, e.g. a 4xx or a client that left)."""
        lease.node.in_flight -= 1
        if ok is not None:
            was = lease.node.breaker.state
            lease.node.breaker.record(ok)
            if lease.node.breaker.state != was:
                log.warning("upstream %s: breaker %s -> %s", lease.node.name, was, lease.node.breaker.state)
        elif lease.node.breaker.trial:
            lease.node.breaker.trial = False
        self._wake()

    @property
    def waiting(self) -> int:
        return self._waiting

    async def start(self) -> None:
        await self.digests.start()

    async def stop(self) -> None:
        await self.digests.stop()
