"""The prompt cache seen and managed over HTTP: /admin/prompt-cache (stats, entries, clear),
/v1/prompt-cache/digest, and its /metrics series, on the scripted LocalBackend with a disk tier.

The cache's writer is a background thread: a test waits (polling) until the blocks a request
left are in RAM and on disk, never sleeps a fixed time."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hearth.api.wire import prompt_cache as cache_wire
from hearth.backends.base import PrefixCacheStats
from hearth.hashing import sampled_digest
from tests.api.conftest import Harness, serve
from tests.fakes import scripted_backend
from tests.helpers import sample, until

BLOCK = 256
# Each character is one token on the fake runner: ~640 prompt tokens, so two full blocks and a
# partial one (with the answer's tokens) once the request ends.
LONG = [{"role": "user", "content": "Tell me about the hearth. " + "The fire keeps the house warm. " * 20}]
ADMIN = {"Authorization": "Bearer adm"}
USER = {"Authorization": "Bearer user-key"}


@contextlib.asynccontextmanager
async def cached(tmp_path: Path, start_prefetch: int = 4, **settings: Any) -> AsyncIterator[Harness]:
    """The app over a scripted backend whose prompt cache has a disk tier under tmp_path
    (`start_prefetch`: recent prompts read into RAM and slots at load; 0: none)."""
    weights = tmp_path / "fake.gguf"
    weights.write_bytes(b"fake weights")
    backend, runner = scripted_backend("Warm and bright.", path=weights)
    backend.settings.cache_dir = tmp_path / "prompt-cache"
    backend.settings.prompt_cache_prefetch = start_prefetch
    async with serve(tmp_path, backend=backend, runner=runner, **settings) as h:
        yield h


def cache_stats(h: Harness) -> PrefixCacheStats:
    cache = h.backend.prompt_cache
    assert cache is not None
    return cache.cache_stats()["fake"]


async def settled(h: Harness, blocks: int) -> PrefixCacheStats:
    """Wait until at least `blocks` blocks are in RAM and every one of them is on disk too."""
    def done() -> bool:
        t = cache_stats(h).tiers
        return t["ram"].blocks >= blocks and t["disk"].blocks == t["ram"].blocks
    await until(done, f"{blocks} prompt-cache blocks in RAM and on disk")
    return cache_stats(h)


async def chat(h: Harness, **headers: str) -> dict[str, Any]:
    r = await h.client.post("/v1/chat/completions", json={"messages": LONG, "max_tokens": 8, "temperature": 0},
                            headers=headers)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def chain(parent_hex: str, tokens: list[int]) -> str:
    """A block's hash as docs/api.md ("Prompt cache") says a router computes it."""
    data = bytes.fromhex(parent_hex) + np.asarray(tokens, dtype="<i4").tobytes()
    return hashlib.blake2b(data, digest_size=16, person=b"hearth-block").hexdigest()


async def test_stats_entries_digest_and_clear(tmp_path: Path) -> None:
    async with cached(tmp_path) as h:
        empty = cache_wire.PromptCacheStats.model_validate((await h.client.get("/admin/prompt-cache")).json())
        fake = empty.models["fake"]
        assert fake.block_tokens == BLOCK and set(fake.tiers) == {"slot", "ram", "disk"}
        assert fake.tiers["ram"].blocks == fake.tiers["disk"].blocks == 0
        assert fake.tiers["ram"].budget == 1024 << 20 and fake.tiers["disk"].budget == 8192 << 20

        await chat(h)
        await settled(h, 3)
        stats = cache_wire.PromptCacheStats.model_validate((await h.client.get("/admin/prompt-cache")).json())
        fake = stats.models["fake"]
        assert fake.tiers["ram"].blocks == fake.tiers["disk"].blocks >= 3 and fake.written_blocks >= 3
        assert fake.tiers["disk"].bytes > fake.tiers["ram"].bytes > 0  # files carry a header and the tokens
        assert fake.misses == 1  # the first request found nothing

        r = await h.client.get("/admin/prompt-cache/entries")
        listed = cache_wire.PromptCacheEntries.model_validate(r.json())
        assert listed.model == "fake" and listed.total == len(listed.data) >= 3 and not listed.has_more
        assert [e.start for e in listed.data[:3]] == [0, BLOCK, 2 * BLOCK]
        assert all(e.ram and e.disk and not e.kept for e in listed.data)
        assert [e.n_tokens for e in listed.data[:2]] == [BLOCK, BLOCK]

        digest = cache_wire.PromptCacheDigest.model_validate((await h.client.get("/v1/prompt-cache/digest")).json())
        assert digest.version == 3
        d = digest.models["fake"]
        assert d.block_tokens == BLOCK
        assert sorted(d.blocks.ram) == sorted(d.blocks.disk) == sorted(e.hash for e in listed.data)
        # the slot the request ran in still holds its full blocks (and no key: none was sent)
        assert d.blocks.slot == sorted(e.hash for e in listed.data if e.n_tokens == BLOCK) and d.keys.slot == []
        assert d.sessions.model_dump() == {"resident": [], "host": [], "disk": []}

        # The chain as documented: the root from the runner's fingerprint and the weights' sampled
        # digest, each block from its parent and its tokens (the prompt's, as /tokenize gives
        # them for the same messages).
        assert h.runner is not None
        identity = {**h.runner.fingerprint, "weights": sampled_digest(tmp_path / "fake.gguf")}
        root = hashlib.blake2b(json.dumps(identity, sort_keys=True).encode() + b"\0",
                               digest_size=16, person=b"hearth-root").hexdigest()
        assert d.root == root == listed.data[0].parent
        tokens = (await h.post("/tokenize", {"messages": LONG})).json()["tokens"]
        first = chain(root, tokens[:BLOCK])
        assert listed.data[0].hash == first and listed.data[1].parent == first
        assert listed.data[1].hash == chain(first, tokens[BLOCK:2 * BLOCK])

        r = await h.client.delete("/admin/prompt-cache", params={"model": "fake"})
        assert r.status_code == 200, r.text
        cleared = cache_wire.PromptCacheCleared.model_validate(r.json())
        assert cleared.model == "fake" and cleared.dropped == listed.total
        after = (await h.client.get("/admin/prompt-cache/entries")).json()
        assert after["data"] == [] and after["total"] == 0
        blocks = (await h.client.get("/v1/prompt-cache/digest")).json()["models"]["fake"]["blocks"]
        assert blocks == {"slot": d.blocks.slot, "ram": [], "disk": []}  # clearing the cache leaves the slots
        assert list((tmp_path / "prompt-cache" / "fake").glob("*.kvb")) == []
        # clearing an empty cache (every model's) drops nothing and is not an error
        again = (await h.client.delete("/admin/prompt-cache")).json()
        assert again == {"object": "prompt_cache.cleared", "model": None, "dropped": 0}


async def test_entries_limit_and_bad_queries(tmp_path: Path) -> None:
    async with cached(tmp_path) as h:
        await chat(h)
        n = (await settled(h, 3)).tiers["ram"].blocks
        page = (await h.client.get("/admin/prompt-cache/entries", params={"limit": 2, "model": "fake"})).json()
        assert len(page["data"]) == 2 and page["total"] == n and page["has_more"] is True
        for bad in ("0", "-1", "abc", "100001"):
            r = await h.client.get("/admin/prompt-cache/entries", params={"limit": bad})
            assert r.status_code == 400 and r.json()["error"]["param"] == "limit", r.text
        for call in (h.client.get("/admin/prompt-cache/entries", params={"model": "nope"}),
                     h.client.delete("/admin/prompt-cache", params={"model": "nope"})):
            r = await call
            assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
        assert cache_stats(h).tiers["ram"].blocks == n  # the refused clear dropped nothing


@pytest.mark.parametrize("method, path", [("GET", "/admin/prompt-cache"), ("GET", "/admin/prompt-cache/entries"),
                                          ("DELETE", "/admin/prompt-cache")])
async def test_admin_routes_need_the_admin_key(tmp_path: Path, method: str, path: str) -> None:
    async with cached(tmp_path, api_keys=["user-key"], admin_key="adm") as h:
        r = await h.client.request(method, path)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", r.text
        r = await h.client.request(method, path, headers=USER)
        assert r.status_code == 403 and r.json()["error"]["code"] == "insufficient_permissions", r.text
        r = await h.client.request(method, path, headers=ADMIN)
        assert r.status_code == 200, r.text


async def test_the_digest_needs_only_an_api_key(tmp_path: Path) -> None:
    """A gateway reaches its nodes with their API key (its admin key only for deletes)."""
    async with cached(tmp_path, api_keys=["user-key"], admin_key="adm") as h:
        assert (await h.client.get("/v1/prompt-cache/digest")).status_code == 401
        r = await h.client.get("/v1/prompt-cache/digest", headers=USER)
        assert r.status_code == 200 and r.json()["object"] == "prompt_cache.digest", r.text


@pytest.mark.parametrize("start_prefetch", [0, 4])
async def test_metrics_show_the_cache_by_tier_and_a_restart_serves_from_disk(tmp_path: Path,
                                                                              start_prefetch: int) -> None:
    async with cached(tmp_path, start_prefetch) as h:
        text = (await h.client.get("/metrics")).text
        for tier in ("slot", "ram", "disk"):
            assert sample(text, "hearth_prompt_cache_hits_total", model="fake", tier=tier) == 0
            assert sample(text, "hearth_prompt_cache_hit_tokens_total", model="fake", tier=tier) == 0
        for tier in ("ram", "disk"):
            assert sample(text, "hearth_prompt_cache_blocks", model="fake", tier=tier) == 0
            assert sample(text, "hearth_prompt_cache_evictions_total", model="fake", tier=tier) == 0
        assert sample(text, "hearth_prompt_cache_budget_bytes", model="fake", tier="ram") == 1024 << 20
        assert sample(text, "hearth_prompt_cache_budget_bytes", model="fake", tier="disk") == 8192 << 20
        assert sample(text, "hearth_prompt_cache_blocks", default=-1, tier="slot") == -1  # slots hold no blocks
        assert sample(text, "hearth_prompt_cache_disk_full", model="fake") == 0
        for name in ("misses", "written_blocks", "write_errors", "dropped_offers", "loaded_bytes", "load_seconds",
                     "rejected_files"):
            assert sample(text, f"hearth_prompt_cache_{name}_total", model="fake") == 0

        first = await chat(h)
        stats = await settled(h, 3)
        text = (await h.client.get("/metrics")).text
        assert sample(text, "hearth_prompt_cache_misses_total", model="fake") == 1
        assert sample(text, "hearth_prompt_cache_blocks", model="fake", tier="ram") == stats.tiers["ram"].blocks
        assert sample(text, "hearth_prompt_cache_bytes", model="fake", tier="disk") == stats.tiers["disk"].bytes > 0
        assert sample(text, "hearth_prompt_cache_written_blocks_total", model="fake") == stats.written_blocks >= 3

        await chat(h)  # the same prompt again: served from a slot or RAM, whichever placement finds
        text = (await h.client.get("/metrics")).text
        assert sample(text, "hearth_prompt_cache_hits_total", model="fake") == 1
        assert sample(text, "hearth_prompt_cache_hit_tokens_total", model="fake") == len(
            (await h.post("/tokenize", {"messages": LONG})).json()["tokens"]) - 1  # all but the last
        assert sample(text, "hearth_prompt_cache_hit_tokens_total", model="fake", tier="disk") == 0

    # A restart over the same directory: the blocks are found on disk, read back, and serve: at
    # the request (from the disk tier), or with the start prefetch at load, laid into a slot then.
    async with cached(tmp_path, start_prefetch) as h:
        assert cache_stats(h).tiers["disk"].blocks == stats.tiers["disk"].blocks
        again = await chat(h)
        assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
        text = (await h.client.get("/metrics")).text
        tier = "slot" if start_prefetch else "disk"
        assert sample(text, "hearth_prompt_cache_hits_total", model="fake", tier=tier) == 1
        assert sample(text, "hearth_prompt_cache_hit_tokens_total", model="fake", tier=tier) > 2 * BLOCK
        assert sample(text, "hearth_prompt_cache_loaded_bytes_total", model="fake") > 0
        assert sample(text, "hearth_prompt_cache_load_seconds_total", model="fake") > 0
        assert sample(text, "hearth_prompt_cache_misses_total", model="fake") == 0
