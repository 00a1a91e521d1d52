"""Routing on what nodes hold: digests parsed and scored by tier and load, roots kept apart, a
stale digest used then dropped, the blocks call made only where it can matter, and the
estimate wherever a node publishes nothing or the call fails."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from hearth.gateway.fleet.cache_state import Digest, ModelState, RequestBlocks, parse_digest
from hearth.gateway.fleet.pool import Pool
from hearth.gateway.metrics import GatewayMetrics
from hearth.gateway.routing.affinity import Affinity
from hearth.gateway.routing.policy import Chooser
from hearth.gateway.routing.prefixes import conversation, prefix_hashes
from hearth.gateway.settings import GatewaySettings, Upstream
from hearth.gateway.store.sqlite import SqliteStore
from hearth.gateway.upstream.node_client import NodeClient
from tests.helpers import sample

B = 256
R1, R2 = "a1" * 16, "b2" * 16
REQ = RequestBlocks(R1, B, 4 * B + 10, ("h0", "h1", "h2", "h3"))
NONE = Affinity("none")
BODY = {"model": "m", "messages": [{"role": "user", "content": "hello " * 400}]}
Handler = Callable[[httpx.Request], httpx.Response]


def state(root: str = R1, *, slot: tuple[str, ...] = (), ram: tuple[str, ...] = (), disk: tuple[str, ...] = (),
          keys: tuple[str, ...] = ()) -> ModelState:
    return ModelState(root, B, {"slot": frozenset(slot), "ram": frozenset(ram), "disk": frozenset(disk)},
                      frozenset(keys))


def digest_doc(root: str = R1, version: int = 2, **tiers: list[str]) -> dict[str, Any]:
    blocks = {t: tiers.get(t, []) for t in ("slot", "ram", "disk")}
    return {"object": "prompt_cache.digest", "version": version, "models": {"model": {
        "block_tokens": B, "root": root, "blocks": blocks, "keys": {"slot": tiers.get("keys", [])},
        "sessions": {"resident": [], "host": [], "disk": []}}}}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def make_pool(tmp_path: Path, handler: Handler | None = None, n: int = 3, clock: Clock | None = None,
              **settings: Any) -> Pool:
    ups = [Upstream(name=f"n{i}", url=f"http://127.0.0.1:{9300 + i}", models={"m": "model"}, max_in_flight=4)
           for i in range(n)]
    gs = GatewaySettings(upstreams=ups, data_dir=tmp_path, **settings)
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler or (lambda r: httpx.Response(404))))
    store = SqliteStore(tmp_path / "g.sqlite3")
    await store.open()
    pool = Pool(gs, store, GatewayMetrics(), NodeClient(client),
                chooser=Chooser(rng=random.Random(7)), **({"clock": clock} if clock else {}))
    for node in pool.nodes.values():
        node.live.probed(True)
    return pool


def give(pool: Pool, name: str, st: ModelState, stale: bool = False) -> None:
    pool.nodes[name].digest = Digest({"model": st}, pool.clock(), stale=stale)


# ---- the digest and the tokens it serves ---------------------------------------------------


def test_a_node_serves_the_leading_run_of_blocks_it_holds_at_its_best_tier() -> None:
    assert state(ram=("h0", "h1", "h3")).served(REQ) == (2 * B, 2 * B * 0.9)  # h2 missing: h3 unreachable
    assert state(slot=("h0",), ram=("h0", "h1"), disk=("h1", "h2")).served(REQ) == (3 * B, B * (1 + 0.9 + 0.6))
    assert state(disk=("h1",)).served(REQ) == (0, 0.0)
    assert state(R2, slot=REQ.blocks).served(REQ) == (0, 0.0)  # another chain: nothing in common
    # never the prompt's last token: a prompt of exactly two blocks is served 511 tokens
    exact = RequestBlocks(R1, B, 2 * B, ("h0", "h1"))
    assert state(slot=("h0", "h1")).served(exact) == (2 * B - 1, 2 * B - 1)


def test_digests_are_read_by_version() -> None:
    parsed = parse_digest(digest_doc(ram=["h0"], slot=["h0"], keys=["k"]))
    assert parsed is not None and parsed["model"].served(REQ)[0] == B and parsed["model"].keys == {"k"}
    v1 = digest_doc(ram=["h0"])
    del v1["models"]["model"]["blocks"]["slot"], v1["models"]["model"]["keys"]
    v1["version"] = 1
    parsed = parse_digest(v1)
    assert parsed is not None and parsed["model"].counts() == {"slot": 0, "ram": 1, "disk": 0}
    assert parse_digest(digest_doc(version=4)) is None
    assert parse_digest({"version": 2, "models": {"model": {"root": R1}}}) is None
    assert parse_digest(["not", "a", "digest"]) is None
    assert RequestBlocks.parse({"root": R1, "block_tokens": B, "n_tokens": 9, "blocks": []}) == RequestBlocks(
        R1, B, 9, ())
    assert RequestBlocks.parse({"root": "", "block_tokens": 0, "n_tokens": 9, "blocks": []}) is None


# ---- scoring --------------------------------------------------------------------------------


async def choose(pool: Pool, blocks: dict[str, RequestBlocks] | None = None, affinity: Affinity = NONE,
                 hashes: list[tuple[str, int]] | None = None, estimate: int = 2000) -> tuple[str, str, int, int]:
    lease = await pool.acquire("m", affinity, hashes or [], estimate, blocks={R1: REQ} if blocks is None else blocks)
    pool.release(lease, True)
    d = lease.decision
    return d.node, d.source, d.predicted_cached, d.prompt_tokens


async def test_more_cached_tokens_win_and_tiers_break_near_ties(tmp_path: Path) -> None:
    pool = await make_pool(tmp_path)
    give(pool, "n0", state(disk=REQ.blocks[:3]))
    give(pool, "n1", state(slot=REQ.blocks[:1]))
    give(pool, "n2", state())
    assert await choose(pool) == ("n0", "digest", 3 * B, REQ.n_tokens)  # 3 blocks from disk beat 1 in a slot
    give(pool, "n1", state(ram=REQ.blocks[:3]))
    assert (await choose(pool))[:3] == ("n1", "digest", 3 * B)  # the same blocks in RAM beat disk
    give(pool, "n2", state(slot=REQ.blocks[:3]))
    assert (await choose(pool))[0] == "n2"  # and a slot beats RAM


async def test_load_weighs_against_cache(tmp_path: Path) -> None:
    pool = await make_pool(tmp_path, n=2)
    give(pool, "n0", state(ram=REQ.blocks))  # serves 1024 of 1034 tokens
    give(pool, "n1", state())
    pool.nodes["n0"].in_flight = 3
    assert (await choose(pool))[0] == "n0"  # (1034 - 921.6) x 4 < 1034 x 1
    give(pool, "n0", state(disk=REQ.blocks[:1]))  # 256 tokens from disk
    pool.nodes["n0"].in_flight = 1
    assert (await choose(pool))[0] == "n1"  # (1034 - 153.6) x 2 > 1034 x 1


async def test_nodes_of_another_root_need_their_own_blocks(tmp_path: Path) -> None:
    pool = await make_pool(tmp_path, n=2)
    give(pool, "n0", state(ram=REQ.blocks[:1]))
    give(pool, "n1", state(R2, ram=("x0", "x1", "x2")))
    other = RequestBlocks(R2, B, REQ.n_tokens, ("x0", "x1", "x2", "x3"))
    assert (await choose(pool, {R1: REQ}))[:2] == ("n0", "digest")  # n1's root has no blocks: estimate, 0
    assert (await choose(pool, {R1: REQ, R2: other}))[:3] == ("n1", "digest", 3 * B)


async def test_no_digest_or_no_blocks_routes_by_the_estimate(tmp_path: Path) -> None:
    pool = await make_pool(tmp_path, n=2)
    hashes = prefix_hashes("m", conversation(BODY))
    pool.nodes["n1"].prefixes.add(hashes)  # what the gateway sent n1 before
    give(pool, "n0", state(ram=REQ.blocks))
    # with the blocks: n0's digest (exact) against n1's estimate
    assert (await choose(pool, hashes=hashes))[:2] == ("n0", "digest")
    # without them (the call failed, or a prompt under one block): the estimate everywhere
    node, source, predicted, prompt = await choose(pool, {}, hashes=hashes, estimate=hashes[-1][1])
    assert (node, source, predicted, prompt) == ("n1", "estimate", hashes[-1][1], hashes[-1][1])
    assert sample(pool.metrics.render().decode(), "hearth_gateway_route_sources_total", source="digest") == 1


async def test_a_conversation_key_finds_its_slot_through_the_digest(tmp_path: Path) -> None:
    pool = await make_pool(tmp_path)
    give(pool, "n2", state(keys=("conv-9",)))
    key = Affinity("cache_key", "conv-9")
    assert await pool.sticky(key, "m") == "n2" and await pool.sticky(Affinity("cache_key", "other"), "m") is None
    assert (await choose(pool, {}, affinity=key))[0] == "n2"
    await pool.remember(key, "n1")  # where this gateway sent it last wins over the digest
    assert await pool.sticky(key, "m") == "n1"


# ---- polling -------------------------------------------------------------------------------


async def test_a_failing_node_keeps_its_digest_stale_then_loses_it(tmp_path: Path) -> None:
    answers: dict[int, httpx.Response] = {}

    def handler(r: httpx.Request) -> httpx.Response:
        return answers.get(r.url.port or 0, httpx.Response(404))

    clock = Clock()
    pool = await make_pool(tmp_path, handler, n=2, clock=clock, digest_max_age=5.0)
    answers[9300] = httpx.Response(200, json=digest_doc(ram=["h0"]))
    await pool.digests.poll_all()
    d = pool.nodes["n0"].digest
    assert d is not None and not d.stale and pool.nodes["n1"].digest is None  # n1: 404, publishes nothing
    answers[9300] = httpx.Response(500, text="oops")
    clock.now += 3
    await pool.digests.poll_all()
    assert pool.nodes["n0"].digest is d and d.stale  # still used
    assert (await choose(pool))[:2] == ("n0", "digest")
    clock.now += 3  # 6 s since the last good one
    await pool.digests.poll_all()
    assert pool.nodes["n0"].digest is None
    assert (await choose(pool))[1] == "estimate"
    text = pool.metrics.render().decode()
    assert sample(text, "hearth_gateway_digest_failures_total", node="n0", call="digest") == 2
    answers[9300] = httpx.Response(200, json=digest_doc(version=99))  # a version this gateway cannot read
    await pool.digests.poll_all()
    assert pool.nodes["n0"].digest is None


# ---- the blocks call ------------------------------------------------------------------------


def blocks_fleet(calls: list[tuple[str, dict[str, Any]]], roots: dict[int, str], fail: bool = False) -> Handler:
    def handler(r: httpx.Request) -> httpx.Response:
        port = r.url.port or 0
        if r.url.path == "/v1/prompt-cache/digest":
            return httpx.Response(200, json=digest_doc(roots[port], ram=["h0"]))
        assert r.url.path == "/v1/prompt-cache/blocks"
        calls.append((f"n{port - 9300}", json.loads(r.content)))
        if fail:
            return httpx.Response(503, json={"error": {"message": "loading"}})
        return httpx.Response(200, json={"object": "prompt_cache.blocks", "model": "model", "root": roots[port],
                                         "block_tokens": B, "n_tokens": REQ.n_tokens, "blocks": list(REQ.blocks)})
    return handler


async def test_one_blocks_call_per_root_to_its_least_loaded_node(tmp_path: Path) -> None:
    calls: list[tuple[str, dict[str, Any]]] = []
    pool = await make_pool(tmp_path, blocks_fleet(calls, {9300: R1, 9301: R1, 9302: R2}))
    await pool.digests.poll_all()
    pool.nodes["n0"].in_flight = 2
    got = await pool.request_blocks("m", NONE, "/v1/messages", BODY)
    assert sorted(got) == sorted([R1, R2]) and got[R1] == REQ
    assert sorted(n for n, _ in calls) == ["n1", "n2"]
    assert calls[0][1] == {"path": "/v1/messages", "body": {**BODY, "model": "model"}}  # the node's model id


async def test_no_blocks_call_where_it_cannot_matter(tmp_path: Path) -> None:
    calls: list[tuple[str, dict[str, Any]]] = []
    pool = await make_pool(tmp_path, blocks_fleet(calls, {9300: R1, 9301: R1}), n=2)
    await pool.digests.poll_all()
    assert await pool.request_blocks("m", Affinity("session", "s"), "/v1/chat/completions", BODY) == {}
    key = Affinity("cache_key", "k")
    await pool.remember(key, "n1")
    assert await pool.request_blocks("m", key, "/v1/chat/completions", BODY) == {}  # its node is free
    assert calls == []
    pool.nodes["n1"].in_flight = 4  # saturated: the cost model decides, with the blocks
    assert R1 in await pool.request_blocks("m", key, "/v1/chat/completions", BODY)
    pool.nodes["n1"].in_flight = 0
    assert await pool.request_blocks("m", NONE, "/v1/chat/completions", BODY, exclude={"n0"}) == {}  # one left
    assert len(calls) == 1


@pytest.mark.parametrize("interval", [0.0, 1.0])
async def test_a_failed_blocks_call_or_digests_off_routes_by_the_estimate(tmp_path: Path, interval: float) -> None:
    calls: list[tuple[str, dict[str, Any]]] = []
    pool = await make_pool(tmp_path, blocks_fleet(calls, {9300: R1, 9301: R1}, fail=True), n=2,
                     digest_interval=interval)
    await pool.digests.start()
    try:
        assert await pool.request_blocks("m", NONE, "/v1/chat/completions", BODY) == {}
        assert len(calls) == (1 if interval else 0)
        assert (pool.nodes["n0"].digest is not None) == bool(interval)
    finally:
        await pool.digests.stop()


def test_a_run_is_extended_by_the_longest_held_tail_of_the_next_block() -> None:
    req = RequestBlocks(R1, B, 4 * B + 10, ("h0", "h1", "h2", "h3"), (("t0",), ("t1",), ("t2a", "t2b", "t2c"), (), ()))
    tails = {"slot": frozenset({"t2a"}), "ram": frozenset({"t2b"}), "disk": frozenset()}
    s = ModelState(R1, B, {"slot": frozenset({"h0", "h1"}), "ram": frozenset(), "disk": frozenset()}, tails=tails)
    assert s.served(req) == (2 * B + 32, 2 * B + 32 * 0.9)  # the longest held tail wins, at its tier
    nothing = ModelState(R1, B, {"slot": frozenset({"h0"}), "ram": frozenset(), "disk": frozenset()}, tails=tails)
    assert nothing.served(req) == (B, B)  # t1 not held: the run ends at its block


def test_tail_keys_predict_the_node_own_match_to_within_a_step(tmp_path: Path) -> None:
    """The node's prompt cache against the gateway's reading of its digest: for prompts that
    continue a cached one (the next turn of a conversation) or leave it inside a block, the
    predicted tokens are what `match` really serves, rounded down to the 16-token step."""
    from hearth.engine.fake_runner import FakeRunner
    from hearth.engine.prefix_cache import PrefixCache

    rng = random.Random(3)
    runner = FakeRunner()
    cache = PrefixCache(runner, runner.fingerprint, directory=tmp_path, ram_budget=1 << 22, disk_budget=1 << 22,
                        block_tokens=64, min_new=1)
    cached = [rng.randrange(1, 1000) for _ in range(150)]  # 2 full blocks and a 22-token partial one
    cache.offer(cached, lambda: b"FAKE" + np.asarray(cached, dtype="<i4").tobytes())
    assert cache.flush()
    d = cache.digest()
    doc = {"version": 3, "models": {"model": {"block_tokens": 64, "root": d["root"],
                                              "blocks": {"slot": [], "ram": d["ram"], "disk": d["disk"]},
                                              "tails": {"slot": [], "ram": d["tails_ram"], "disk": d["tails_disk"]}}}}
    held = parse_digest(doc)
    assert held is not None
    def real_and_predicted(prompt: list[int]) -> tuple[int, int]:
        m = cache.match(prompt)
        req = RequestBlocks(d["root"], 64, len(prompt), tuple(k.hex() for k in cache.chain(prompt)),
                            tuple(tuple(k.hex() for k in t) for t in cache.tails(prompt)))
        return (m.n_tokens if m is not None else 0), held["model"].served(req)[0]

    for prompt in ([*cached, *range(7, 200)], [*cached, 9], cached[:140] + [5] * 60, cached[:133] + [5] * 200):
        real, predicted = real_and_predicted(prompt)
        assert real - 16 < predicted <= real, (len(prompt), real, predicted)
    # what it does not see: a match ending inside a full block (another conversation leaving this
    # one mid-block) counts up to that block's start (full blocks publish no tails: 15× the digest)
    assert real_and_predicted(cached[:100] + [5] * 9) == (100, 64)
    cache.close()
