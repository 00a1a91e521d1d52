"""POST /v1/prompt-cache/blocks on the scripted LocalBackend: each protocol's body is read and
tokenized as generation would, and its blocks are the hash chain docs/api.md describes over
the tokens /tokenize gives, the very keys the cache stores the prompt under; a bad body is the
protocol's own 4xx; the digest's slot tier and conversation keys."""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hearth.api.wire import prompt_cache as cache_wire
from hearth.gateway.fleet.cache_state import RequestBlocks, parse_digest
from tests.api.conftest import Harness, serve
from tests.fakes import scripted_backend

BLOCK = 256
SYSTEM = "You keep the hearth. " + "The fire keeps the house warm and the kettle sings. " * 12  # ~650 tokens
QUESTION = "What keeps the house warm?"
# One prompt in each protocol's words: the fake template renders them alike.
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": [{"role": "system", "content": SYSTEM},
                                          {"role": "user", "content": QUESTION}], "max_tokens": 4},
    "/v1/messages": {"model": "fake", "system": SYSTEM, "messages": [{"role": "user", "content": QUESTION}],
                     "max_tokens": 4},
    "/v1/responses": {"instructions": SYSTEM, "input": QUESTION, "max_output_tokens": 4},
}


def chain(parent_hex: str, tokens: list[int]) -> list[str]:
    """The full blocks' hashes of `tokens`, as docs/api.md says a router computes them."""
    out = []
    for i in range(0, len(tokens) - BLOCK + 1, BLOCK):
        data = bytes.fromhex(parent_hex) + np.asarray(tokens[i:i + BLOCK], dtype="<i4").tobytes()
        parent_hex = hashlib.blake2b(data, digest_size=16, person=b"hearth-block").hexdigest()
        out.append(parent_hex)
    return out


async def blocks_of(h: Harness, path: str, body: dict[str, Any]) -> cache_wire.PromptCacheBlocks:
    r = await h.post("/v1/prompt-cache/blocks", {"path": path, "body": body})
    assert r.status_code == 200, r.text
    return cache_wire.PromptCacheBlocks.model_validate(r.json())


async def digest(h: Harness) -> cache_wire.ModelDigest:
    answer = (await h.client.get("/v1/prompt-cache/digest")).json()
    return cache_wire.PromptCacheDigest.model_validate(answer).models["fake"]


def cached(tmp_path: Path, **settings: Any) -> Any:
    weights = tmp_path / "fake.gguf"
    weights.write_bytes(b"fake weights")
    backend, runner = scripted_backend("Warm and bright.", path=weights)
    return serve(tmp_path, backend=backend, runner=runner, **settings)


async def test_each_protocol_gives_the_chain_over_its_prompt_tokens(tmp_path: Path) -> None:
    async with cached(tmp_path) as h:
        tokens = (await h.post("/tokenize", BODIES["/v1/chat/completions"])).json()["tokens"]
        root = (await digest(h)).root
        want = chain(root, tokens)
        assert len(want) == len(tokens) // BLOCK >= 2
        for path, body in BODIES.items():
            got = await blocks_of(h, path, body)
            assert (got.model, got.root, got.block_tokens, got.n_tokens) == ("fake", root, BLOCK, len(tokens)), path
            assert got.blocks == want, path
        # count_tokens agrees on the Messages prompt's length
        r = await h.post("/v1/messages/count_tokens", {k: v for k, v in BODIES["/v1/messages"].items()
                                                       if k != "max_tokens"})
        assert r.json()["input_tokens"] == len(tokens)

        # a completion's prompt is tokenized as /v1/completions does (with its special tokens)
        prompt = SYSTEM * 2
        raw = (await h.post("/tokenize", {"content": prompt})).json()["tokens"]
        for p in (prompt, [prompt, "another"], raw):
            got = await blocks_of(h, "/v1/completions", {"prompt": p, "max_tokens": 2})
            assert got.n_tokens == len(raw) and got.blocks == chain(root, raw)


async def test_the_blocks_are_the_keys_the_cache_stores_the_prompt_under(tmp_path: Path) -> None:
    async with cached(tmp_path) as h:
        body = BODIES["/v1/chat/completions"]
        want = (await blocks_of(h, "/v1/chat/completions", body)).blocks
        assert not set(want) & set((await digest(h)).blocks.ram)
        r = await h.post("/v1/chat/completions", {**body, "prompt_cache_key": "conv-1"})
        assert r.status_code == 200, r.text

        deadline = time.monotonic() + 60
        while not set(want) <= set((d := await digest(h)).blocks.ram):  # the cache's writer thread
            assert time.monotonic() < deadline, "the prompt's blocks never reached the cache's RAM tier"
            await asyncio.sleep(0.01)
        # the slot the request ran in holds them too (its prompt and answer), with its conversation key
        assert set(want) <= set(d.blocks.slot) and d.keys.slot == ["conv-1"]
        # Responses and Messages clients of the same conversation find the same blocks
        assert (await blocks_of(h, "/v1/responses", BODIES["/v1/responses"])).blocks == want
        assert (await blocks_of(h, "/v1/messages", BODIES["/v1/messages"])).blocks == want

        # the next turn: a router reading this digest counts past the full blocks, into the
        # partial block the first turn ended in (its tail keys: slot and RAM)
        turn2 = {**body, "messages": [*body["messages"], {"role": "assistant", "content": "Warm and bright."},
                                      {"role": "user", "content": "And then?"}]}
        r = await h.post("/v1/prompt-cache/blocks", {"path": "/v1/chat/completions", "body": turn2})
        req = RequestBlocks.parse(r.json())
        held = parse_digest((await h.client.get("/v1/prompt-cache/digest")).json())
        assert req is not None and held is not None and len(req.tails) == len(req.blocks) + 1
        assert d.tails.slot and d.tails.ram
        assert held["fake"].served(req)[0] >= len(want) * BLOCK + 16, (len(want), held["fake"].served(req))


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes"},
     "tool_choice"),
    ("/v1/responses", {"input": "x", "background": True, "store": False}, "background"),
    ("/v1/responses", {"input": []}, "input"),
    ("/v1/completions", {"prompt": "x", "suffix": "y"}, "suffix"),
    ("/v1/completions", {"prompt": []}, "prompt"),
])
async def test_a_bad_body_is_generations_own_openai_4xx(h: Harness, path: str, body: dict[str, Any],
                                                         param: str) -> None:
    direct = await h.post(path, body)
    r = await h.post("/v1/prompt-cache/blocks", {"path": path, "body": body})
    assert r.status_code == direct.status_code == 400, r.text
    assert r.json() == direct.json() and r.json()["error"]["param"] == param


async def test_a_bad_messages_body_is_anthropics_4xx(h: Harness) -> None:
    body = {"model": "fake", "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "tool_use"}]}]}
    direct = await h.post("/v1/messages", body)
    r = await h.post("/v1/prompt-cache/blocks", {"path": "/v1/messages", "body": body})
    assert r.status_code == direct.status_code == 400, r.text
    assert r.json() == direct.json() and r.json()["type"] == "error"
    r = await h.post("/v1/prompt-cache/blocks", {"path": "/v1/messages", "body": {**body, "model": "nope",
                                                 "messages": [{"role": "user", "content": "x"}]}})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error", r.text


@pytest.mark.parametrize("outer", [{}, {"path": "/v1/embeddings", "body": {}}, {"path": "/v1/messages"},
                                   {"path": "/v1/messages", "body": "x"}])
async def test_a_bad_outer_body_is_a_400(h: Harness, outer: dict[str, Any]) -> None:
    r = await h.post("/v1/prompt-cache/blocks", outer)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text


async def test_blocks_need_only_an_api_key(tmp_path: Path) -> None:
    body = {"path": "/v1/chat/completions", "body": BODIES["/v1/chat/completions"]}
    async with cached(tmp_path, api_keys=["user-key"], admin_key="adm") as h:
        assert (await h.post("/v1/prompt-cache/blocks", body)).status_code == 401
        r = await h.post("/v1/prompt-cache/blocks", body, headers={"Authorization": "Bearer user-key"})
        assert r.status_code == 200 and r.json()["object"] == "prompt_cache.blocks", r.text
