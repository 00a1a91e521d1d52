"""The prompt cache per tenant, in-process (docs/api.md, "Prompt cache and tenants"): a prefix
one tenant sent is never reported cached for another (`cached_tokens` 0), unless both are in the
shared namespace (`cache=shared` keys); `cache_salt` splits a tenant's namespace further; a
digest and a prompt's block keys are the asker's namespace's only."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from hearth.tenants import ApiKey
from tests.api.conftest import Harness, serve
from tests.api.test_prompt_cache import SYSTEM, cached_blocks

KEYS = [ApiKey("ka", "alice", "team-a"), ApiKey("ka2", "alice-ci", "team-a"), ApiKey("kb", "bob", "team-b"),
        ApiKey("kw", "web", "web", cache="shared"), ApiKey("km", "mobile", "mobile", cache="shared")]
BODY = {"model": "fake", "temperature": 0, "max_tokens": 4,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"}]}


@pytest.fixture
async def t(tmp_path: Path) -> AsyncIterator[Harness]:
    async with serve(tmp_path, named_keys=KEYS, admin_key="adm") as harness:
        yield harness


async def cached(t: Harness, key: str, **extra: Any) -> int:
    r = await t.post("/v1/chat/completions", {**BODY, **extra}, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


async def test_a_tenants_prefix_is_never_cached_for_another(t: Harness) -> None:
    assert await cached(t, "ka") == 0
    await cached_blocks(t)
    assert await cached(t, "kb") == 0  # not from alice's slot, nor from the prompt cache
    assert await cached(t, "kb") > len(SYSTEM)  # bob's own, now
    assert await cached(t, "ka2") > len(SYSTEM)  # alice's other key: the same tenant
    assert await cached(t, "kw") == 0  # the shared namespace holds nothing of theirs


async def test_the_shared_namespace_is_shared_by_its_keys_and_the_admin(t: Harness) -> None:
    assert await cached(t, "kw") == 0
    await cached_blocks(t)
    assert await cached(t, "km") > len(SYSTEM)
    assert await cached(t, "adm") > len(SYSTEM)
    assert await cached(t, "ka") == 0


async def test_a_cache_salt_splits_a_namespace(t: Harness) -> None:
    assert await cached(t, "ka", cache_salt="s1") == 0
    await cached_blocks(t)
    assert await cached(t, "ka") == 0  # unsalted: another namespace
    assert await cached(t, "ka", cache_salt="s2") == 0
    assert await cached(t, "ka2", cache_salt="s1") > len(SYSTEM)
    assert await cached(t, "kb", cache_salt="s1") == 0  # a salt never crosses tenants
    r = await t.post("/v1/chat/completions", {**BODY, "cache_salt": ""}, headers={"Authorization": "Bearer ka"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt", r.text


async def test_the_salt_reaches_every_protocol(t: Harness) -> None:
    alice = {"Authorization": "Bearer ka"}
    r = await t.post("/v1/responses", {"model": "fake", "instructions": SYSTEM, "input": "Hi", "max_output_tokens": 4,
                                       "cache_salt": "r"}, headers=alice)
    assert r.status_code == 200, r.text
    await cached_blocks(t)
    again = await t.post("/v1/responses", {"model": "fake", "instructions": SYSTEM, "input": "Hi",
                                           "max_output_tokens": 4, "cache_salt": "r"}, headers=alice)
    assert again.json()["usage"]["input_tokens_details"]["cached_tokens"] > len(SYSTEM)
    other = await t.post("/v1/messages", {"model": "fake", "system": SYSTEM, "max_tokens": 4, "cache_salt": "m",
                                          "messages": [{"role": "user", "content": "Hi"}]}, headers=alice)
    assert other.status_code == 200 and other.json()["usage"]["cache_read_input_tokens"] == 0, other.text
    prompt = "x" * 600
    for expected_zero in (True, False):
        r = await t.post("/v1/completions", {"model": "fake", "prompt": prompt, "max_tokens": 2, "cache_salt": "c"},
                         headers=alice)
        assert r.status_code == 200, r.text
        n = r.json()["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
        assert (n == 0) is expected_zero, r.json()["usage"]
        await cached_blocks(t)


async def test_digests_and_block_keys_are_the_askers_namespaces(t: Harness) -> None:
    assert await cached(t, "ka") == 0
    await cached_blocks(t)
    r = await t.post("/v1/chat/completions", {**BODY, "session_id": "alice-s"}, headers={"Authorization": "Bearer ka"})
    assert r.status_code == 200

    async def digest(key: str) -> dict[str, Any]:
        r = await t.client.get("/v1/prompt-cache/digest", headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200, r.text
        return dict(r.json()["models"]["fake"])

    async def block_keys(key: str) -> dict[str, Any]:
        r = await t.post("/v1/prompt-cache/blocks", {"path": "/v1/chat/completions", "body": BODY},
                         headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200, r.text
        return dict(r.json())

    alice, alice2, bob = await digest("ka"), await digest("ka2"), await digest("kb")
    assert alice == alice2 and alice["root"] != bob["root"]
    assert alice["blocks"]["ram"] and bob["blocks"]["ram"] == [] and bob["blocks"]["slot"] == []
    assert "alice-s" in {s for ids in alice["sessions"].values() for s in ids}
    assert not any(bob["sessions"].values())
    mine, theirs = await block_keys("ka"), await block_keys("kb")
    assert mine["root"] == alice["root"] and theirs["root"] == bob["root"]
    assert set(mine["blocks"]) <= set(alice["blocks"]["ram"]) and not set(theirs["blocks"]) & set(mine["blocks"])
