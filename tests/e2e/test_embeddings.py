"""Embeddings on a real server with the real all-MiniLM-L6-v2 (installed by scripts/setup.sh):
the openai SDK, LangChain's OpenAIEmbeddings, raw HTTP on Ollama's /api/embed and
/api/embeddings, the official `ollama` client and LangChain's OllamaEmbeddings; the vectors
against an independent reference (numpy BERT over the original safetensors, `tokenizers`
WordPiece: tests/helpers/bert_reference.py); the same vectors alone, batched and beside 16
concurrent requests; bad input answered 4xx in each protocol's shape.

"The same" is within 1e-3 per value (cosine > 0.99999) rather than bit for bit: llama.cpp's
attention and matrix kernels round differently by where a sequence sits in a shared call (seen
up to ~1e-4 on normalised vectors), and sharing calls is the point of batching.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from hearth import catalog
from tests.helpers import Server, start_server, stop_server
from tests.helpers.bert_reference import minilm

MODEL = catalog.MINILM.id
TEXTS = [
    "Hello world",
    "The café's naïve résumé, written in Ünïcödé!",
    "A man is playing a guitar on the street.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "unaffable tokenization 12345 ##not-a-piece [CLS] in the text",
    "中文 测试 and emoji 🤗",
    "Sentence embeddings map text to vectors so that similar meanings land close together. " * 4,
    "x",
]


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    if not catalog.installed_path(catalog.MINILM).is_file():
        pytest.fail(f"{MODEL} is not installed: scripts/setup.sh installs it (hearth models install {MODEL})")
    s = start_server(tmp_path_factory.mktemp("embed"), "--model", "default", "--parallel", "2")
    try:
        yield s
    finally:
        stop_server(s)


@pytest.fixture(scope="module")
def client(srv: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=srv.base_url, api_key="none") as c:
        yield c


def close(a: list[float] | np.ndarray, b: list[float] | np.ndarray) -> bool:
    return bool(np.abs(np.asarray(a) - np.asarray(b)).max() <= 1e-3)


def test_vectors_match_the_reference(client: openai.OpenAI) -> None:
    ref = minilm()
    got = client.embeddings.create(model=MODEL, input=TEXTS)  # the SDK asks for base64 and decodes it
    assert [d.index for d in got.data] == list(range(len(TEXTS)))
    assert got.usage.prompt_tokens == sum(len(ref.tokens(t)) for t in TEXTS)
    for text, d in zip(TEXTS, got.data, strict=True):
        v = np.asarray(d.embedding)
        assert v.shape == (384,) and abs(np.linalg.norm(v) - 1.0) < 1e-4
        cos = float(v @ ref.embed(text))
        assert cos >= 0.99, (text, cos)


def test_alone_batched_and_concurrent_are_the_same(client: openai.OpenAI) -> None:
    alone = [client.embeddings.create(model=MODEL, input=t).data[0].embedding for t in TEXTS]
    batched = [d.embedding for d in client.embeddings.create(model=MODEL, input=TEXTS).data]
    with ThreadPoolExecutor(16) as pool:
        concurrent = list(pool.map(lambda i: client.embeddings.create(model=MODEL, input=TEXTS[i % len(TEXTS)])
                                   .data[0].embedding, range(16)))
    for i, t in enumerate(TEXTS):
        assert close(alone[i], batched[i]), t
        assert close(alone[i], concurrent[i]) and close(alone[i], concurrent[i + len(TEXTS)]), t


def test_token_ids_and_float_encoding(srv: Server) -> None:
    ref = minilm()
    ids = ref.tokens(TEXTS[0])
    r = httpx.post(f"{srv.base_url}/embeddings", json={"model": MODEL, "input": [ids, ids[:3]],
                                                       "encoding_format": "float"}, timeout=60)
    assert r.status_code == 200, r.text
    a = r.json()["data"][0]["embedding"]
    b = httpx.post(f"{srv.base_url}/embeddings", json={"model": MODEL, "input": TEXTS[0]}, timeout=60
                   ).json()["data"][0]["embedding"]
    assert close(a, b) and float(np.asarray(a) @ ref.embed(TEXTS[0])) >= 0.99
    b64 = httpx.post(f"{srv.base_url}/embeddings", json={"model": MODEL, "input": TEXTS[0],
                                                         "encoding_format": "base64"}, timeout=60).json()
    assert close(np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), dtype="<f4"), a)


def test_langchain_openai_embeddings(srv: Server) -> None:
    from langchain_openai import OpenAIEmbeddings

    with httpx.Client() as http:
        emb = OpenAIEmbeddings(model=MODEL, base_url=srv.base_url, api_key="none",  # type: ignore[arg-type]
                               check_embedding_ctx_length=False, http_client=http)
        docs = emb.embed_documents(TEXTS[:3])
        query = emb.embed_query(TEXTS[0])
    ref = minilm()
    assert len(docs) == 3 and close(docs[0], query)
    for t, v in zip(TEXTS[:3], docs, strict=True):
        assert float(np.asarray(v) @ ref.embed(t)) >= 0.99


def test_ollama_endpoints(srv: Server) -> None:
    ref = minilm()
    r = httpx.post(f"{srv.url}/api/embed", json={"model": MODEL, "input": TEXTS[:2]}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == MODEL and len(body["embeddings"]) == 2
    assert body["prompt_eval_count"] == sum(len(ref.tokens(t)) for t in TEXTS[:2])
    assert body["total_duration"] > 0 and body["load_duration"] >= 0
    for t, v in zip(TEXTS[:2], body["embeddings"], strict=True):
        assert float(np.asarray(v) @ ref.embed(t)) >= 0.99
    old = httpx.post(f"{srv.url}/api/embeddings", json={"model": MODEL, "prompt": TEXTS[0]}, timeout=60).json()
    assert close(old["embedding"], body["embeddings"][0])
    long = "word " * 600  # past the 512-token context
    cut = httpx.post(f"{srv.url}/api/embed", json={"model": MODEL, "input": long}, timeout=60)
    assert cut.status_code == 200 and cut.json()["prompt_eval_count"] == 512
    refused = httpx.post(f"{srv.url}/api/embed", json={"model": MODEL, "input": long, "truncate": False}, timeout=60)
    assert refused.status_code == 400 and set(refused.json()) == {"error"}
    missing = httpx.post(f"{srv.url}/api/embed", json={"model": "no-such-model", "input": "x"}, timeout=60)
    assert missing.status_code == 404 and set(missing.json()) == {"error"}


def test_bad_input_is_a_4xx_in_openai_shape(client: openai.OpenAI, srv: Server) -> None:
    with pytest.raises(openai.BadRequestError) as too_long:
        client.embeddings.create(model=MODEL, input="word " * 600)
    assert too_long.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError, match="does not support dimensions"):
        client.embeddings.create(model=MODEL, input="x", dimensions=128)
    with pytest.raises(openai.BadRequestError, match="does not support embeddings"):
        client.embeddings.create(model="default", input="x")
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="no-such-model", input="x")
    chat = httpx.post(f"{srv.base_url}/chat/completions", timeout=60,
                      json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 400 and "embedding model" in chat.json()["error"]["message"]
    for body in ({"model": MODEL}, {"model": MODEL, "input": []}, {"model": MODEL, "input": [[1], "a"]},
                 {"model": MODEL, "input": [10**9]}):
        r = httpx.post(f"{srv.base_url}/embeddings", json=body, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["message"], body


def test_served_like_any_model(srv: Server) -> None:
    models = {m["id"]: m for m in httpx.get(f"{srv.base_url}/models", timeout=30).json()["data"]}
    card = models[MODEL]
    assert card["meta"]["embedding"] is True and card["status"]["value"] == "loaded"  # the tests above loaded it
    assert card["meta"]["pooling"] == "mean" and card["meta"]["n_embd"] == 384
    assert Path(card["meta"]["path"]).name == catalog.MINILM.file


def test_the_ollama_client_and_langchain_ollama_embeddings(srv: Server) -> None:
    import ollama
    from langchain_ollama import OllamaEmbeddings

    ref = minilm()
    client = ollama.Client(host=srv.url)
    lc = OllamaEmbeddings(model=MODEL, base_url=srv.url)
    try:
        got = client.embed(model=MODEL, input=TEXTS[:2])
        assert len(got.embeddings) == 2 and got.prompt_eval_count == sum(len(ref.tokens(t)) for t in TEXTS[:2])
        for t, v in zip(TEXTS[:2], got.embeddings, strict=True):
            assert float(np.asarray(v) @ ref.embed(t)) >= 0.99
        old = client.embeddings(model=MODEL, prompt=TEXTS[0])
        assert close(old.embedding, got.embeddings[0])
        with pytest.raises(ollama.ResponseError) as missing:
            client.embed(model="no-such-model", input="x")
        assert missing.value.status_code == 404
        assert close(lc.embed_query(TEXTS[0]), got.embeddings[0])
        assert close(lc.embed_documents(TEXTS[:2])[1], got.embeddings[1])
    finally:  # the clients' own httpx clients (as tests/clients/test_ollama_clients.py closes them)
        client._client.close()
        if lc._client is not None:
            lc._client._client.close()
