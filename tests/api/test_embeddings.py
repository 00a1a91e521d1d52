"""/v1/embeddings, /api/embed and /api/embeddings in process: a chat model (the scripted fake)
beside an embedding model over the deterministic FakeEmbedRunner, whose GGUF header (a real
header, no tensors) says it is an embedding model, as a converted sentence-transformers file does."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from hearth.api.context import node_of
from hearth.backends.base import ModelCard
from hearth.backends.local.backend import LocalBackend
from hearth.backends.local.model import EngineSettings
from hearth.chat.template import ChatTemplate
from hearth.engine.fake_embed import FakeEmbedRunner
from hearth.models import ModelSpec
from hearth.observability.ledger import UsageFilter
from tests.api.conftest import Harness, serve
from tests.fakes import SMOL, ScriptedRunner


def embedding_header(path: Path) -> Path:
    w = gguf.GGUFWriter(str(path), "bert")
    w.add_name("fake-embed")
    w.add_context_length(32)
    w.add_embedding_length(16)
    w.add_pooling_type(gguf.PoolingType.MEAN)
    w.add_causal_attention(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    chat_runner = ScriptedRunner(n_seq_max=2, n_batch=64)
    chat_runner.answer = b"hi"
    embedder = FakeEmbedRunner(n_embd=16, n_batch=64, n_seq_max=4, seq_ctx=32)
    weights = tmp_path / "fake.gguf"
    weights.write_bytes(b"fake weights")

    def factory(spec: ModelSpec, settings: EngineSettings) -> Any:
        return chat_runner, ModelCard(spec.id, 0, meta={"n_ctx": 2048, "parallel": 2}), ChatTemplate(SMOL)

    def embed_factory(spec: ModelSpec, settings: EngineSettings) -> Any:
        return embedder, ModelCard(spec.id, 0, meta={"embedding": True, "n_embd": 16})

    backend = LocalBackend([ModelSpec("fake", weights)], EngineSettings(parallel=2, batch=64), factory,
                           available=[ModelSpec("embedder", embedding_header(tmp_path / "embed.gguf"))],
                           embed_factory=embed_factory)
    async with serve(tmp_path, backend) as harness:
        harness.app.state.embedder = embedder
        yield harness


def expected(runner: FakeEmbedRunner, text: str) -> np.ndarray:
    v = np.mean([runner.token_vector(t) for t in runner.tokenize(text)], axis=0)
    return v / np.linalg.norm(v)


async def test_openai_shapes_and_usage(h: Harness) -> None:
    runner: FakeEmbedRunner = h.app.state.embedder
    r = await h.post("/v1/embeddings", {"model": "embedder", "input": ["one two", "three"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == "embedder"
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert np.allclose(body["data"][0]["embedding"], expected(runner, "one two"), atol=1e-6)
    assert body["usage"] == {"prompt_tokens": 4 + 3, "total_tokens": 7}
    one = (await h.post("/v1/embeddings", {"model": "embedder", "input": "three"})).json()
    assert one["data"][0]["embedding"] == body["data"][1]["embedding"]
    ids = (await h.post("/v1/embeddings", {"model": "embedder", "input": runner.tokenize("three")})).json()
    assert ids["data"][0]["embedding"] == one["data"][0]["embedding"]
    lists = (await h.post("/v1/embeddings", {"model": "embedder", "input": [[5, 6], [7]]})).json()
    assert len(lists["data"]) == 2 and lists["usage"]["prompt_tokens"] == 3
    b64 = (await h.post("/v1/embeddings", {"model": "embedder", "input": "three", "encoding_format": "base64"})).json()
    decoded = np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(decoded, one["data"][0]["embedding"])
    # the JSON numbers (orjson's shortest reprs) are the float32 values exactly
    assert r.headers["content-type"] == "application/json"
    assert np.array_equal(np.asarray(one["data"][0]["embedding"], dtype="<f4"), decoded)
    same = await h.post("/v1/embeddings", {"model": "embedder", "input": "three", "dimensions": 16})
    assert same.status_code == 200


async def test_concurrent_requests_share_calls_and_get_their_own_vectors(h: Harness) -> None:
    runner: FakeEmbedRunner = h.app.state.embedder
    texts = [f"text number {i}" for i in range(16)]
    answers = await asyncio.gather(*[h.post("/v1/embeddings", {"model": "embedder", "input": t}) for t in texts])
    for t, r in zip(texts, answers, strict=True):
        assert np.allclose(r.json()["data"][0]["embedding"], expected(runner, t), atol=1e-6)


@pytest.mark.parametrize(("body", "status", "code"), [
    ({"model": "embedder"}, 400, None),
    ({"model": "embedder", "input": []}, 400, None),
    ({"model": "embedder", "input": [1, "a"]}, 400, None),
    ({"model": "embedder", "input": [-1]}, 400, None),
    ({"model": "embedder", "input": "x", "encoding_format": "hex"}, 400, None),
    ({"model": "embedder", "input": "x", "dimensions": 8}, 400, None),
    ({"model": "embedder", "input": " ".join(["w"] * 40)}, 400, "context_length_exceeded"),
    ({"model": "fake", "input": "x"}, 400, "model_not_supported"),
    ({"model": "nope", "input": "x"}, 404, "model_not_found"),
])
async def test_openai_errors(h: Harness, body: dict[str, Any], status: int, code: str | None) -> None:
    r = await h.post("/v1/embeddings", body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and (code is None or err["code"] == code)


async def test_chat_requests_for_an_embedding_model_are_refused(h: Harness) -> None:
    r = await h.post("/v1/chat/completions", {"model": "embedder", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and "embedding model" in r.json()["error"]["message"]
    assert (await h.post("/v1/chat/completions",
                         {"model": "fake", "messages": [{"role": "user", "content": "hi"}]})).status_code == 200


async def test_ollama_embed(h: Harness) -> None:
    runner: FakeEmbedRunner = h.app.state.embedder
    r = await h.post("/api/embed", {"model": "embedder", "input": ["one two", "three"], "keep_alive": "5m"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "embedder" and len(body["embeddings"]) == 2
    assert np.allclose(body["embeddings"][0], expected(runner, "one two"), atol=1e-6)
    assert body["prompt_eval_count"] == 7
    assert body["total_duration"] >= body["load_duration"] >= 0
    long = " ".join(f"w{i}" for i in range(40))
    cut = await h.post("/api/embed", {"model": "embedder", "input": long})  # truncate defaults to true
    assert cut.status_code == 200 and cut.json()["prompt_eval_count"] == 32
    refused = await h.post("/api/embed", {"model": "embedder", "input": long, "truncate": False})
    assert refused.status_code == 400 and set(refused.json()) == {"error"}
    old = await h.post("/api/embeddings", {"model": "embedder", "prompt": "three"})
    assert np.allclose(old.json()["embedding"], expected(runner, "three"), atol=1e-6)


@pytest.mark.parametrize(("path", "body", "status"), [
    ("/api/embed", {"model": "nope", "input": "x"}, 404),
    ("/api/embed", {"model": "embedder"}, 400),
    ("/api/embed", {"model": "embedder", "input": [1, 2]}, 400),
    ("/api/embed", {"model": "fake", "input": "x"}, 400),
    ("/api/embed", {"input": "x"}, 400),
    ("/api/embeddings", {"model": "nope", "prompt": "x"}, 404),
    ("/api/embeddings", {"prompt": "x"}, 400),
])
async def test_ollama_errors(h: Harness, path: str, body: dict[str, Any], status: int) -> None:
    r = await h.post(path, body)
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error"} and r.json()["error"]


async def test_the_embedding_model_is_listed_and_counted(h: Harness) -> None:
    await h.post("/v1/embeddings", {"model": "embedder", "input": "x"})
    models = {m["id"]: m for m in (await h.client.get("/v1/models")).json()["data"]}
    assert models["embedder"]["meta"]["embedding"] is True
    metrics = (await h.client.get("/metrics")).text
    assert 'hearth_embedding_inputs_total{endpoint="embeddings"} 1.0' in metrics


async def test_the_usage_ledger_counts_input_tokens(h: Harness) -> None:
    body = (await h.post("/v1/embeddings", {"model": "embedder", "input": ["one two", "three"]})).json()
    ledger = node_of(h.app).ledger
    assert ledger is not None and ledger.flush()
    [row] = ledger.rows(UsageFilter())
    assert (row["endpoint"], row["model"], row["prompt_tokens"], row["generated_tokens"]) == \
        ("embeddings", "embedder", body["usage"]["prompt_tokens"], 0)
